"""The names users look for are where they look: the package root, search_env.data and search_env.wrappers;
every exported name exists, ``from <package> import *`` works, and the examples in the packages'
docstrings run as written."""
from __future__ import annotations

import ast
import importlib
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

import search_env
from search_env.data.example import QAExample
from search_env.data.loaders import load_dataset
from search_env.wrappers.fixed_window import FixedWindowObservation
from search_env.wrappers.full_context import FullContextObservation
from tests.conftest import REPO_ROOT, skip_without

# Packages whose exports need the agents extra (torch, transformers) to resolve.
_NEEDS_TORCH = {"agents", "agents.learners", "agents.baselines"}

# A literal block of a docstring ("...::", a blank line, indented lines) that imports something: an
# example to run, not a grammar or a file layout.
_EXAMPLE = re.compile(r"::\n\n((?:    .*\n|[ \t]*\n)+)")


def _needs(module: str) -> None:
    if module in _NEEDS_TORCH:
        skip_without("agents", "torch", "transformers")


def test_the_root_exports_datasets_and_wrappers() -> None:
    assert search_env.QAExample is QAExample and search_env.load_dataset is load_dataset
    assert search_env.FixedWindowObservation is FixedWindowObservation
    assert search_env.FullContextObservation is FullContextObservation
    assert search_env.data.load_dataset is load_dataset and search_env.wrappers.FixedWindowObservation is FixedWindowObservation


@pytest.mark.parametrize("module", ["search_env", "search_env.data", "search_env.wrappers", "search_env.sources",
                                    "search_env.dag", "rewards", "agents", "agents.learners", "agents.baselines"])
def test_every_exported_name_exists(module: str) -> None:
    _needs(module)
    imported = importlib.import_module(module)
    missing = [name for name in imported.__all__ if not hasattr(imported, name)]
    assert missing == []


@pytest.mark.parametrize("module", ["search_env", "rewards", "agents"])
def test_star_import_gives_every_exported_name(module: str) -> None:
    _needs(module)
    namespace: dict[str, Any] = {}
    exec(f"from {module} import *", namespace)  # noqa: S102 - a fixed import line
    assert set(importlib.import_module(module).__all__) <= set(namespace)


def test_the_root_exports_every_source() -> None:
    from search_env import BM25Source, CachedSource, HybridSource, RemoteSource, TimeLimitedSource
    from search_env.sources.bm25 import BM25Source as bm25
    from search_env.sources.remote import RemoteSource as remote

    assert BM25Source is bm25 and RemoteSource is remote
    assert all(issubclass(cls, search_env.Source) for cls in (BM25Source, CachedSource, HybridSource, TimeLimitedSource))
    with pytest.raises(AttributeError, match="no attribute 'NoSuchSource'"):
        search_env.NoSuchSource


def _docstring_examples(docstring: str | None) -> list[str]:
    blocks = [textwrap.dedent(block) for block in _EXAMPLE.findall((docstring or "") + "\n")]
    return [block for block in blocks if re.search(r"^(?:from|import) ", block, re.M)]


def _packages_with_examples() -> set[str]:
    """Every package of ours whose docstring holds an example, found in the source (nothing imported)."""
    found = set()
    for package in ("agents", "search_env", "rewards", "benchmarks"):
        for init in sorted((REPO_ROOT / package).rglob("__init__.py")):
            if _docstring_examples(ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))):
                found.add(".".join(init.relative_to(REPO_ROOT).parent.parts))
    return found


#: The packages whose docstring examples the test below runs (and how it keeps each one small).
_RUN = ("agents", "agents.learners", "agents.baselines", "search_env.dag")


def test_every_package_example_is_run_below() -> None:
    assert _packages_with_examples() == set(_RUN)


def _shrink_training(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """``agents.build_trainer`` builds the example's config with the tiny run's sizes: the example's own
    groups and fields are still built and checked, so a wrong field fails."""
    import agents
    from agents.training.build import build_trainer
    from tests.agents.training.tiny import TINY

    def tiny(config: Any, **options: Any) -> Any:
        return build_trainer(config.updated({**TINY, "warm_start.steps": 1, "warm_start.examples": 2, "warm_start.batch_size": 2,
                                             "eval.every": 1, "run.output_dir": str(folder / "run")}), **options)

    monkeypatch.setattr(agents, "build_trainer", tiny, raising=False)


def _tiny_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """``load_policy`` loads the built-in tiny model whatever the example names (no download, seconds)."""
    import agents.policies.loading as loading

    real = loading.load_policy
    monkeypatch.setattr(loading, "load_policy", lambda model, **options: real("tiny", **options))


@pytest.mark.parametrize("package", _RUN)
def test_package_docstring_examples_run(package: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _needs(package)
    monkeypatch.chdir(tmp_path)
    if package == "agents":
        _shrink_training(monkeypatch, tmp_path)
    if package == "agents.baselines":
        _tiny_model(monkeypatch)
    examples = _docstring_examples(importlib.import_module(package).__doc__)
    assert examples
    for index, code in enumerate(examples):
        namespace: dict[str, Any] = {"__name__": "__docstring__"}
        exec(compile(code, f"{package} docstring example {index + 1}", "exec"), namespace)  # noqa: S102 - our own docs
        if package == "agents":
            assert namespace["result"].step == namespace["result"].steps == 2
            assert namespace["config"].run.steps == 50 and namespace["config"].warm_start.steps == 200
        if package == "agents.learners":
            assert namespace["algorithm"].config.clip_high == 0.28
        if package == "agents.baselines":
            assert len(namespace["rollout"].trajectories) == 8
        if package == "search_env.dag":
            assert namespace["observation"].startswith("A (General): US tariffs 2024\n(Tariffs) US tariffs")
