"""CachedSource and TimeLimitedSource, with fake sources that record calls or sleep."""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from search_env.sources.base import Passage, Source, SourceError
from search_env.sources.cache import CachedSource
from search_env.sources.time_limit import TimeLimitedSource


class RecordingSource(Source):
    """Answers each query with k passages derived from its text; records every call."""

    name = "fake"

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []
        self.closed = False
        self._lock = threading.Lock()

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        with self._lock:
            self.calls.append((list(queries), k))
        return [[Passage(id=f"{q}/{i}", title=q, text=f"text {i}", score=float(k - i)) for i in range(k)]
                for q in queries]

    def close(self) -> None:
        self.closed = True


class SleepingSource(Source):
    """Sleeps ``delay`` seconds per call (cut short by ``release``), then answers like RecordingSource."""

    name = "slow"

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.release = threading.Event()
        self.finished = 0

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        self.release.wait(self.delay)
        self.finished += 1
        return [[Passage(id=f"{q}/late", title=q, text="late")] for q in queries]


class FailingSource(Source):
    name = "failing"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        raise self.error


# ---------------------------------------------------------------- CachedSource


def test_cache_hits_skip_the_inner_source() -> None:
    inner = RecordingSource()
    cached = CachedSource(inner, maxsize=10)
    first = cached.search(["a", "b"], 3)
    assert first == inner.search(["a", "b"], 3)
    inner.calls.clear()
    assert cached.search(["b", "a"], 3) == [first[1], first[0]]
    assert inner.calls == []
    assert (cached.hits, cached.misses) == (2, 2)
    assert cached.name == "fake" and len(cached) == 2


def test_only_distinct_misses_go_to_the_inner_source_in_one_call() -> None:
    inner = RecordingSource()
    cached = CachedSource(inner, maxsize=10)
    cached.search(["a", "b"], 2)
    inner.calls.clear()
    results = cached.search(["a", "c", "b", "d", "c"], 2)
    assert inner.calls == [(["c", "d"], 2)]
    assert [r[0].id for r in results] == ["a/0", "c/0", "b/0", "d/0", "c/0"]
    assert (cached.hits, cached.misses) == (3, 4)  # 2 + 2 misses; "a", "b" and the repeated "c" are hits


def test_k_is_part_of_the_key() -> None:
    inner = RecordingSource()
    cached = CachedSource(inner)
    cached.search(["a"], 2)
    assert len(cached.search(["a"], 5)[0]) == 5
    assert [k for _, k in inner.calls] == [2, 5]


def test_least_recently_used_entry_is_evicted() -> None:
    inner = RecordingSource()
    cached = CachedSource(inner, maxsize=2)
    cached.search(["a"], 1)
    cached.search(["b"], 1)
    cached.search(["a"], 1)  # "a" is now the most recently used
    cached.search(["c"], 1)  # evicts "b"
    inner.calls.clear()
    cached.search(["a", "c"], 1)
    assert inner.calls == []
    cached.search(["b"], 1)
    assert inner.calls == [(["b"], 1)]
    assert len(cached) == 2


def test_callers_cannot_corrupt_the_cache() -> None:
    cached = CachedSource(RecordingSource())
    cached.search(["a"], 2)[0].clear()
    assert len(cached.search(["a"], 2)[0]) == 2


def test_failures_propagate_and_are_not_cached() -> None:
    cached = CachedSource(FailingSource(SourceError("down")))
    with pytest.raises(SourceError, match="down"):
        cached.search(["a"], 1)
    assert len(cached) == 0 and cached.misses == 1


def test_wrong_number_of_results_is_a_source_error() -> None:
    class Short(RecordingSource):
        def search(self, queries, k):
            return super().search(queries, k)[:-1]

    with pytest.raises(SourceError, match="1 result lists for 2 queries"):
        CachedSource(Short()).search(["a", "b"], 1)


