"""Hybrid retrieval: several sources (typically BM25 and dense) fused by reciprocal-rank fusion.

RRF (Cormack et al., 2009) scores a passage by the sum over rankings of ``weight / (k + rank)``
with 1-based ranks. It uses ranks only, so it needs no calibration between BM25 scores and cosine
similarities, and a passage that two retrievers both rank well beats one that only one ranks first.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Hashable, Sequence, TypeVar

from search_env._fork import forget_threads_after_fork

from .base import Passage, Source

Key = TypeVar("Key", bound=Hashable)


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[Key]], *, k: float = 60.0, weights: Sequence[float] | None = None
) -> list[tuple[Key, float]]:
    """Fuse ranked lists of keys, best first, into one list of (key, fused score), best first.

    A key's score is the sum of ``weights[i] / (k + rank)`` over the lists ``i`` that contain it
    (rank counted from 1; a key repeated within one list counts at its first rank). Ties keep the
    order in which keys were first seen (list by list, rank by rank), so the result is deterministic.
    """
    if k < 0:
        raise ValueError(f"the RRF constant k must be non-negative, got {k}")
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError(f"got {len(weights)} weights for {len(rankings)} rankings")
    scores: dict[Key, float] = {}
    for ranking, weight in zip(rankings, weights):
        seen: set[Key] = set()
        for rank, key in enumerate(ranking, 1):
            if key in seen:
                continue
            seen.add(key)
            scores[key] = scores.get(key, 0.0) + weight / (k + rank)
    first_seen = {key: i for i, key in enumerate(scores)}
    return sorted(scores.items(), key=lambda item: (-item[1], first_seen[item[0]]))


class HybridSource(Source):
    """A source whose results are the RRF fusion of two or more other sources' results.

    Each query goes to every source (concurrently, one thread per source, so a remote source's
    latency overlaps the others'), asking each for ``depth`` candidates; the fused top ``k`` come
    back with their RRF score as ``score``. Passages are matched across sources by ``id``, so the
    sources must share an id space (e.g. BM25 and dense over the same corpus).

    Args:
        sources: the sources to fuse (at least two).
        rrf_k: the RRF constant; 60 is the value from the RRF paper and the usual default.
        weights: one weight per source (default all 1.0).
        depth: candidates taken from each source; None means ``max(k, 20)`` per search. Deeper lists
            let a passage ranked moderately by both sources surface.
        name: the source's name in multi-source environments.

    The hybrid owns its sources: :meth:`close` closes them too.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        *,
        rrf_k: float = 60.0,
        weights: Sequence[float] | None = None,
        depth: int | None = None,
        name: str = "hybrid",
    ) -> None:
        if len(sources) < 2:
            raise ValueError(f"HybridSource fuses at least two sources, got {len(sources)}")
        if weights is not None and len(weights) != len(sources):
            raise ValueError(f"got {len(weights)} weights for {len(sources)} sources")
        if weights is not None and any(w < 0 for w in weights):
            raise ValueError(f"weights must be non-negative, got {list(weights)}")
        if rrf_k < 0:
            raise ValueError(f"rrf_k must be non-negative, got {rrf_k}")
        if depth is not None and depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.sources = list(sources)
        self.rrf_k = rrf_k
        self.weights = list(weights) if weights is not None else None
        self.depth = depth
        self.name = name
        self._pool = self._new_pool()
        forget_threads_after_fork(self, HybridSource._restart_pool)

    @property
    def fork_safe(self) -> bool:
        return all(source.fork_safe for source in self.sources)

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Fused top-``k`` passages per query; a failing source's exception propagates."""
        if k < 0:
            raise ValueError(f"k must be non-negative, got {k}")
        queries = list(queries)
        if not queries:
            return []
        if k == 0:
            return [[] for _ in queries]
        depth = self.depth if self.depth is not None else max(k, 20)
        futures = [self._pool.submit(source.search, queries, depth) for source in self.sources]
        per_source = [future.result() for future in futures]
        fused = []
        for q in range(len(queries)):
            lists = [results[q] for results in per_source]
            by_id: dict[str, Passage] = {}
            for ranking in lists:
                for passage in ranking:
                    by_id.setdefault(passage.id, passage)
            ranked = reciprocal_rank_fusion([[p.id for p in ranking] for ranking in lists], k=self.rrf_k,
                                            weights=self.weights)
            fused.append([Passage(pid, by_id[pid].title, by_id[pid].text, score) for pid, score in ranked[:k]])
        return fused

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=len(self.sources), thread_name_prefix=f"{self.name}-fusion")

    def _restart_pool(self) -> None:
        """In a forked child the parent's threads do not exist: a new pool (its threads start on use)."""
        self._pool = self._new_pool()

    def close(self) -> None:
        """Stop the worker threads and close every fused source."""
        self._pool.shutdown(wait=True)
        for source in self.sources:
            source.close()
