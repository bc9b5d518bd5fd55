"""``bm25s``, imported without starting JAX.

When JAX is installed, importing ``bm25s`` runs one JAX operation to warm JAX up, which starts JAX's
client on the default device. On a GPU machine that client takes 75% of the GPU's memory (JAX's
preallocation) in every process that imports the environment, before any model is loaded: a trainer
or a vLLM engine beside it runs out of memory, and a few such processes leave later ones no GPU at all.
The environment never uses ``bm25s``'s JAX top-k (its sources rank passages themselves), so JAX is
hidden while ``bm25s`` is imported. A process that imported JAX itself keeps it: ``bm25s`` then sees it
as it would anyway.
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType

__all__ = ["import_bm25s"]


def import_bm25s() -> ModuleType:
    """The ``bm25s`` module (its ``tokenization`` submodule loaded), imported with JAX hidden unless
    the process has imported JAX or ``bm25s`` already."""
    hide = "bm25s" not in sys.modules and "jax" not in sys.modules
    if hide:
        sys.modules["jax"] = None  # type: ignore[assignment]  # "import jax..." raises ImportError meanwhile
    try:
        importlib.import_module("bm25s.tokenization")
    finally:
        if hide:
            del sys.modules["jax"]
    return sys.modules["bm25s"]
