"""Reading passage corpora: JSON-lines files in either of the two layouts that search-agent work uses.

- ``{"id", "title", "text"}`` (this project's sources, the synthetic world, ``corpus.jsonl``);
- ``{"id", "contents"}`` with ``contents = '"title"\\ntext'`` (the wiki-18 dump that Search-R1 and
  FlashRAG index).

Both are normalised to plain ``{"id": str, "title": str, "text": str}`` dicts, so every source indexes
one shape. Malformed rows raise ``ValueError`` naming the file and line, because a corpus with a bad
row is usually a truncated download and should be noticed before hours of indexing.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSON-lines file (1-based lines).

    Raises ``ValueError`` ("file:line: ...") for a line that is not UTF-8, not JSON or not a JSON
    object, so that callers can report row problems by position. (Lines are decoded one by one:
    decoding the file as a stream would report a bad byte without its line.)
    """
    path = Path(path)
    with path.open("rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{path}:{line_number}: invalid UTF-8 at byte {error.start + 1} of the line "
                                 f"({error.reason})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_number}: invalid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_number}: expected a JSON object, got {type(row).__name__}")
            yield line_number, row


def split_wiki18_contents(contents: str) -> tuple[str, str]:
    """Split a wiki-18 ``contents`` string into ``(title, text)``.

    The first line is the title, written in double quotes in the dump; one surrounding pair of quotes
    is removed. Without a newline the whole string is the text and the title is empty.
    """
    first, newline, rest = contents.partition("\n")
    if not newline:
        return "", contents
    title = first.strip()
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, rest


def passage_from_row(row: Mapping[str, Any], where: str) -> dict[str, str]:
    """Normalise one corpus row to ``{"id", "title", "text"}``.

    ``where`` (e.g. ``"corpus.jsonl:12"`` or ``"passage 3"``) prefixes error messages. A row needs an
    ``id`` and either ``text`` (``title`` optional, empty when absent) or wiki-18 ``contents``.
    """
    if "id" not in row or row["id"] is None:
        raise ValueError(f"{where}: passage has no 'id'")
    if "text" in row:
        title, text = row.get("title") or "", row["text"]
    elif "contents" in row:
        if not isinstance(row["contents"], str):
            raise ValueError(f"{where}: 'contents' must be a string, got {type(row['contents']).__name__}")
        title, text = split_wiki18_contents(row["contents"])
    else:
        raise ValueError(f"{where}: passage needs 'text' (with optional 'title') or wiki-18 'contents'; "
                         f"found keys {sorted(row)}")
    if not isinstance(title, str) or not isinstance(text, str):
        raise ValueError(f"{where}: 'title' and 'text' must be strings")
    return {"id": str(row["id"]), "title": title, "text": text}


def load_corpus(path: str | Path) -> list[dict[str, str]]:
    """Read a JSON-lines corpus (either layout, see the module docstring) into ``{id, title, text}`` dicts.

    A file without any passage is an error (``ValueError`` naming it): an empty corpus is a failed
    download or a wrong path, and a source over it could only answer nothing.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    passages = [passage_from_row(row, f"{path}:{line_number}") for line_number, row in iter_jsonl(path)]
    if not passages:
        raise ValueError(f"{path}: the corpus file has no passages")
    return passages
