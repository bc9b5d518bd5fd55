"""Reciprocal-rank fusion on hand-made rankings (expected orders and scores worked out by hand) and
the HybridSource built on it."""
from __future__ import annotations

from typing import Sequence

import pytest

from search_env.sources.base import Passage, Source, SourceError
from search_env.sources.hybrid import HybridSource, reciprocal_rank_fusion


def test_rrf_default_k_two_overlapping_rankings() -> None:
    # a: 1/61; b: 1/62 + 1/61; c: 1/63 + 1/62; d: 1/63  ->  b > c > a > d
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["b", "c", "d"]])
    assert [key for key, _ in fused] == ["b", "c", "a", "d"]
    expected = {"a": 1 / 61, "b": 1 / 62 + 1 / 61, "c": 1 / 63 + 1 / 62, "d": 1 / 63}
    for key, score in fused:
        assert score == pytest.approx(expected[key])


def test_rrf_tie_keeps_first_seen_order() -> None:
    # a = c = 1/61 + 1/63 = 124/3843 ~ 0.0322664 > b = 2/62 ~ 0.0322581; a is seen before c
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["c", "b", "a"]])
    assert [key for key, _ in fused] == ["a", "c", "b"]
    assert fused[0][1] == pytest.approx(124 / 3843)


def test_rrf_weights_change_the_order() -> None:
    # weights 1, 2: a = 1/61 + 2/63 ~ 0.048139; b = 3/62 ~ 0.048387; c = 1/63 + 2/61 ~ 0.048660
    fused = reciprocal_rank_fusion([["a", "b", "c"], ["c", "b", "a"]], weights=[1.0, 2.0])
    assert [key for key, _ in fused] == ["c", "b", "a"]
    assert dict(fused)["b"] == pytest.approx(3 / 62)


def test_rrf_small_k_and_repeated_keys() -> None:
    # k = 0: first list gives a 1/1 and b 1/3 (the repeated a is ignored); second gives b 1/1
    fused = reciprocal_rank_fusion([["a", "a", "b"], ["b"]], k=0)
    assert fused == [("b", pytest.approx(1 / 3 + 1)), ("a", pytest.approx(1.0))]


def test_rrf_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="weights"):
        reciprocal_rank_fusion([["a"], ["b"]], weights=[1.0])
    with pytest.raises(ValueError, match="non-negative"):
        reciprocal_rank_fusion([["a"]], k=-1)


class ListSource(Source):
    """Answers every query with a fixed ranking (or a per-query one) and records its calls."""

    def __init__(self, name: str, rankings: dict[str, list[str]] | list[str]) -> None:
        self.name = name
        self.rankings = rankings
        self.calls: list[tuple[list[str], int]] = []
        self.closed = False

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        self.calls.append((list(queries), k))
        out = []
        for q in queries:
            ids = self.rankings[q] if isinstance(self.rankings, dict) else self.rankings
            out.append([Passage(pid, f"{self.name} title {pid}", f"{self.name} text {pid}", 100.0 - r)
                        for r, pid in enumerate(ids[:k])])
        return out

    def close(self) -> None:
        self.closed = True


class BrokenSource(Source):
    name = "broken"

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        raise SourceError("server down")


def test_hybrid_fuses_per_query_and_truncates_to_k() -> None:
    bm25 = ListSource("bm25", {"q1": ["a", "b", "c"], "q2": ["x", "y"]})
    dense = ListSource("dense", {"q1": ["b", "c", "d"], "q2": ["y", "z"]})
    hybrid = HybridSource([bm25, dense])
    try:
        results = hybrid.search(["q1", "q2"], k=2)
    finally:
        hybrid.close()
    assert [[p.id for p in r] for r in results] == [["b", "c"], ["y", "x"]]
    assert results[0][0].score == pytest.approx(1 / 62 + 1 / 61)
    # q2: y = 1/62 + 1/61, x = 1/61, z = 1/62 -> y, x (z cut by k=2)
    assert results[1][1].score == pytest.approx(1 / 61)
    # a passage's title and text come from the first source that returned it
    assert results[0][0].title == "bm25 title b"
    assert results[1][0].text == "bm25 text y"
    # each source is asked once for the whole batch, with the default depth max(k, 20)
    assert bm25.calls == [(["q1", "q2"], 20)] and dense.calls == [(["q1", "q2"], 20)]
    assert bm25.closed and dense.closed


def test_hybrid_depth_weights_and_three_sources() -> None:
    sources = [ListSource("s1", ["a", "b", "c"]), ListSource("s2", ["c", "b", "a"]), ListSource("s3", ["d"])]
    hybrid = HybridSource(sources, weights=[1.0, 2.0, 0.0], depth=3)
    results = hybrid.search(["anything"], k=10)
    hybrid.close()
    # as in test_rrf_weights_change_the_order, plus d with weight 0 last
    assert [p.id for p in results[0]] == ["c", "b", "a", "d"]
    assert results[0][3].score == 0.0
    assert all(s.calls == [(["anything"], 3)] for s in sources)


def test_hybrid_edge_cases_and_errors() -> None:
    hybrid = HybridSource([ListSource("s1", ["a"]), ListSource("s2", ["b"])])
    assert hybrid.search([], k=5) == []
    assert hybrid.search(["q"], k=0) == [[]]
    with pytest.raises(ValueError, match="non-negative"):
        hybrid.search(["q"], k=-1)
    hybrid.close()
    failing = HybridSource([ListSource("s1", ["a"]), BrokenSource()])
    with pytest.raises(SourceError, match="server down"):
        failing.search(["q"], k=3)
    failing.close()
    with pytest.raises(ValueError, match="at least two"):
        HybridSource([ListSource("s1", ["a"])])
    with pytest.raises(ValueError, match="weights"):
        HybridSource([ListSource("s1", ["a"]), ListSource("s2", ["b"])], weights=[1.0])
    with pytest.raises(ValueError, match="depth"):
        HybridSource([ListSource("s1", ["a"]), ListSource("s2", ["b"])], depth=0)
