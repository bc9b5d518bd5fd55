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
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from agents.training.backend import TrainingBackend

__all__ = ["CHECKPOINT_FILE", "capture_rng", "load_checkpoint", "load_run", "restore_rng", "save_checkpoint", "save_run"]

CHECKPOINT_FILE = "checkpoint.pt"  #: the file name of a run's latest checkpoint inside its output folder
CHECKPOINTS_DIR = "checkpoints"  #: beside it, the backend's folder of the saved step


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


def save_run(path: str | os.PathLike[str], step: int, state: dict[str, Any], backend: TrainingBackend) -> Path:
    """A run's checkpoint: the backend saves itself into a new folder ``checkpoints/step-N`` beside
    ``path``, then ``path`` (the trainer's ``state``, naming that folder) is written atomically, then older
    step folders are removed. A crash at any point leaves a complete checkpoint: the file always names
    a folder that was fully written before it."""
    target = Path(path)
    folder = target.parent / CHECKPOINTS_DIR / f"step-{step}"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    backend.save(folder)
    save_checkpoint(target, {**state, "backend_dir": str(folder.relative_to(target.parent))})
    for old in folder.parent.iterdir():
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)
    return target


def load_run(path: str | os.PathLike[str], backend: TrainingBackend) -> dict[str, Any]:
    """Load the backend's folder that the checkpoint at ``path`` names into ``backend``; returns the
    trainer's state."""
    target = Path(path)
    state = load_checkpoint(target)
    backend.load(target.parent / state.pop("backend_dir"))
    return state


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

