"""The one interface every search source implements: a batch of queries in, ranked passages out.

Sources are synchronous and batched on purpose: the environment (and the vector environment)
collects every pending query for a source and sends them in one call, and the NL-DAG executor runs
sources on worker threads to overlap independent nodes.
"""
from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Passage:
    """One retrieved passage. ``score`` is the source's own relevance score (higher is better)."""

    id: str
    title: str
    text: str
    score: float = 0.0


class SourceError(RuntimeError):
    """A source failed to answer (server down, timeout, bad response). The environment turns it into
    an error observation for that query or DAG node; it never escapes ``env.step``."""


def checked_results(results: object, n_queries: int, source_name: str) -> list[list[Passage]]:
    """``results`` of a plug-in's ``search`` for ``n_queries`` queries, checked at the boundary: one
    list of :class:`Passage` per query. Anything else raises :class:`SourceError` naming the source,
    which the environment turns into an error observation, so a buggy source cannot crash a step."""
    if not isinstance(results, Sequence) or isinstance(results, (str, bytes)):
        raise SourceError(f"source {source_name!r} returned {type(results).__name__}, not one result list per query")
    if len(results) != n_queries:
        raise SourceError(f"source {source_name!r} returned {len(results)} result lists for {n_queries} queries")
    checked = []
    for position, passages in enumerate(results):
        if not isinstance(passages, Sequence) or isinstance(passages, (str, bytes)):
            raise SourceError(f"source {source_name!r} returned {type(passages).__name__} for query {position}, not a list of Passage")
        for passage in passages:
            if not isinstance(passage, Passage):
                raise SourceError(f"source {source_name!r} returned a {type(passage).__name__} for query {position}, not a Passage")
        checked.append(list(passages))
    return checked


class Source(abc.ABC):
    """A named search source that answers a batch of queries with ranked passages."""

    name: str = "source"

    @property
    def fork_safe(self) -> bool:
        """Whether a forked copy of this source can search (:class:`~search_env.worker.EnvWorker` forks the
        environment). False for a source that runs a PyTorch model in-process: PyTorch's thread pool
        cannot be used from a forked process's threads."""
        return True

    @abc.abstractmethod
    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Return, for each query, at most ``k`` passages, best first.

        Implementations may raise :class:`SourceError` (or any exception); callers in the
        environment convert failures into error observations.
        """

    def close(self) -> None:
        """Release resources (connections, thread pools). Default: nothing to release."""
