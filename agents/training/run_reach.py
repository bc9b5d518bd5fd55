"""What a run on several machines must reach before it trains, checked at its start with one line each.

* :func:`check_retrieval_servers`: a run that searches retrieval servers (``data.retrieval_url``) asks
  each one's ``GET /health`` before the model loads. A server started with its default ``--host
  127.0.0.1`` cannot be reached from another machine, and without this check every search of every
  step would fail (a zero reward, a warning every few steps) instead of the run failing at once.
* :func:`check_shared_output`: with several ranks, ``run.output_dir`` must be one folder that every rank
  sees (a shared filesystem), because the DeepSpeed and FSDP checkpoints are one file per rank in it and a
  resume reads them all back. Rank 0 writes a marker holding a random token, every rank reads it after a
  barrier, and a rank that cannot fails the run on every rank with one line.
"""
from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from agents.training.backends import TrainingBackend

__all__ = ["SHARED_MARKER", "check_retrieval_servers", "check_shared_output", "health_url"]

#: The marker file rank 0 writes in ``run.output_dir`` for the other ranks to read (removed afterwards).
SHARED_MARKER = ".shared-folder-check"


def health_url(retrieve_url: str) -> str:
    """The ``/health`` URL of the server whose ``/retrieve`` URL (or bare address) is ``retrieve_url``."""
    parts = urlsplit(retrieve_url)
    return urlunsplit((parts.scheme, parts.netloc, "/health", "", ""))


def check_retrieval_servers(retrieval_url: str, timeout_s: float = 5.0) -> None:
    """Raise ``ValueError`` (one line) unless at least one of the comma-separated retrieval servers in
    ``retrieval_url`` answers ``GET /health`` with HTTP 200 within ``timeout_s``: none reachable (a server
    bound to 127.0.0.1 on another machine, a wrong port, a firewall), or still building its index (503)."""
    from search_env.sources.remote import replica_urls

    failures = []
    for url in replica_urls(retrieval_url):
        target = health_url(url)
        try:
            with urllib.request.urlopen(target, timeout=timeout_s) as response:
                if response.status == 200:
                    return
                failures.append(f"{target} answered HTTP {response.status}")
        except urllib.error.HTTPError as exc:
            try:
                status = json.loads(exc.read() or b"{}").get("status", "")
            except ValueError:
                status = ""
            failures.append(f"{target} answered HTTP {exc.code}" + (f" ({status})" if status else ""))
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            failures.append(f"{target} is unreachable ({' '.join(str(reason).split())})")
    raise ValueError("data.retrieval_url: no retrieval server is ready: " + "; ".join(failures)
                     + " (a server on another machine needs python -m search_env.server ... --host 0.0.0.0)")


def check_shared_output(directory: str | Path, backend: TrainingBackend) -> None:
    """With several ranks, check that every rank sees the same ``directory`` (module docstring); raise
    ``ValueError`` (one line, on every rank) naming the ranks that do not. A collective: every rank calls
    it, after rank 0 has made the folder. Nothing to check on one rank."""
    if backend.world_size == 1:
        return
    marker = Path(directory) / SHARED_MARKER
    token = secrets.token_hex(16) if backend.rank == 0 else None
    if backend.rank == 0:
        marker.write_text(token, encoding="utf-8")
    token = backend.broadcast_object(token)
    backend.barrier()  # the marker is written before any rank reads it
    try:
        seen = marker.read_text(encoding="utf-8") == token
    except OSError:
        seen = False
    blind = [rank for rank, ok in enumerate(backend.all_gather_object(seen)) if not ok]
    if backend.rank == 0:
        marker.unlink(missing_ok=True)
    if blind:
        raise ValueError(f"run.output_dir {str(directory)!r} is not the same folder on every rank: rank(s) "
                         f"{', '.join(map(str, blind))} do not see rank 0's files there; put it on a filesystem every "
                         "machine shares (checkpoints are one file per rank, and rank 0 writes the logs and policy/)")
