"""What produced a run's numbers, as content digests: the corpus searched, the model weights, an agent's code.

A file's name says little: ``corpus.jsonl`` of another Wikipedia dump, a model folder retrained in
place, an agent module edited between two runs all keep their names and change the scores. So
retrieval records, output folders and resumed episodes are keyed by what the files hold (SHA-256),
and a run that finds different content under the same name refuses to mix the two.

A corpus or a model can be many gigabytes, so :func:`file_digest` keeps each file's digest in a
small cache (:data:`DIGEST_CACHE`) keyed by its resolved path, size and modification time: a file is
read once, and read again only when one of the three changes. A cache that cannot be read or written
costs time, never a wrong answer.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
from pathlib import Path
from agents.rollout.engines import is_engine
from search_env.files import write_atomically

from benchmarks.evaluation.agent_specs import AGENT_KINDS

__all__ = ["DIGEST_CACHE", "DIGEST_CHARS", "WEIGHT_SUFFIXES", "agent_producer", "file_digest", "folder_weights_digest"]

#: Where known files' digests are kept between runs.
DIGEST_CACHE = Path.home() / ".cache" / "searchqa_gym" / "digests.json"
#: Hex digits of a SHA-256 kept (64 bits: enough to tell two files apart, short enough to read in a message).
DIGEST_CHARS = 16
#: The files of a model folder that hold its weights.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_CHUNK = 1 << 20


def file_digest(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of the file's bytes (its first :data:`DIGEST_CHARS` hex digits), read once per
    (path, size, modification time) thanks to :data:`DIGEST_CACHE`."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    key = f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}"
    cache = _read_cache()
    if key in cache:
        return cache[key]
    sha = hashlib.sha256()
    with open(resolved, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            sha.update(chunk)
    digest = sha.hexdigest()[:DIGEST_CHARS]
    cache = {k: v for k, v in _read_cache().items() if not k.startswith(f"{resolved}|")}  # the file's older versions go
    cache[key] = digest
    try:
        DIGEST_CACHE.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(DIGEST_CACHE, json.dumps(cache, indent=0, sort_keys=True) + "\n")
    except OSError:
        pass  # a read-only home: the digest is computed again next time
    return digest


def folder_weights_digest(folder: str | os.PathLike[str]) -> str | None:
    """One digest over a model folder's weight files (their names and contents), or None when it has none."""
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if not files:
        return None
    sha = hashlib.sha256()
    for path in files:
        sha.update(f"{path.relative_to(folder)}={file_digest(path)}\n".encode())
    return sha.hexdigest()[:DIGEST_CHARS]


def agent_producer(spec: str) -> dict[str, str | None]:
    """What an ``--agents`` spec's episodes depend on beyond its name: ``weights``, the digest of the model
    folder it names (if any), and ``source``, the digest of the source file of a ``module:Name`` agent
    (if it has one)."""
    folder = next((part for part in _suffixes(spec) if os.path.isdir(part)), None)
    source = None
    kind, colon, name = spec.partition(":")
    if folder is None and colon and kind not in AGENT_KINDS and not is_engine(kind):
        try:
            target = getattr(importlib.import_module(kind), name)
            path = inspect.getsourcefile(target)
        except (ImportError, AttributeError, TypeError):  # an engine's spec, a builtin: no source of its own
            path = None
        source = file_digest(path) if path is not None and os.path.isfile(path) else None
    return {"weights": folder_weights_digest(folder) if folder is not None else None, "source": source}


def _suffixes(spec: str) -> list[str]:
    """``a:b:c``, ``b:c``, ``c``: where a model folder can sit in a spec (``ircot:hf:FOLDER``)."""
    parts = spec.split(":")
    return [":".join(parts[i:]) for i in range(len(parts))]


def _read_cache() -> dict[str, str]:
    try:
        data = json.loads(DIGEST_CACHE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
