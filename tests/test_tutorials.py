"""Every tutorial page's code runs as written: a page's runnable Python blocks, concatenated in page order,
run in a fresh interpreter in an empty folder, so a tutorial that drifts from the code fails its page.

The rule (written in ``docs/tutorials/index.md`` too): a ```` ```python ```` or ```` ```{code-block} python ````
fence runs, unless the block's options say ``:class: not-run`` (a GPU command, a run of minutes); one whose
class is ``needs-MODULE`` runs where MODULE is installed; shell fences (```` ```console ````, ```` ```bash ````)
are shown, not run.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import skip_without

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "docs" / "tutorials"

skip_without("agents", "torch", "transformers", "jsonargparse")

_FENCE = re.compile(r"^(`{3,})(\{code-block\}\s+python|python)[ \t]*\n(.*?)^\1[ \t]*$", re.M | re.S)
_OPTION = re.compile(r"^:([\w-]+):[ \t]*(.*)$")

#: Pages whose run takes more than 20 s (a smoke training run each), marked slow.
SLOW_PAGES = {"train-the-demo", "benchmark-an-algorithm"}
PAGE_TIMEOUT_S = 240


def runnable_code(markdown: str) -> str:
    """The page's runnable Python: every python fence's body, without its MyST options, in page order;
    a block whose class is ``not-run``, or ``needs-MODULE`` where MODULE is not installed, is left out."""
    blocks = []
    for match in _FENCE.finditer(markdown):
        lines = match.group(3).splitlines()
        options = {}
        while lines and (option := _OPTION.match(lines[0])):
            options[option.group(1)] = option.group(2).strip()
            lines.pop(0)
        classes = options.get("class", "").split()
        needs = [c.removeprefix("needs-") for c in classes if c.startswith("needs-")]
        if "not-run" not in classes and all(importlib.util.find_spec(module) is not None for module in needs):
            blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _pages() -> list:
    return [pytest.param(page, id=page.stem, marks=[pytest.mark.slow] if page.stem in SLOW_PAGES else [])
            for page in sorted(TUTORIALS.glob("*.md")) if page.stem != "index"]


def test_the_block_rule_keeps_runnable_blocks_and_drops_not_run_ones():
    page = ("```python\nx = 1\n```\n\n```{code-block} python\n:class: not-run\nraise SystemExit(1)\n```\n\n"
            "```console\n$ false\n```\n\n```{code-block} python\n:caption: two\ny = x + 1\n```\n\n"
            "```{code-block} python\n:class: needs-no_such_module_here\nraise SystemExit(1)\n```\n")
    assert runnable_code(page) == "x = 1\n\ny = x + 1\n"


def test_every_tutorial_has_runnable_code():
    pages = _pages()
    assert len(pages) >= 7
    assert [p.values[0].name for p in pages if not runnable_code(p.values[0].read_text(encoding="utf-8")).strip()] == []


@pytest.mark.timeout(PAGE_TIMEOUT_S)
@pytest.mark.parametrize("page", _pages())
def test_the_tutorial_runs(page: Path, tmp_path: Path):
    script = tmp_path / f"{page.stem}.py"
    script.write_text(runnable_code(page.read_text(encoding="utf-8")), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=PAGE_TIMEOUT_S - 10)
    assert done.returncode == 0, f"{page.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
