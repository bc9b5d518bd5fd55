"""Building the served source while the server already answers: :class:`SourceBuild`.

Why: indexing a corpus takes minutes (a dense index of 14k passages took 11 on two cores). A server
that only listens once its index is built looks dead meanwhile: ``/health`` gets no answer, so a load
balancer, a supervisor or a training job waiting for it cannot tell "still building" from "crashed".
The server therefore listens at once and builds on a background thread; until the source is ready,
``GET /health`` answers HTTP 503 with ``{"status": "building"}`` (503 is what readiness probes and load
balancers read as "not ready, try later") and ``POST /retrieve`` answers 503 with a message saying so.
A build that fails leaves ``{"status": "failed", "error": ...}`` behind, also 503.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Literal, Sequence

from search_env.sources.base import Passage, Source, SourceError

__all__ = ["BuildState", "SourceBuild", "SourceBuildFailed"]

log = logging.getLogger(__name__)

BuildState = Literal["building", "ready", "failed"]


class SourceBuildFailed(RuntimeError):
    """The served source could not be built; the message says why, in one line."""


class SourceBuild(Source):
    """A source built by ``build()`` on a daemon thread: searches it once the build has ended.

    Args:
        build: makes the source (loads or builds its index); may take minutes.
        name: the source's name, known before the build ends (``/health`` reports it meanwhile).

    Searching before the build is ready raises :class:`SourceError` saying where it stands. The
    thread is a daemon so that stopping the server (Ctrl-C) during a long build does not wait for
    the build to end.
    """

    def __init__(self, build: Callable[[], Source], *, name: str) -> None:
        self._build = build
        self.name = name
        self.source: Source | None = None  #: the built source, once ready
        self.error: str | None = None  #: why the build failed, once failed
        self._started_at: float | None = None
        self._finished_at: float | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()

    @property
    def state(self) -> BuildState:
        """``"building"`` (also before :meth:`start`), ``"ready"`` or ``"failed"``."""
        if not self._done.is_set():
            return "building"
        return "ready" if self.source is not None else "failed"

    @property
    def seconds(self) -> float:
        """How long the build has run (or ran, once it ended); 0 before it starts."""
        if self._started_at is None:
            return 0.0
        return (self._finished_at or time.monotonic()) - self._started_at

    def describe(self) -> str:
        """Where the build stands, as one line for a client (or a log) that found the source not ready."""
        if self.state == "failed":
            return f"building source {self.name!r} failed: {self.error}"
        if self.state == "building":
            return f"source {self.name!r} is still being built ({self.seconds:.0f} s so far); retry once GET /health answers 200"
        return f"source {self.name!r} is ready"

    def start(self, on_done: Callable[[], None] | None = None) -> None:
        """Start the build on its thread, unless it was started already; ``on_done`` runs on that
        thread when the build ends, whether it succeeded or not."""
        with self._lock:
            if self._started_at is not None:
                return
            self._started_at = time.monotonic()
        threading.Thread(target=self._run, args=(on_done,), name=f"build-{self.name}", daemon=True).start()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until the build ends (ready or failed); False if it is still running after ``timeout_s``."""
        return self._done.wait(timeout_s)

    @property
    def fork_safe(self) -> bool:
        return self.source is not None and self.source.fork_safe

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        if self.source is None:
            raise SourceError(self.describe())
        return self.source.search(queries, k)

    def close(self) -> None:
        """Close the built source, if the build got that far (a build still running is left to finish)."""
        if self.source is not None:
            self.source.close()

    def _run(self, on_done: Callable[[], None] | None) -> None:
        log.info("building source %r; /health answers 503 until it is ready", self.name)
        try:
            source = self._build()
        except Exception as exc:  # reported through /health, the log and (the CLI) the exit status
            self.error = f"{type(exc).__name__}: {exc}"
        else:
            self.source = source
        self._finished_at = time.monotonic()
        if self.error is not None:
            log.error("building source %r failed after %.1f s: %s", self.name, self.seconds, self.error)
        else:
            log.info("source %r is ready after %.1f s", self.name, self.seconds)
        self._done.set()
        if on_done is not None:
            on_done()
