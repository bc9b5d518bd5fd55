"""The README's code examples run as written, each on its own (as a reader pastes one), and print
what the README says they print."""
from __future__ import annotations

import contextlib
import doctest
import io
import re

import pytest

from tests.conftest import REPO_ROOT, skip_without

README = REPO_ROOT / "README.rst"
_BLOCK = re.compile(r"^\.\. code-block:: (\w+)\n\n((?:    .*\n|\n)+)", re.M)
# An example importing from a module of the agents package other than the scripted agents (which the
# package itself imports) uses the LLM side: the policies, sampler, rollouts, learners, trainer.
_AGENTS_EXTRA = re.compile(r"^(?:from|import) agents\.(?!scripted\b)", re.M)


def _blocks() -> list[tuple[str, str, int]]:
    """(language, dedented body, start offset) of every code block, in order."""
    text = README.read_text(encoding="utf-8")
    return [(m.group(1), re.sub(r"^    ", "", m.group(2), flags=re.M), m.start()) for m in _BLOCK.finditer(text)]


def _examples() -> list[tuple[str, str | None]]:
    """Each python block and the text block after it (its printed output), if one follows with
    nothing but one line of prose in between."""
    text = README.read_text(encoding="utf-8")
    blocks = _blocks()
    pairs = []
    for i, (language, body, start) in enumerate(blocks):
        if language != "python":
            continue
        following = blocks[i + 1] if i + 1 < len(blocks) else None
        end = start + len(_BLOCK.match(text, start).group(0))  # type: ignore[union-attr]
        between = text[end : following[2]].strip() if following else ""
        close = following is not None and following[0] == "text" and "\n" not in between
        pairs.append((body, following[1] if close else None))
    return pairs


def test_readme_has_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert "python -m benchmarks.evaluate" in text and "python -m pytest tests" in text
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    test_command = next(line.strip() for line in text.splitlines() if "python -m pytest tests" in line)
    assert test_command in ci, ".ci/run must call the README's test command"


def test_every_python_example_shows_what_it_prints():
    examples = _examples()
    assert len(examples) >= 2
    assert all(output is not None for _, output in examples), "a python block without its output block after it"


@pytest.mark.parametrize("index", range(len(_examples())))
def test_readme_example_runs_alone_and_prints_what_the_readme_says(index: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import search_env.protocols as protocols

    monkeypatch.setattr(protocols, "_REGISTRY", protocols._REGISTRY.copy())  # forget what the example registers
    code, expected = _examples()[index]
    if _AGENTS_EXTRA.search(code):
        skip_without("agents", "torch", "transformers")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"{README}: example {index + 1}", "exec"), {"__name__": "__readme__"})  # noqa: S102 - our own README
    assert expected is not None
    checker = doctest.OutputChecker()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    assert checker.check_output(expected, printed.getvalue(), flags), (
        f"README example {index + 1} printed:\n{printed.getvalue()}\nbut the README shows:\n{expected}"
    )
