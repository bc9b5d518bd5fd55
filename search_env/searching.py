"""Search requests, and the one piece that answers them: :class:`Searcher`.

A step that closes a search call hands out a request (:class:`SearchRequest` for a single query,
:class:`PlanRequest` for an NL-DAG plan) and goes on once the request's results are in. Whoever steps
the episode answers the request with a :class:`Searcher`: :meth:`SearchQAEnv.step
<search_env.env.SearchQAEnv.step>` one request at a time, :class:`~search_env.vector.BatchSearchQAEnv`
a round of every episode's requests, so that each source gets one batch of everyone's queries.
"""
from __future__ import annotations

from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Hashable, Mapping, TypeVar, Union

from search_env._fork import forget_threads_after_fork
from search_env.sources.base import Passage, Source, checked_results

__all__ = ["SearchRequest", "PlanRequest", "Request", "Searcher", "MAX_QUERY_CHARS"]

MAX_QUERY_CHARS = 1000  #: longer queries (single queries and DAG nodes) are cut, and counted, before a source sees them

K = TypeVar("K", bound=Hashable)


@dataclass
class SearchRequest:
    """One query for one source, handed out by a step that closed a call. Its results: the list of
    passages (at most ``k``), or the exception the source raised."""

    source: str
    query: str
    k: int


@dataclass
class PlanRequest:
    """An NL-DAG plan to execute over the environment's sources, handed out by a ``dag`` protocol call.
    Its results: the :class:`~search_env.dag.DagRun`, or the exception that stopped it."""

    plan: Any
    k: int


Request = Union[SearchRequest, PlanRequest]


class Searcher:
    """Answers search requests on named sources (and the aliases NL-DAG plans may use for them).

    Failures are returned, never raised: a source that fails, or answers with anything but one list
    of passages per query, gives each of its requests the exception (naming the source), and an
    exception that stops a plan is that plan's answer. The environment turns them into error
    observations.
    """

    def __init__(self, sources: Mapping[str, Source], aliases: Mapping[str, str]) -> None:
        self.sources = sources
        self.aliases = aliases
        self._pool: ThreadPoolExecutor | None = None

    def answer(self, pending: Mapping[K, Request]) -> dict[K, list[Passage] | Any | BaseException]:
        """Answer a round of requests (keyed by whatever the caller tracks them by). Each source gets
        one ``search`` call with every distinct query of the round once (a group's samples often ask
        the same query), at the largest ``k`` asked, each answer cut to its request's ``k``. Plans run
        on worker threads beside the searches when the round holds anything else; a lone plan runs on
        the calling thread."""
        if len(pending) == 1:  # one episode's step: nothing to group
            ((key, request),) = pending.items()
            if isinstance(request, SearchRequest):
                return {key: self.search(request.source, [request.query], request.k)[0]}
        answers: dict[K, Any] = {}
        by_source: dict[str, list[tuple[K, SearchRequest]]] = defaultdict(list)
        plans: dict[K, PlanRequest] = {}
        for key, request in pending.items():
            if isinstance(request, SearchRequest):
                by_source[request.source].append((key, request))
            elif isinstance(request, PlanRequest):
                plans[key] = request
            else:
                raise TypeError(f"unknown request {request!r}")
        futures: dict[K, Future] = {}
        if len(plans) == 1 and not by_source:
            ((key, plan),) = plans.items()
            answers[key] = self.run_plan(plan)
        elif plans:
            pool = self._plan_pool()
            futures = {key: pool.submit(self.run_plan, plan) for key, plan in plans.items()}
        for name, members in by_source.items():
            queries = list(dict.fromkeys(request.query for _, request in members))
            found = dict(zip(queries, self.search(name, queries, max(request.k for _, request in members))))
            for key, request in members:
                result = found[request.query]
                answers[key] = result if isinstance(result, BaseException) else result[: request.k]
        for key, future in futures.items():
            answers[key] = future.result()
        return answers

    def search(self, source: str, queries: list[str], k: int) -> list[list[Passage] | BaseException]:
        """Run queries on one source, at most ``k`` passages each. A failure, or results that are not one
        list of passages per query, becomes an exception object for each query, naming the source."""
        try:
            results = checked_results(self.sources[source].search(queries, k), len(queries), source)
        except Exception as exc:  # noqa: BLE001 - a source failure is an observation, never a crash
            return [exc] * len(queries)
        return [r[:k] for r in results]

    def run_plan(self, request: PlanRequest) -> Any:
        """Execute an NL-DAG plan over the sources: its :class:`~search_env.dag.DagRun`, or the
        exception that stopped it."""
        from search_env.dag import execute_plan

        try:
            return execute_plan(
                request.plan, self.sources, k=request.k, aliases=self.aliases, max_query_chars=MAX_QUERY_CHARS
            )
        except Exception as exc:  # noqa: BLE001 - an observation, never a crash
            return exc

    def close(self) -> None:
        """Stop the plan threads and close every distinct source."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for source in {id(s): s for s in self.sources.values()}.values():
            source.close()

    def _plan_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="searchqa-plans")
            forget_threads_after_fork(self, _drop_pool)
        return self._pool


def _drop_pool(searcher: Searcher) -> None:
    """In a forked child the pool's threads do not exist: start a new pool on first use."""
    searcher._pool = None
