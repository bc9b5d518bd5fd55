"""Checkpoints that survive a crash mid-write, say so when they are damaged, and the random-number state
an exact resume needs.

A checkpoint file is a short header - a format line, the SHA-256 and the length of what follows - then
one ``torch.save`` payload of plain data and tensors (loaded back with ``weights_only=True``, so opening
one runs no pickled code). It is written through :func:`search_env.files.open_atomically` - a temporary
file in the same folder while its digest is taken, flushed to disk, then renamed over the previous one
(atomic on POSIX and Windows): a crash at any point leaves either the old checkpoint or the new one, never half of one. On
load the length and the digest are checked before torch reads a byte, so a truncated, empty, foreign or
bit-flipped file is one ``ValueError`` line naming the file and what is wrong with it, never weights that
are silently off.

A run's checkpoint (:func:`save_run`) is the trainer's state in ``checkpoint.pt`` naming a folder
``checkpoints/step-N`` that the backend wrote first; ``checkpoint.pt`` also lists that folder's files
with their sizes and digests, so a backend that writes its own files (one per rank) is covered too.

An exact resume restores every source of randomness a step draws from - Python's ``random``, NumPy's
global generator, torch's CPU (and CUDA) generators - besides the model, optimiser and data position,
so a resumed run takes the very same steps as one that was never stopped.
"""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np
import torch

from agents.training.run_files import CHECKPOINTS_DIR
from search_env.files import open_atomically

if TYPE_CHECKING:
    from agents.training.backends import TrainingBackend

__all__ = [
    "capture_rng", "clean_run_folder", "load_checkpoint", "load_run", "load_run_backend", "open_run", "read_run",
    "restore_rng", "save_checkpoint", "save_run", "tensors_sha256",
]

#: The first line of every checkpoint file written here.
MAGIC = b"searchqa-checkpoint 1\n"
#: The header's size: the format line, ``sha256 <64 hex digits> bytes <20 digits>\n``, padded with spaces
#: to 128 bytes (so the payload starts at a 64-byte boundary).
HEADER_SIZE = 128
_HEADER = re.compile(rb"sha256 ([0-9a-f]{64}) bytes ([0-9]{20})\n *$")
_CHUNK = 1 << 20


def _header(digest: str, size: int) -> bytes:
    line = MAGIC + f"sha256 {digest} bytes {size:020d}\n".encode()
    return line + b" " * (HEADER_SIZE - len(line))


