"""A per-call time limit for any source.

A hung retrieval server or a pathological query must not stall an episode (or a whole vector of
environments): after ``timeout_s`` the caller gets a :class:`SourceError`, which the environment turns
into an error observation, and the answer that arrives later is thrown away.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait

from search_env._fork import forget_threads_after_fork
from search_env.sources.base import Passage, Source, SourceError


class TimeLimitedSource(Source):
    """Runs ``source.search`` on a small fixed thread pool and waits at most ``timeout_s`` for it.

    The pool has ``max_workers`` threads for the wrapper's lifetime (none is started per call). A call
    still queued when its time runs out is cancelled; one already running cannot be stopped from
    Python, so it keeps its worker until the inner source returns — give network sources their own
    socket timeouts so that workers come back. ``timeouts`` counts calls that ran out of time.
    Exceptions raised by the inner source within the limit propagate unchanged.
    """

    def __init__(self, source: Source, timeout_s: float, *, max_workers: int = 4) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.source = source
        self.name = source.name
        self.timeout_s = timeout_s
        self.timeouts = 0
        self._count_lock = threading.Lock()
        self._max_workers = max_workers
        self._pool = self._new_pool()
        forget_threads_after_fork(self, TimeLimitedSource._restart_pool)

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix=f"source-{self.source.name}")

    def _restart_pool(self) -> None:
        """In a forked child the parent's threads do not exist: a new pool (its threads start on use)."""
        self._pool = self._new_pool()

    @property
    def fork_safe(self) -> bool:
        return self.source.fork_safe

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Return the inner source's answer, or raise :class:`SourceError` after ``timeout_s`` seconds."""
        if isinstance(queries, str):
            raise TypeError("search() takes a sequence of queries, not a single string")
        try:
            future = self._pool.submit(self.source.search, list(queries), k)
        except RuntimeError as error:  # the pool was shut down by close()
            raise SourceError(f"source {self.name!r} is closed") from error
        # wait() rather than result(timeout=...): a TimeoutError raised by the inner source itself
        # (a socket timeout, say) must propagate as it is, not be mistaken for this limit.
        done, _ = wait([future], timeout=self.timeout_s)
        if not done:
            future.cancel()
            with self._count_lock:
                self.timeouts += 1
            raise SourceError(f"source {self.name!r} timed out after {self.timeout_s:g} s "
                              f"({len(queries)} queries)")
        return future.result()

    def close(self) -> None:
        """Stop the worker threads (without waiting for running calls) and close the inner source."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.source.close()
