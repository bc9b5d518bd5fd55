"""A retriever registered in a user's module is ``data.retriever`` of a run: in a recipe's config and on
the command line after ``--import``; an unknown name is one line with the known ones."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from agents.train import parse_config  # noqa: E402
from agents.training.config import TrainConfig  # noqa: E402
from agents.training.data import split_data  # noqa: E402
from search_env.sources import available_sources  # noqa: E402
from tests.conftest import write_real_files  # noqa: E402

MODULE = "tests.search_env.sources.user_retriever"
NAME = "word-overlap"


@pytest.fixture
def real_data(tmp_path: Path) -> tuple[Path, Path]:
    return write_real_files(tmp_path, [
        {"id": f"q{i}", "question": "Which company did Bob Smith found?", "golden_answers": ["Zarbo"]} for i in range(3)])


@pytest.fixture
def forget_user_retriever():
    """Leave the registry and the module cache as they were (the next ``--import`` registers it again)."""
    if MODULE in sys.modules:
        sys.modules[MODULE].forget()
    yield
    if MODULE in sys.modules:
        sys.modules[MODULE].forget()


def test_an_imported_retriever_is_the_runs_corpus_source(real_data, tmp_path, forget_user_retriever) -> None:
    questions, corpus = real_data
    argv = ["--algo", "grpo", "--data.dataset", str(questions), "--data.corpus", str(corpus), "--data.retriever", NAME,
            "--eval.questions", "1", "--run.output_dir", str(tmp_path / "run")]
    with pytest.raises(ValueError, match=f"^unknown data.retriever '{NAME}'; known: bm25, dense"):
        parse_config(argv)  # not imported: not known
    config = parse_config(["--import", MODULE, *argv])
    assert config.data.retriever == NAME
    (train, train_sources), (held_out, held_out_sources) = split_data(config)
    module = importlib.import_module(MODULE)
    source = train_sources["wiki"]
    assert isinstance(source, module.WordOverlapSource) and held_out_sources["wiki"] is source
    [(built_corpus, options)] = module.BUILT
    assert built_corpus == str(corpus) and options.name == "wiki" and options.index_dir == tmp_path / "run" / f"{NAME}-index"
    assert [p.id for p in source.search(["capital city of Norland"], 1)[0]] == ["p2"]
    assert (len(train), len(held_out)) == (2, 1)


def test_a_config_names_a_registered_retriever_and_refuses_an_unknown_one(forget_user_retriever) -> None:
    importlib.import_module(MODULE)
    assert TrainConfig("grpo").updated({"data.retriever": NAME}).data.retriever == NAME
    with pytest.raises(ValueError) as info:
        TrainConfig("grpo").updated({"data.retriever": "bm52"})
    assert str(info.value) == f"unknown data.retriever 'bm52'; known: {', '.join(available_sources())}; did you mean 'bm25'?"