class _HashingWriter:
    """A write-only stream that forwards to ``handle`` while taking the SHA-256 and length of what passes."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle, self.sha256, self.size = handle, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        self.size += view.nbytes
        return self.handle.write(view)

    def flush(self) -> None:
        self.handle.flush()


class _Window(io.RawIOBase):
    """A read-only view of ``raw`` from byte ``offset`` on, that torch reads as a whole file."""

    def __init__(self, raw: IO[bytes], offset: int) -> None:
        super().__init__()
        self._raw, self._offset = raw, offset
        raw.seek(offset)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        pos = pos + self._offset if whence == io.SEEK_SET else pos
        return self._raw.seek(pos, whence) - self._offset

    def tell(self) -> int:
        return self._raw.tell() - self._offset

    def readinto(self, buffer: Any) -> int:
        return self._raw.readinto(buffer)


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically (temporary file, fsync, rename), behind a header holding the
    payload's SHA-256 and length, and return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open_atomically(target) as handle:
        handle.write(_header("0" * 64, 0))  # filled in once the payload's digest is known
        writer = _HashingWriter(handle)
        try:
            torch.save(state, writer)
        except RuntimeError as exc:  # torch's zip writer reports a failed write (a full disk) as its own error
            raise _os_error_in(exc) or exc
        handle.seek(0)
        handle.write(_header(writer.sha256.hexdigest(), writer.size))
    return target


def _os_error_in(exc: BaseException) -> OSError | None:
    """The ``OSError`` (ENOSPC...) behind ``exc`` in its chain of causes, if there is one."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def file_digest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """How a checkpoint lists one of its files: ``{"size", "sha256", "header"}``. For a file written by
    :func:`save_checkpoint` (``header`` true) the length and digest of its payload as its header states
    them (the payload is checked in full when it is loaded); for any other file its own."""
    target = Path(path)
    with open(target, "rb") as handle:
        head = handle.read(HEADER_SIZE)
        match = _HEADER.match(head[len(MAGIC):]) if head.startswith(MAGIC) else None
        if match is not None:
            return {"size": int(match.group(2)), "sha256": match.group(1).decode(), "header": True}
        handle.seek(0)
        return {"size": target.stat().st_size, "sha256": _sha256(handle), "header": False}


def _sha256(handle: IO[bytes]) -> str:
    digest = hashlib.sha256()
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def _read_header(handle: IO[bytes], target: Path) -> tuple[str, int]:
    """The payload's ``(sha256, length)`` that the header of the checkpoint file open in ``handle`` states,
    after checking that the file has that length. What is wrong is one ``ValueError`` line naming
    ``target``."""
    size = os.fstat(handle.fileno()).st_size
    if size == 0:
        raise ValueError(f"checkpoint {target} is empty (0 bytes): it was never fully written")
    head = handle.read(HEADER_SIZE)
    if head.startswith(MAGIC):
        match = _HEADER.match(head[len(MAGIC):])
        if match is None:
            raise ValueError(f"checkpoint {target} has a damaged header ({size} bytes)")
        digest, length = match.group(1).decode(), int(match.group(2))
        if size - HEADER_SIZE != length:
            what = "is truncated" if size - HEADER_SIZE < length else "has bytes appended"
            raise ValueError(f"checkpoint {target} {what}: {max(size - HEADER_SIZE, 0)} of the {length} bytes written")
        return digest, length
    raise ValueError(f"{target} is not a checkpoint ({size} bytes without a checkpoint's header)")


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors and plain data only), after checking
    its length and SHA-256.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        ValueError: one line naming the file and what is wrong: empty, truncated, corrupt (the digest
            differs), not a checkpoint, or unreadable by torch.
    """
    target = Path(path)
    if not target.is_file():
        raise FileNotFoundError(f"no checkpoint at {target}")
    with open(target, "rb") as handle:
        digest, _ = _read_header(handle, target)
        if _sha256(handle) != digest:
            raise ValueError(f"checkpoint {target} is corrupt: its SHA-256 differs from the one written with it")
        return _torch_load(_Window(handle, HEADER_SIZE), target, map_location)


