"""An LRU cache in front of any source.

RL rollouts repeat queries a lot (a group of samples for one question, the same entity looked up in
every epoch), so answering repeats from memory saves most retrieval time, above all for remote and
dense sources.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from search_env.sources.base import Passage, Source, checked_results


class CachedSource(Source):
    """Wraps ``source`` with a thread-safe LRU cache keyed by ``(query, k)``.

    A batch is split into hits and misses; the distinct missing queries go to the inner source in a
    single ``search`` call and their results are cached. ``hits`` and ``misses`` count queries:
    ``misses`` is the number of queries sent to the inner source, ``hits`` the rest (a query repeated
    within one batch is sent once, so its repeats count as hits). Failed inner calls cache nothing.
    """

    def __init__(self, source: Source, maxsize: int = 4096) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.source = source
        self.name = source.name
        self.maxsize = maxsize
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[str, int], tuple[Passage, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def fork_safe(self) -> bool:
        return self.source.fork_safe

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Answer cached ``(query, k)`` pairs from memory and the rest with one inner call."""
        if isinstance(queries, str):
            raise TypeError("search() takes a sequence of queries, not a single string")
        results: list[list[Passage] | None] = [None] * len(queries)
        missing: dict[str, list[int]] = {}  # query -> positions in the batch, in first-seen order
        with self._lock:
            for position, query in enumerate(queries):
                cached = self._entries.get((query, k))
                if cached is not None:
                    self._entries.move_to_end((query, k))
                    results[position] = list(cached)
                else:
                    missing.setdefault(query, []).append(position)
            self.misses += len(missing)
            self.hits += len(queries) - len(missing)
        if missing:
            fetched = checked_results(self.source.search(list(missing), k), len(missing), self.name)
            with self._lock:
                for (query, positions), passages in zip(missing.items(), fetched):
                    entry = tuple(passages)
                    self._entries[(query, k)] = entry
                    self._entries.move_to_end((query, k))
                    for position in positions:
                        results[position] = list(entry)
                while len(self._entries) > self.maxsize:
                    self._entries.popitem(last=False)
        return results  # type: ignore[return-value]  # every position is filled above

    def clear(self) -> None:
        """Drop every cached entry and reset the counters."""
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0

    def close(self) -> None:
        """Close the inner source."""
        self.source.close()
