"""Checkpoints that survive a crash mid-write, and the random-number state an exact resume needs.

A checkpoint is one ``torch.save`` file holding plain data and tensors (loaded back with
``weights_only=True``, so opening one runs no pickled code). It is written to a temporary file in the
same folder, flushed to disk, then renamed over the previous one with :func:`os.replace` (atomic on
POSIX and Windows): a crash at any point leaves either the old checkpoint or the new one, never half
of one.

An exact resume restores every source of randomness a step draws from - Python's ``random``, NumPy's
global generator, torch's CPU (and CUDA) generators - besides the model, optimiser and data position,
so a resumed run takes the very same steps as one that was never stopped.
"""
from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["CHECKPOINT_FILE", "save_checkpoint", "load_checkpoint", "capture_rng", "restore_rng"]

CHECKPOINT_FILE = "checkpoint.pt"  #: the file name of a run's latest checkpoint inside its output folder


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically (temporary file, fsync, rename) and return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors and plain data only)."""
    target = Path(path)
    if not target.is_file():
        raise FileNotFoundError(f"no checkpoint at {target}")
    return torch.load(target, map_location=map_location, weights_only=True)


def capture_rng() -> dict[str, Any]:
    """The state of Python's, NumPy's and torch's global generators, as plain data and tensors."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back the generator states taken by :func:`capture_rng`."""
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["kind"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

