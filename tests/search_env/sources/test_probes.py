"""ProbeSource: share 0 is the wrapped source exactly, share 1 probes every query, a share of 0.5 probes
about half, and each query's treatment depends on (seed, query) only."""
from __future__ import annotations

from collections.abc import Sequence

import pytest

from search_env.sources.base import Passage, Source
from search_env.sources.probes import PROBES, ProbeSource

CORPUS = [{"id": f"c{i}", "title": f"title {i}", "text": f"text {i}"} for i in range(20)]
QUERIES = [f"question {i}" for i in range(400)]


class EchoSource(Source):
    """Answers each query with k passages naming it; records the queries it was asked."""

    name = "echo"

    def __init__(self) -> None:
        self.asked: list[list[str]] = []
        self.closed = False

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        self.asked.append(list(queries))
        return [[Passage(id=f"{q}#{i}", title=q, text=f"about {q}", score=float(k - i)) for i in range(k)] for q in queries]

    def close(self) -> None:
        self.closed = True


def _echo(query: str, k: int) -> list[Passage]:
    return EchoSource().search([query], k)[0]


@pytest.mark.parametrize("probe", PROBES)
def test_share_zero_is_the_wrapped_source_exactly(probe: str) -> None:
    inner = EchoSource()
    probed = ProbeSource(inner, probe, share=0.0, corpus=CORPUS, seed=3)
    assert probed.search(QUERIES[:50], 3) == inner.search(QUERIES[:50], 3)
    assert inner.asked[0] == QUERIES[:50] and probed.probed == 0 and probed.name == "echo"


def test_share_one_always_gives_the_probe() -> None:
    empty = ProbeSource(EchoSource(), "empty", share=1.0, seed=0)
    assert empty.search(QUERIES[:30], 3) == [[]] * 30 and empty.probed == 30

    corpus_ids = {row["id"] for row in CORPUS}
    random = ProbeSource(EchoSource(), "random", share=1.0, corpus=CORPUS, seed=0)
    for passages in random.search(QUERIES[:30], 3):
        ids = [p.id for p in passages]
        assert len(ids) == 3 == len(set(ids)) and set(ids) <= corpus_ids  # three distinct corpus passages

    inner = EchoSource()
    shuffled = ProbeSource(inner, "shuffled", share=1.0, corpus=CORPUS, seed=0)
    results = shuffled.search(QUERIES[:30], 2)
    titles = {row["title"] for row in CORPUS}
    assert inner.asked[0] and set(inner.asked[0]) <= titles  # asked other queries, never the agent's
    for query, passages in zip(QUERIES[:30], results):
        assert passages == _echo(passages[0].title, 2) and passages[0].title != query


def test_half_the_queries_are_probed_at_a_share_of_a_half() -> None:
    inner = EchoSource()
    probed = ProbeSource(inner, "empty", share=0.5, seed=11)
    results = probed.search(QUERIES, 2)
    hits = sum(r == [] for r in results)
    # 400 fair coins: sd 10, so 200 +- 40 is four standard deviations
    assert 160 <= hits <= 240 and probed.probed == hits
    # the queries not probed got the wrapped source's own results, and only they were asked
    assert [q for q, r in zip(QUERIES, results) if r] == inner.asked[0]
    assert all(r == _echo(q, 2) for q, r in zip(QUERIES, results) if r)


def test_a_query_s_treatment_depends_on_seed_and_query_only() -> None:
    first = ProbeSource(EchoSource(), "random", share=0.5, corpus=CORPUS, seed=5)
    again = ProbeSource(EchoSource(), "random", share=0.5, corpus=CORPUS, seed=5)
    together = first.search(QUERIES[:60], 3)
    # one at a time, in reverse order, in another source with the same seed: the same passages per query
    alone = [again.search([q], 3)[0] for q in reversed(QUERIES[:60])][::-1]
    assert together == alone
    other_seed = ProbeSource(EchoSource(), "random", share=0.5, corpus=CORPUS, seed=6)
    assert [other_seed.is_probed(q) for q in QUERIES[:60]] != [first.is_probed(q) for q in QUERIES[:60]]


def test_bad_settings_are_refused_in_one_line_and_close_reaches_the_wrapped_source() -> None:
    with pytest.raises(ValueError, match="share must be in"):
        ProbeSource(EchoSource(), "empty", share=1.5)
    with pytest.raises(ValueError, match="probe must be one of"):
        ProbeSource(EchoSource(), "noise", share=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs a non-empty corpus"):
        ProbeSource(EchoSource(), "random", share=0.5)
    inner = EchoSource()
    ProbeSource(inner, "empty", share=0.5).close()
    assert inner.closed


def test_the_package_exports_it() -> None:
    import search_env
    from search_env import sources

    assert search_env.ProbeSource is sources.ProbeSource is ProbeSource
