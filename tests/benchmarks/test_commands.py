"""The shape of ``benchmarks/``: every module at its top is a command and ``python -m benchmarks`` lists each
one with its docstring's first line; the helpers in ``benchmarks/common`` are not commands."""
from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import benchmarks
import benchmarks.common
from benchmarks.__main__ import COMMANDS, description, main
from tests.conftest import skip_without

AGENTS_EXTRA = ("agents", "torch", "transformers", "yaml")
NEEDS = {  # the extra, and its packages, that a command's module imports; the others need the core only
    "learning": AGENTS_EXTRA, "algorithms": AGENTS_EXTRA, "rollout_overhead": AGENTS_EXTRA, "grpo_step_vs_trl": AGENTS_EXTRA,
    "memory_soak": AGENTS_EXTRA, "retrieval_throughput": ("server", "requests"),
}


def _modules(package: object) -> dict[str, bool]:
    """The modules of ``package`` (not its sub-packages, nor ``__main__``): name -> whether it runs as a command."""
    found = {}
    for module in pkgutil.iter_modules(package.__path__):  # type: ignore[attr-defined]
        if module.ispkg or module.name == "__main__":
            continue
        source = Path(package.__path__[0], f"{module.name}.py").read_text(encoding="utf-8")  # type: ignore[attr-defined]
        found[module.name] = 'if __name__ == "__main__":' in source
    return found


def test_every_module_at_the_top_is_a_listed_command_and_every_helper_is_in_common() -> None:
    top = _modules(benchmarks)
    assert sorted(COMMANDS) == sorted(top) and len(set(COMMANDS)) == len(COMMANDS)
    assert all(top.values()), [name for name, runs in top.items() if not runs]
    helpers = _modules(benchmarks.common)
    assert "warm_start_cache" in helpers and not any(helpers.values()), [name for name, runs in helpers.items() if runs]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_listed_command_imports_and_its_summary_is_one_line(name: str) -> None:
    if name in NEEDS:
        skip_without(*NEEDS[name])
    module = importlib.import_module(f"benchmarks.{name}")
    assert callable(module.main)
    summary = module.__doc__.split("\n\n")[0]
    assert summary == description(name) and "\n" not in summary  # the index shows the whole summary, not half a sentence


def test_the_index_prints_every_command_with_its_description(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  python -m ")]
    assert [words[2] for words in lines] == [f"benchmarks.{name}" for name in COMMANDS]
    assert [" ".join(words[3:]) for words in lines] == [" ".join(description(name).split()) for name in COMMANDS]


def test_a_module_without_a_docstring_cannot_be_described(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="no module benchmarks.nosuch"):
        description("nosuch")
    package = tmp_path / "benchmarks"
    package.mkdir()
    (package / "bare.py").write_text("x = 1\n")
    monkeypatch.setattr(benchmarks, "__path__", [str(package)])
    with pytest.raises(ValueError, match="no docstring"):
        description("bare")