def _torch_load(handle: IO[bytes], target: Path, map_location: str | torch.device) -> dict[str, Any]:
    """``torch.load`` of plain data and tensors; what goes wrong is one line naming ``target``."""
    try:
        return torch.load(handle, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:  # torch's own message advises weights_only=False: never for a checkpoint
        raise ValueError(f"checkpoint {target} holds objects other than tensors and plain data; it is not loaded") from None
    except (RuntimeError, EOFError, IndexError, KeyError, ValueError, OSError) as exc:
        raise ValueError(f"checkpoint {target} cannot be read: {_first_sentence(exc)}") from None


def _first_sentence(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return re.split(r"(?<=[a-z])\. ", text, maxsplit=1)[0].rstrip(".")


def save_run(path: str | os.PathLike[str], step: int, state: dict[str, Any], backend: TrainingBackend) -> Path:
    """A run's checkpoint: the backend saves itself into a new folder ``checkpoints/step-N`` beside
    ``path`` (``step-N.1``, ``step-N.2`` ... when the checkpoint in place is of the same step: the folder
    it names is never touched), then ``path`` (the trainer's ``state``, naming that folder and listing its
    files' sizes and digests) is written atomically, then other step folders and stale temporary files
    are removed. A crash at any point leaves a complete checkpoint: the file always names a folder that
    was fully written before it. With several data-parallel ranks every rank calls it: rank 0 picks the
    folder, every rank's backend writes its files into it, and rank 0 alone writes ``path``. A write that
    fails (a full disk, a folder gone read-only) is one ``OSError`` line naming the checkpoint."""
    try:
        return _save_run(Path(path), step, state, backend)
    except OSError as exc:
        reason = " ".join((exc.strerror or str(exc)).split())
        raise OSError(exc.errno, f"could not write the checkpoint {path}: {reason}") from exc


def _save_run(target: Path, step: int, state: dict[str, Any], backend: TrainingBackend) -> Path:
    root = target.parent / CHECKPOINTS_DIR
    folder = None
    if backend.rank == 0:
        folder = root / f"step-{step}"
        copy = 0
        while folder.exists():  # the checkpoint in place may name it: write beside it
            copy += 1
            folder = root / f"step-{step}.{copy}"
        folder.mkdir(parents=True)
    folder = Path(backend.broadcast_object(None if folder is None else str(folder)))
    backend.save(folder)
    if backend.rank == 0:
        files = {p.relative_to(folder).as_posix(): file_digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}
        save_checkpoint(target, {**state, "backend_dir": folder.relative_to(target.parent).as_posix(), "backend_files": files})
        clean_run_folder(target, keep=folder)
    backend.barrier()
    return target


def clean_run_folder(path: str | os.PathLike[str], keep: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove what a crash mid-save leaves beside the checkpoint ``path``: its stale temporary files
    (``.checkpoint.pt.*.tmp``) and every step folder of ``checkpoints/`` but ``keep`` (default: the one
    ``path`` names; nothing is removed from there when ``path`` cannot be read). Returns what it removed."""
    target = Path(path)
    removed = [p for p in target.parent.glob(f".{target.name}.*.tmp") if p.is_file()]
    for stale in removed:
        stale.unlink(missing_ok=True)
    root = target.parent / CHECKPOINTS_DIR
    if keep is None:
        try:
            keep = target.parent / load_checkpoint(target)["backend_dir"]
        except (OSError, ValueError, KeyError):
            return removed
    if root.is_dir():
        for old in root.iterdir():
            if old.resolve() == Path(keep).resolve():
                continue
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
            removed.append(old)
    return removed


def read_run(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The trainer's state in the run checkpoint at ``path`` (checked; ``backend_dir`` and
    ``backend_files`` still in it, for :func:`load_run_backend`)."""
    state = load_checkpoint(path)
    if "backend_dir" not in state:
        raise ValueError(f"checkpoint {path} is not a run's checkpoint: it names no backend folder")
    return state


def open_run(path: str | os.PathLike[str], backend: TrainingBackend) -> dict[str, Any]:
    """:func:`read_run`, then (rank 0, every rank waiting) what a crash mid-save left beside the checkpoint
    is removed: temporary files, step folders it does not name (:func:`clean_run_folder`)."""
    state = read_run(path)
    if backend.rank == 0:
        clean_run_folder(path, keep=Path(path).parent / state["backend_dir"])
    backend.barrier()
    return state


def load_run_backend(path: str | os.PathLike[str], state: dict[str, Any], backend: TrainingBackend) -> dict[str, Any]:
    """Check the backend's folder that ``state`` (read by :func:`read_run` from ``path``) names against
    the files it lists, then load it into ``backend``; returns the trainer's state without the two keys."""
    state = dict(state)
    folder = Path(path).parent / state.pop("backend_dir")
    files = state.pop("backend_files", None)
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint {path} names the folder {folder}, which is missing")
    for name, listed in (files or {}).items():
        _check_listed_file(folder / name, listed)
    backend.load(folder)
    return state


def _check_listed_file(file: Path, listed: Mapping[str, Any]) -> None:
    """One line naming ``file`` when it is not the file the checkpoint lists (a file with a header has its
    header checked here and its payload when it is loaded)."""
    if not file.is_file():
        raise FileNotFoundError(f"checkpoint file {file} is missing")
    if listed["header"]:
        with open(file, "rb") as handle:
            header = _read_header(handle, file)
        if header != (listed["sha256"], listed["size"]):
            raise ValueError(f"checkpoint file {file} is corrupt: its header differs from the one the checkpoint lists")
    elif file.stat().st_size == 0:
        raise ValueError(f"checkpoint file {file} is empty (0 bytes)")
    elif file_digest(file) != listed:
        raise ValueError(f"checkpoint file {file} is corrupt: its size or SHA-256 differs from the one written with it")


def load_run(path: str | os.PathLike[str], backend: TrainingBackend) -> dict[str, Any]:
    """Load the backend's folder that the checkpoint at ``path`` names into ``backend``, every file
    checked; returns the trainer's state."""
    return load_run_backend(path, read_run(path), backend)


def tensors_sha256(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """The SHA-256 of named tensors - names, dtypes, shapes and bytes, in order - to tell later whether
    weights a checkpoint leaves out to be rebuilt are rebuilt the same."""
    digest = hashlib.sha256()
    for name, tensor in named:
        value = tensor.detach().contiguous().cpu()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)};".encode())
        digest.update(memoryview(value.reshape(-1).view(torch.uint8).numpy()))
    return digest.hexdigest()


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

