"""The README's code examples run as written."""
from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.rst"


def _python_blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", text)
    return [re.sub(r"^    ", "", b, flags=re.M) for b in blocks]


def test_readme_has_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert "python -m benchmarks.evaluate" in text and "python -m pytest tests" in text
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    test_command = next(line.strip() for line in text.splitlines() if "python -m pytest tests" in line)
    assert test_command in ci, ".ci/run must call the README's test command"


def test_readme_python_examples_run():
    blocks = _python_blocks()
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 - our own README
