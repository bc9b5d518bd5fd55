"""The one interface every search source implements: a batch of queries in, ranked passages out.

Sources are synchronous and batched on purpose: the environment (and the vector environment)
collects every pending query for a source and sends them in one call, and the NL-DAG executor runs
sources on worker threads to overlap independent nodes.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Sequence


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


class Source(abc.ABC):
    """A named search source that answers a batch of queries with ranked passages."""

    name: str = "source"

    @abc.abstractmethod
    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Return, for each query, at most ``k`` passages, best first.

        Implementations may raise :class:`SourceError` (or any exception); callers in the
        environment convert failures into error observations.
        """

    def close(self) -> None:
        """Release resources (connections, thread pools). Default: nothing to release."""
