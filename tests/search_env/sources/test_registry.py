"""The retriever registry: a user's retriever is one call, the built-in ones are there, an unknown name is
one line with the known names, and a clash needs ``replace=True``."""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from search_env.sources import SOURCES, BM25Source, SourceOptions, available_sources, build_source, lookup_source
from search_env.sources.registry import register_source
from search_env import UnknownNameError

MODULE = "tests.search_env.sources.user_retriever"
CORPUS = [{"id": "p1", "title": "Zarbo", "text": "Zarbo is a company founded by Bob Smith."},
          {"id": "p2", "title": "Vessa", "text": "Vessa is the capital city of Norland."}]


@pytest.fixture
def user_retriever():
    module = importlib.import_module(MODULE)
    yield module
    module.forget()


def test_the_built_in_retrievers_are_registered() -> None:
    assert {"bm25", "dense"} <= set(available_sources())
    source = build_source("bm25", CORPUS, SourceOptions(name="wiki"))
    assert isinstance(source, BM25Source) and source.name == "wiki"
    assert [p.id for p in source.search(["capital of Norland"], 1)[0]] == ["p2"]


def test_a_registered_retriever_is_built_by_name_with_the_options(user_retriever, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in CORPUS), encoding="utf-8")
    options = SourceOptions(name="wiki", index_dir=tmp_path / "index")
    source = build_source(user_retriever.NAME, str(corpus), options)
    assert isinstance(source, user_retriever.WordOverlapSource) and source.name == "wiki"
    assert user_retriever.BUILT == [(str(corpus), options)]
    assert [p.id for p in source.search(["who founded Zarbo"], 1)[0]] == ["p1"]
    assert user_retriever.NAME in available_sources()


def test_an_unknown_retriever_is_one_line_naming_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as info:
        lookup_source("bm52")
    assert str(info.value) == f"unknown retriever 'bm52'; known: {', '.join(available_sources())}; did you mean 'bm25'?"
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_a_taken_name_needs_replace_true(user_retriever) -> None:
    register_source(user_retriever.NAME, user_retriever.word_overlap)  # the same factory again: harmless

    def other(corpus, options):
        raise AssertionError("not built")

    with pytest.raises(ValueError, match=r"^retriever 'word-overlap' is already registered \(.*word_overlap\); "
                                         r"pass replace=True to replace it$"):
        register_source(user_retriever.NAME, other)
    assert register_source(user_retriever.NAME, other, replace=True) is other and SOURCES[user_retriever.NAME] is other
    with pytest.raises(TypeError, match="must be callable"):
        register_source("not-callable", "bm25")  # type: ignore[arg-type]
