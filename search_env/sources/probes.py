"""Probe sources: wrappers that spoil retrieval for a seeded share of queries, so a benchmark can tell an
agent that uses what it finds from one that guesses.

:class:`ProbeSource` answers a share of the queries with something other than the wrapped source's results:

- ``"empty"``: no passages at all;
- ``"random"``: ``k`` passages drawn at random from a corpus;
- ``"shuffled"``: the wrapped source's own results for *another* query (the title of a corpus passage
  chosen for this query): real retrieval output, ranked and scored as usual, that belongs to a different
  question.

Which queries are probed, and what they get, is a function of ``(seed, query)`` alone (a keyed hash), not of
the batch a query arrives in or of the calls before it: an episode replayed with the same seed sees the
same passages, and two environments sharing a source agree. An agent whose reward does not fall as the
share rises is not using its searches::

    from search_env import BM25Source, ProbeSource
    from search_env.synthetic import generate_world

    wiki = generate_world(seed=0, n_questions=50).sources["wiki"]
    probed = ProbeSource(BM25Source(wiki), "random", share=0.5, corpus=wiki, seed=1)
    print(len(probed.search(["who founded the city?"], k=3)[0]))
"""
from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from search_env.sources.base import Passage, Source, checked_results

__all__ = ["PROBES", "ProbeSource"]

Probe = Literal["empty", "random", "shuffled"]

#: The probes :class:`ProbeSource` knows.
PROBES: tuple[str, ...] = ("empty", "random", "shuffled")


def _passages(corpus: Iterable[Passage | Mapping[str, Any]]) -> list[Passage]:
    """The corpus as passages: :class:`Passage` objects, or ``{id, title, text}`` dicts (a synthetic world's
    ``sources[...]`` or a corpus jsonl's rows)."""
    passages = []
    for row in corpus:
        if isinstance(row, Passage):
            passages.append(row)
        elif isinstance(row, Mapping) and "id" in row and "text" in row:
            passages.append(Passage(id=str(row["id"]), title=str(row.get("title", "")), text=str(row["text"])))
        else:
            raise ValueError(f"a corpus passage must be a Passage or an {{id, title, text}} dict, got {type(row).__name__}")
    return passages


class ProbeSource(Source):
    """Answers a seeded share of queries with a probe (``"empty"``, ``"random"`` or ``"shuffled"``) instead
    of ``source``'s results; the other queries get ``source``'s results unchanged.

    Args:
        source: the source to wrap; its ``name`` is kept, so the wrapper replaces it in ``sources=``.
        probe: what a probed query gets (module docstring).
        share: the fraction of distinct queries probed, in [0, 1]: 0 is ``source`` exactly, 1 probes every
            query.
        corpus: passages (or ``{id, title, text}`` dicts) that ``"random"`` draws from and ``"shuffled"``
            takes its other queries' titles from; required by both, unused by ``"empty"``.
        seed: with the query, decides which queries are probed and what they get.

    Attributes:
        probed: how many queries were probed since the source was made (over all calls).
    """

    def __init__(self, source: Source, probe: Probe, *, share: float, corpus: Iterable[Passage | Mapping[str, Any]] | None = None,
                 seed: int = 0) -> None:
        if probe not in PROBES:
            raise ValueError(f"probe must be one of {', '.join(PROBES)}, got {probe!r}")
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share must be in [0, 1], got {share}")
        passages = _passages(corpus) if corpus is not None else []
        if probe != "empty" and not passages:
            raise ValueError(f"the {probe!r} probe needs a non-empty corpus")
        self.source = source
        self.name = source.name
        self.probe = probe
        self.share = share
        self.seed = seed
        self.probed = 0
        self._corpus = passages
        self._count_lock = threading.Lock()  # the NL-DAG executor searches from several threads

    @property
    def fork_safe(self) -> bool:
        return self.source.fork_safe

    def _draw(self, query: str) -> tuple[float, np.random.Generator]:
        """A uniform number in [0, 1) that decides whether ``query`` is probed, and a generator for what it
        gets, both from a hash of ``(seed, query)`` (stable across processes, unlike ``hash()``)."""
        digest = hashlib.blake2b(f"{self.seed}\x00{query}".encode(), digest_size=16).digest()
        uniform = int.from_bytes(digest[:8], "big") / 2.0**64
        return uniform, np.random.default_rng(int.from_bytes(digest[8:], "big"))

    def is_probed(self, query: str) -> bool:
        """Whether ``query`` gets the probe (a function of the seed and the query alone)."""
        return self._draw(query)[0] < self.share

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """The wrapped source's results, with each probed query's replaced by its probe; the wrapped source
        is asked once, for the queries it answers and the shuffled probes' other queries together."""
        if isinstance(queries, str):
            raise TypeError("search() takes a sequence of queries, not a single string")
        results: list[list[Passage] | None] = []
        probed = 0
        asked: list[str] = []  # in the order of the positions whose results are None
        for query in queries:
            uniform, rng = self._draw(query)
            if uniform >= self.share:
                asked.append(query)
                results.append(None)
                continue
            probed += 1
            if self.probe == "empty":
                results.append([])
            elif self.probe == "random":
                picks = rng.choice(len(self._corpus), size=min(k, len(self._corpus)), replace=False)
                results.append([self._corpus[int(i)] for i in picks])
            else:  # shuffled: another query's results
                other = self._corpus[int(rng.integers(len(self._corpus)))]
                asked.append(other.title or other.text)
                results.append(None)
        with self._count_lock:
            self.probed += probed
        answers = iter(checked_results(self.source.search(asked, k), len(asked), self.name) if asked else [])
        return [next(answers) if r is None else r for r in results]

    def close(self) -> None:
        """Close the wrapped source."""
        self.source.close()
