"""Importing the environment does not start JAX through bm25s (which warms JAX up on the default
device, taking most of a GPU's memory, when JAX is installed)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def fake_jax(tmp_path: Path) -> Path:
    """A stand-in ``jax`` package that records its import in ``jax_imported`` beside it."""
    package = tmp_path / "jax"
    package.mkdir()
    (package / "__init__.py").write_text(
        f"open({str(tmp_path / 'jax_imported')!r}, 'w').close()\n", encoding="utf-8")
    (package / "lax.py").write_text("def top_k(values, k):\n    return values[:k], list(range(k))\n", encoding="utf-8")
    return tmp_path


def _run(code: str, path: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(REPO)])}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_importing_the_environment_leaves_an_installed_jax_unimported(fake_jax: Path) -> None:
    out = _run("import sys, search_env, bm25s.selection as s; from search_env import BM25Source\n"
               "print('jax' in sys.modules, s.JAX_IS_AVAILABLE)", fake_jax)
    assert out == "False False"
    assert not (fake_jax / "jax_imported").exists()


def test_a_process_that_imported_jax_first_keeps_it_for_bm25s(fake_jax: Path) -> None:
    out = _run("import jax, sys, search_env, bm25s.selection as s; print('jax' in sys.modules, s.JAX_IS_AVAILABLE)", fake_jax)
    assert out == "True True"