def test_cache_is_thread_safe() -> None:
    inner = RecordingSource()
    cached = CachedSource(inner, maxsize=8)  # small, so that eviction races with lookups
    errors: list[BaseException] = []
    n_threads, n_rounds = 8, 200

    def work(seed: int) -> None:
        try:
            for i in range(n_rounds):
                queries = [f"q{(seed * 7 + i * j) % 13}" for j in range(3)]
                for query, hits in zip(queries, cached.search(queries, 2)):
                    assert [p.id for p in hits] == [f"{query}/0", f"{query}/1"]
        except BaseException as error:  # noqa: BLE001 - surfaced by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    assert cached.hits + cached.misses == n_threads * n_rounds * 3
    assert cached.misses == sum(len(queries) for queries, _ in inner.calls)
    assert len(cached) <= 8


def test_cache_clear_and_close() -> None:
    inner = RecordingSource()
    cached = CachedSource(inner)
    cached.search(["a"], 1)
    cached.clear()
    assert len(cached) == 0 and (cached.hits, cached.misses) == (0, 0)
    cached.close()
    assert inner.closed
    with pytest.raises(ValueError):
        CachedSource(inner, maxsize=0)


# ---------------------------------------------------------------- TimeLimitedSource


def test_fast_calls_pass_through() -> None:
    inner = RecordingSource()
    limited = TimeLimitedSource(inner, timeout_s=5)
    assert limited.search(["a"], 2) == inner.search(["a"], 2)
    assert limited.name == "fake" and limited.timeouts == 0
    limited.close()
    assert inner.closed


def test_timeout_raises_source_error_and_discards_the_late_result() -> None:
    inner = SleepingSource(delay=30.0)  # held until released
    limited = TimeLimitedSource(inner, timeout_s=0.05, max_workers=2)
    with pytest.raises(SourceError, match="timed out after 0.05 s"):
        limited.search(["a"], 1)
    assert inner.finished == 0  # the call was still held: it did not wait for it
    assert limited.timeouts == 1
    inner.release.set()  # the late answer arrives now; the next call gets its own answer, never the late one
    assert limited.search(["b"], 1) == [[Passage(id="b/late", title="b", text="late")]]
    limited.close()


def test_no_thread_leak_across_many_timeouts() -> None:
    inner = SleepingSource(delay=5.0)
    limited = TimeLimitedSource(inner, timeout_s=0.01, max_workers=2)
    before = threading.active_count()
    for _ in range(20):
        with pytest.raises(SourceError):
            limited.search(["a"], 1)
    assert threading.active_count() <= before + 2
    assert limited.timeouts == 20
    inner.release.set()  # let the two stuck workers finish
    deadline = time.monotonic() + 10
    while inner.finished < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # time enough for any queued call to run, were it not cancelled
    assert inner.finished == 2  # the 18 calls that timed out in the queue never ran
    limited.close()


def test_inner_exceptions_propagate_unchanged() -> None:
    with pytest.raises(ValueError, match="bad query"):
        TimeLimitedSource(FailingSource(ValueError("bad query")), timeout_s=5).search(["a"], 1)
    # The inner source's own TimeoutError (e.g. a socket timeout) is not mistaken for this limit.
    limited = TimeLimitedSource(FailingSource(TimeoutError("socket")), timeout_s=5)
    with pytest.raises(TimeoutError, match="socket"):
        limited.search(["a"], 1)
    assert limited.timeouts == 0


def test_closed_source_raises_source_error() -> None:
    limited = TimeLimitedSource(RecordingSource(), timeout_s=1)
    limited.close()
    with pytest.raises(SourceError, match="closed"):
        limited.search(["a"], 1)
    with pytest.raises(ValueError):
        TimeLimitedSource(RecordingSource(), timeout_s=0)


def test_cached_time_limited_source_does_not_cache_timeouts() -> None:
    inner = SleepingSource(delay=0.3)
    cached = CachedSource(TimeLimitedSource(inner, timeout_s=0.02))
    with pytest.raises(SourceError):
        cached.search(["a"], 1)
    assert len(cached) == 0
    inner.delay = 0.0
    assert cached.search(["a"], 1)[0][0].id == "a/late"
    cached.close()
