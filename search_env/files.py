"""Writing a file so that a crash, a full disk or an exception mid-write never leaves half of it.

Indexes, manifests, checkpoints and reports are read back by later runs, and a later run that finds a
truncated file either fails far from the cause or, worse, trusts it. So every such file is written the
same way: to a temporary file in the same folder (a rename is only atomic within one file system),
flushed and ``fsync``-ed, then renamed over the target with :func:`os.replace` (atomic on POSIX and
Windows). A reader sees the old file or the new one, never a mix; on failure the temporary file is
removed and the old file is untouched.

The new file gets the permissions a plain ``open(path, "w")`` would give it (``0o666`` less the umask),
or the old file's when it replaces one, so switching a writer to this module changes nothing a user sees.

:func:`write_atomically` writes text or bytes held in memory; :func:`open_atomically` hands out the
temporary file's binary handle for writers that stream (``torch.save``) or seek back to patch a header.
"""
from __future__ import annotations

import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

__all__ = ["open_atomically", "write_atomically"]


@contextmanager
def open_atomically(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary handle on a temporary file beside ``path`` that becomes ``path`` when the block ends.

    On a clean exit the handle is flushed, ``fsync``-ed and closed, and the file renamed over ``path``;
    if the block raises, the temporary file is removed and ``path`` keeps its old content (or stays
    absent). The handle is seekable, so a writer may go back and fill in a header. The parent folder
    must exist.
    """
    target = Path(path)
    handle, temporary = _create_beside(target)
    try:
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if target.exists():
            shutil.copymode(target, temporary)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _sync_folder(target.parent)


def write_atomically(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Replace ``path``'s content with ``data`` (``str`` is written as UTF-8, newlines untranslated) in
    one step, and return the path. The parent folder must exist."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with open_atomically(path) as handle:
        handle.write(payload)
    return Path(path)


def _create_beside(target: Path) -> tuple[BinaryIO, Path]:
    """A new, empty file in ``target``'s folder with an unused hidden name, opened for binary writing.

    ``os.open`` with mode ``0o666`` rather than :func:`tempfile.mkstemp` (which creates ``0o600``), so the
    umask decides the permissions just as it does for a plain ``open``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        temporary = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(temporary, flags, 0o666)
        except FileExistsError:  # another writer drew the same name: draw again
            continue
        return os.fdopen(fd, "wb"), temporary


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable: ``fsync`` the folder where the platform allows it (POSIX).

    The new file is in place by now; a file system that cannot sync a folder (some network mounts) only
    loses that guarantee, so its refusal is not an error."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
