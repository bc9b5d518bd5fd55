"""One run per output folder at a time: a lock on ``run.lock`` in the folder, held for the run's life.

Two runs started in one folder at once both find it free of an earlier run, then write the same
checkpoint, logs and policy, each destroying the other's. So the process that runs in a folder (rank 0
of a multi-rank run) takes an exclusive ``flock`` on the folder's :data:`~agents.training.run_files.LOCK_FILE`
before it reads or writes anything there, and a second one fails at once with one line naming the
process that holds it. The holder removes the file as it lets go (a run that ends, cleanly or by an
error), so a finished run's folder holds no ``run.lock``. The operating system lets go of the lock when
its holder ends however it ends (a kill included), so a lock is never stale: the file a killed run
leaves behind locks nothing. A process that opened the file just before its holder removed it finds,
once it holds the lock, that the path names another file or none, and locks the path anew.

Within one process the lock is re-entrant: ``python -m agents.train`` takes it before it builds the
trainer (a resume cuts the logs back while it is built) and the trainer takes it again as it trains;
the folder is let go when the last holder releases it. On platforms without ``fcntl`` (Windows) there is
no lock.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from agents.training.run_checks import check_writable
from agents.training.run_files import LOCK_FILE

__all__ = ["RunFolderBusy", "RunLock", "lock_run_folder"]


@dataclass
class _Held:
    """A folder this process holds: its lock file, the file's open descriptor and how many holds are on it."""

    path: Path
    fd: int
    holders: int = 1


#: The locks this process holds, by the folder's real path.
_HELD: dict[str, _Held] = {}


class RunFolderBusy(ValueError):
    """Another process runs in the folder (a one-line ``ValueError``: the command line prints it as its error)."""


class RunLock:
    """This process's hold on a run folder (:func:`lock_run_folder`); :meth:`release` lets go of it."""

    def __init__(self, key: str) -> None:
        self._key: str | None = key

    def release(self) -> None:
        """Let go of this hold (once; later calls do nothing); the folder is free once every hold of this
        process is released."""
        key, self._key = self._key, None
        if key is None or key not in _HELD:
            return
        _HELD[key].holders -= 1
        if _HELD[key].holders == 0:
            held = _HELD.pop(key)
            try:  # removed while still locked: a process that opens the path from now on locks a new file
                os.unlink(held.path)
            except FileNotFoundError:
                pass
            os.close(held.fd)  # closing the last descriptor of the open file lets go of its flock

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_run_folder(directory: str | os.PathLike[str]) -> RunLock:
    """Hold ``directory`` (created if needed, :func:`~agents.training.run_checks.check_writable`) for this process's run: an exclusive lock on its
    :data:`~agents.training.run_files.LOCK_FILE`, which names this process while it holds it.

    Raises:
        RunFolderBusy: another process holds it (one line naming that process and what to do).
    """
    folder = check_writable(directory)  # a folder that cannot be written is its one line, not the lock's
    key = os.path.realpath(folder)
    if key in _HELD:
        _HELD[key].holders += 1
        return RunLock(key)
    try:
        import fcntl
    except ImportError:  # no flock here: nothing to hold
        return RunLock(key="")
    path = folder / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise RunFolderBusy(f"run.output_dir {str(folder)!r} is in use by another run (process {holder} holds {path}): "
                                "wait for it to end, or give another --run.output_dir") from None
        except BaseException:
            os.close(fd)
            raise
        if _is_file_at(fd, path):
            break
        os.close(fd)  # its holder removed it as it let go: lock the file at the path now
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    _HELD[key] = _Held(path, fd)
    return RunLock(key)


def _is_file_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the file at ``path`` (not removed, nor replaced)."""
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (opened.st_dev, opened.st_ino) == (at_path.st_dev, at_path.st_ino)
