"""The repository keeps the conventions ruff.toml sets: line length, function complexity (mccabe), pyflakes'
unused and undefined names, and pycodestyle's import, statement and syntax errors. Checked by running
ruff (the "test" extra) over the whole repository, as a contributor would, so CI and a terminal agree."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT, skip_without

skip_without("test", "ruff")


def _ruff_check(folder: Path) -> subprocess.CompletedProcess:
    """``ruff check`` of ``folder`` with the settings it holds (its ruff.toml)."""
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=folder, capture_output=True, text=True, timeout=120)


def test_the_repository_passes_ruff_with_the_projects_settings() -> None:
    done = _ruff_check(REPO_ROOT)
    assert done.returncode == 0, f"ruff check (settings: ruff.toml):\n{done.stdout}{done.stderr}"


def test_the_projects_settings_report_each_kind_of_violation(tmp_path: Path) -> None:
    """The check above can fail: under ruff.toml, an unused import, a line past the limit and a function
    past the complexity limit are each reported."""
    shutil.copy(REPO_ROOT / "ruff.toml", tmp_path / "ruff.toml")
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(20))
    (tmp_path / "bad.py").write_text(f"import os\n\nLONG = {'1' * 160!r}\n\n\ndef branchy(x):\n{branches}    return -1\n",
                                     encoding="utf-8")
    done = _ruff_check(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    for code in ("F401", "E501", "C901"):
        assert f" {code} " in done.stdout, done.stdout
