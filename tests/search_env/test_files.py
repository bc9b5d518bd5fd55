"""Atomic file writes: the content lands whole, a failed write leaves the old file and no temporary file
behind, and the permissions are those a plain write would give."""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from search_env.files import open_atomically, write_atomically


def _names(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def test_text_and_bytes_land_whole(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    assert write_atomically(target, "héllo\r\nworld\n") == target
    assert target.read_bytes() == "héllo\r\nworld\n".encode("utf-8")  # UTF-8, newlines as given
    write_atomically(str(target), b"\x00\xffbytes")
    assert target.read_bytes() == b"\x00\xffbytes"
    assert _names(tmp_path) == ["notes.txt"]


def test_a_failing_stream_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "state.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"):
        with open_atomically(target) as handle:
            handle.write(b"half of the new")
            raise RuntimeError("disk full")
    assert target.read_bytes() == b"old"
    assert _names(tmp_path) == ["state.bin"]


def test_a_failed_write_of_a_new_file_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        with open_atomically(tmp_path / "new.bin") as handle:
            handle.write(b"partial")
            raise KeyboardInterrupt
    assert _names(tmp_path) == []


def test_the_failing_rename_removes_the_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "report.md"
    target.write_text("old", encoding="utf-8")

    def refuse(source: object, destination: object) -> None:
        raise PermissionError("read-only file system")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PermissionError, match="read-only"):
        write_atomically(target, "new")
    assert target.read_text(encoding="utf-8") == "old"
    assert _names(tmp_path) == ["report.md"]


def test_the_temporary_file_sits_beside_the_target_until_the_block_ends(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint.pt"
    target.write_bytes(b"previous")
    with open_atomically(target) as handle:
        handle.write(b"HEADER??payload")
        handle.seek(0)  # a streaming writer patches its header once the payload is known
        handle.write(b"HEADER!!")
        during = _names(tmp_path)
        assert target.read_bytes() == b"previous"  # readers still see the old file
    assert len(during) == 2 and during[0].startswith(".checkpoint.pt.") and during[0].endswith(".tmp")
    assert target.read_bytes() == b"HEADER!!payload"
    assert _names(tmp_path) == ["checkpoint.pt"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")
def test_permissions_follow_the_umask_or_the_replaced_file(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        fresh = write_atomically(tmp_path / "fresh.json", "{}")
        kept = tmp_path / "kept.json"
        kept.write_text("{}", encoding="utf-8")
        kept.chmod(0o640)
        write_atomically(kept, "[]")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644  # as open(path, "w") would make it, not mkstemp's 0o600
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640


def test_a_missing_folder_is_an_error_not_a_new_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomically(tmp_path / "absent" / "file.txt", "x")
    assert _names(tmp_path) == []
