"""Critical-path execution of an NL-DAG plan over several named sources.

Scheduling. A node starts as soon as all its parents have finished (not level by level), so the
wall time is the plan's critical path, not the sum of its latencies. Nodes that become ready at the
same moment and resolve to the same source go out as one batch: one ``Source.search(queries, k)``
call. Batches run on worker threads (sources are synchronous), so independent nodes overlap. The
calling thread only schedules: it waits for the first batch to finish, releases the children of the
nodes it answered, and launches the next batches.

Threads. By default every run shares one module-level thread pool (created on first use, never per
call); pass ``executor=`` to use your own. ``max_concurrency`` caps the batches one run has in
flight; batches beyond it wait in a queue (and absorb later nodes for the same source). Sources must
accept concurrent calls, since two batches for one source may overlap.

Errors are reported in place, never raised: a source that raises, an unknown or missing source, an
empty query, results that are not one list of passages per query (checked by
:func:`~search_env.sources.base.checked_results`), or a timeout (``timeout_s``, counted from the batch's
submission) give the node an ``error`` and no passages. A timed-out call cannot be interrupted: its
worker thread runs on and its late answer is ignored, so sources should carry their own time limits.
**Children of a failed node still run**: the failed parent simply provides no value for its
placeholder (see below); a node is only skipped (an error, no search call) when removing such
placeholders leaves its query empty.

Substitution. A query may mention an ancestor's result as ``{A}`` (the label, any case). With
``substitute=True`` the placeholder is replaced by the title of the ancestor's top passage; with a
callable, by ``substitute(ancestor_run)`` (e.g. an answer extracted by an LLM from the ancestor's
passages; it runs on the scheduling thread, once per ancestor, and an exception from it propagates);
with ``False`` nothing is replaced. When an ancestor failed, found nothing, or the callable returned
None, its placeholder is removed. Placeholders naming a label that is not an ancestor are left as
written (the ancestor is the only node sure to be finished).

Order. Results are listed in plan order, whatever the timing: by topological generation (roots
first, then the nodes whose parents are all in earlier generations, and so on), then by label. The
same plan therefore always gives the same result block, so the same seed and the same ids give the
same episode however the sources' latencies fall. Times are seconds since the run began
(``time.perf_counter``), for the trajectory record.

The run's result types, the source table and the scheduler stay in this one module: they are one
algorithm, and each is read with the others.
"""
from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from search_env.dag.parser import Plan, PlanNode
from search_env.dag.validate import normalize_source_name
from search_env.sources.base import Passage, Source, SourceError, checked_results

__all__ = [
    "DEFAULT_POOL_WORKERS",
    "DagRun",
    "InvalidPlanError",
    "NodeRun",
    "SourceTable",
    "Substitute",
    "execute_plan",
    "format_dag_results",
]

DEFAULT_POOL_WORKERS = 32
"""Threads of the shared pool: sources mostly wait on I/O or sleep, so more threads than cores."""

_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z][0-9]{0,3})\}")

_shared_pool: ThreadPoolExecutor | None = None
_shared_pool_lock = threading.Lock()


class InvalidPlanError(ValueError):
    """The plan's graph cannot be scheduled (edge to an undeclared node, self-loop or cycle).
    Validate plans with :func:`~search_env.dag.validate.validate_plan` before executing them."""


@dataclass(frozen=True, slots=True)
class NodeRun:
    """What happened to one node: the ``query`` actually sent (after substitution), its
    ``passages`` (at most k, best first) or its ``error``, the ``start``/``end`` of its search call
    in seconds since the run began, the ``batch`` (index of the search call that served it, None if
    no call was made), the ``substitutions`` made into its query (label -> value, None when the
    placeholder was removed) and whether the query was cut to ``max_query_chars`` (``query_cut``)."""

    label: str
    source: str | None
    query: str
    passages: tuple[Passage, ...]
    error: str | None
    start: float
    end: float
    batch: int | None
    substitutions: Mapping[str, str | None] = field(default_factory=dict)
    query_cut: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record of the node for the trajectory (passages by id: their text is in the
        result block)."""
        return {
            "label": self.label,
            "source": self.source,
            "query": self.query,
            "passage_ids": [passage.id for passage in self.passages],
            "error": self.error,
            "start": self.start,
            "end": self.end,
            "batch": self.batch,
            "substitutions": dict(self.substitutions),
            "query_cut": self.query_cut,
        }


@dataclass(frozen=True, slots=True)
class DagRun:
    """A finished run: ``nodes`` in plan order (topological generation, then label), the run's
    ``wall_s`` and the number of search ``calls`` made (fewer than nodes when batching merged some)."""

    nodes: list[NodeRun]
    wall_s: float
    calls: int

    def node(self, label: str) -> NodeRun:
        """The run of the node with this label (KeyError when the plan had no such node)."""
        for run in self.nodes:
            if run.label == label:
                return run
        raise KeyError(label)


Substitute = bool | Callable[[NodeRun], str | None]
"""How placeholders are filled: True (top passage title), False (left as written), or a callable
from the ancestor's :class:`NodeRun` to the text (None removes the placeholder)."""


class SourceTable:
    """Named sources with case-insensitive names and an alias map, e.g. sources
    ``{"wiki": ..., "papers": ...}`` with aliases ``{"general": "wiki", "academy": "papers"}``.
    Aliases point at source names (one level); one that points nowhere is a configuration error
    (ValueError)."""

    def __init__(self, sources: Mapping[str, Source], aliases: Mapping[str, str] | None = None) -> None:
        self._sources = {normalize_source_name(name): source for name, source in sources.items()}
        self._aliases: dict[str, str] = {}
        for alias, target in (aliases or {}).items():
            key = normalize_source_name(target)
            if key not in self._sources:
                known = ", ".join(sorted(self._sources)) or "none"
                raise ValueError(f"alias {alias!r} points at {target!r}, which is not a source (sources: {known})")
            self._aliases[normalize_source_name(alias)] = key

    def names(self) -> frozenset[str]:
        """Every name a plan may use: source names and aliases (normalised); pass it to
        :func:`~search_env.dag.validate.validate_plan` as ``known_sources``."""
        return frozenset(self._sources) | frozenset(self._aliases)

    def listing(self) -> str:
        """The known names as one sorted, comma-separated string, for error messages."""
        return ", ".join(sorted(self.names())) or "none"

    def resolve(self, name: str) -> tuple[str, Source] | None:
        """The canonical source name and source for ``name`` (an alias or a name), or None."""
        key = normalize_source_name(name)
        key = self._aliases.get(key, key)
        source = self._sources.get(key)
        return None if source is None else (key, source)


def execute_plan(
    plan: Plan,
    sources: Mapping[str, Source] | SourceTable,
    *,
    aliases: Mapping[str, str] | None = None,
    k: int = 3,
    substitute: Substitute = True,
    timeout_s: float | None = None,
    max_concurrency: int | None = None,
    executor: Executor | None = None,
    max_query_chars: int | None = None,
) -> DagRun:
    """Run every node of ``plan`` on its source, each as soon as its parents are done.

    ``sources`` maps names to sources (with ``aliases``), or is a ready :class:`SourceTable`.
    Raises :class:`InvalidPlanError` only for a graph that cannot be scheduled; every per-node
    failure is reported in its :class:`NodeRun` (see the module docstring for the rules).
    ``max_query_chars`` cuts each query, once its placeholders are filled, to that many characters
    (the environment's limit for single queries too) and marks the node ``query_cut``.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
    if max_query_chars is not None and max_query_chars < 1:
        raise ValueError(f"max_query_chars must be at least 1, got {max_query_chars}")
    if isinstance(sources, SourceTable):
        if aliases is not None:
            raise ValueError("give aliases to the SourceTable, not to execute_plan, when passing a SourceTable")
        table = sources
    else:
        table = SourceTable(sources, aliases)
    graph = _graph(plan)
    run = _Run(plan, graph, table, k, substitute, timeout_s, max_concurrency, executor or _default_pool(), max_query_chars)
    return run.execute()


def format_dag_results(run: DagRun, doc_formatter: Callable[[Sequence[Passage]], str]) -> str:
    """The result block of a run: one section per node in plan order, headed
    ``{label} ({source}): {query sent}``, then ``doc_formatter(passages)`` (the protocol's document
    format; trailing newlines trimmed), ``No results.`` when it found nothing, or ``Error: ...``.
    Sections are separated by a blank line."""
    sections = []
    for node in run.nodes:
        header = f"{node.label} ({node.source if node.source is not None else 'no source'}): {node.query}"
        if node.error is not None:
            body = f"Error: {node.error}"
        else:
            body = doc_formatter(node.passages).rstrip("\n") if node.passages else ""
            body = body or "No results."
        sections.append(f"{header}\n{body}")
    return "\n\n".join(sections)


def _forget_shared_pool() -> None:
    """In a forked child the parent's pool threads do not exist: start a new pool on first use."""
    global _shared_pool, _shared_pool_lock
    _shared_pool, _shared_pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_shared_pool)


def _default_pool() -> ThreadPoolExecutor:
    global _shared_pool
    with _shared_pool_lock:
        if _shared_pool is None:
            _shared_pool = ThreadPoolExecutor(max_workers=DEFAULT_POOL_WORKERS, thread_name_prefix="dag-source")
        return _shared_pool


def _graph(plan: Plan) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(plan.nodes)
    for parent, child in plan.edges:
        if parent not in plan.nodes or child not in plan.nodes:
            raise InvalidPlanError(f"edge {parent} -> {child} names an undeclared node")
        if parent == child:
            raise InvalidPlanError(f"self-loop {parent} -> {child}")
        graph.add_edge(parent, child)
    if not nx.is_directed_acyclic_graph(graph):
        raise InvalidPlanError(f"the plan has a cycle: {nx.find_cycle(graph)}")
    return graph


@dataclass(eq=False)
class _Batch:
    """One search call: the nodes it answers, their queries, and its timings (set by the worker)."""

    index: int
    name: str  # the canonical source name the batch's nodes resolved to
    source: Source
    labels: list[str] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    substitutions: list[dict[str, str | None]] = field(default_factory=list)
    cut: list[bool] = field(default_factory=list)
    submitted: float = 0.0
    started: float | None = None
    ended: float | None = None

    def call(self, k: int) -> list[list[Passage]]:
        self.started = time.perf_counter()
        try:
            return self.source.search(list(self.queries), k)
        finally:
            self.ended = time.perf_counter()


class _Run:
    """The scheduling state of one execution (lives on the calling thread only)."""

    def __init__(
        self,
        plan: Plan,
        graph: nx.DiGraph,
        table: SourceTable,
        k: int,
        substitute: Substitute,
        timeout_s: float | None,
        max_concurrency: int | None,
        pool: Executor,
        max_query_chars: int | None,
    ) -> None:
        self.plan, self.graph, self.table, self.k = plan, graph, table, k
        self.substitute, self.timeout_s, self.pool = substitute, timeout_s, pool
        self.max_concurrency, self.max_query_chars = max_concurrency, max_query_chars
        self.waiting = {label: graph.in_degree(label) for label in plan.nodes}
        self.ready = [label for label, count in self.waiting.items() if count == 0]
        self.queued: dict[str, _Batch] = {}  # canonical source name -> batch not yet submitted
        self.in_flight: dict[Future, _Batch] = {}
        self.finished: dict[str, NodeRun] = {}
        self.values: dict[str, str | None] = {}  # label -> substitution value, computed once
        self.calls = 0
        self.t0 = time.perf_counter()

    def execute(self) -> DagRun:
        while True:
            self._dispatch_ready()
            self._submit_queued()
            if not self.in_flight:
                break
            self._collect()
        generations = enumerate(nx.topological_generations(self.graph))
        rank = {label: depth for depth, generation in generations for label in generation}
        order = sorted(self.finished.values(), key=lambda run: (rank[run.label], run.label))
        return DagRun(nodes=order, wall_s=time.perf_counter() - self.t0, calls=self.calls)

    def _now(self) -> float:
        return time.perf_counter() - self.t0

    def _dispatch_ready(self) -> None:
        """Turn ready nodes into queued batches (one per source); nodes that need no call finish now
        and may make more nodes ready, hence the loop."""
        while self.ready:
            ready, self.ready = sorted(self.ready), []
            for label in ready:
                node = self.plan.nodes[label]
                query, substitutions = self._query(node)
                resolved = self.table.resolve(node.source) if node.source is not None else None
                if node.source is None:
                    self._finish_without_call(node, query, substitutions, "the node names no source")
                elif resolved is None:
                    error = f"unknown source {node.source!r}; known sources: {self.table.listing()}"
                    self._finish_without_call(node, query, substitutions, error)
                elif not query:
                    error = "empty query" if not node.query else "query empty once failed parents' placeholders were removed"
                    self._finish_without_call(node, query, substitutions, error)
                else:
                    key, source = resolved
                    cut = self.max_query_chars is not None and len(query) > self.max_query_chars
                    if cut:
                        query = query[: self.max_query_chars]
                    batch = self.queued.get(key)
                    if batch is None:
                        batch = self.queued[key] = _Batch(index=-1, name=key, source=source)
                    batch.labels.append(label)
                    batch.queries.append(query)
                    batch.substitutions.append(substitutions)
                    batch.cut.append(cut)

    def _submit_queued(self) -> None:
        while self.queued and (self.max_concurrency is None or len(self.in_flight) < self.max_concurrency):
            key = next(iter(self.queued))
            batch = self.queued.pop(key)
            batch.index = self.calls
            self.calls += 1
            batch.submitted = time.perf_counter()
            self.in_flight[self.pool.submit(batch.call, self.k)] = batch

    def _collect(self) -> None:
        """Wait for the first batch to end (or the nearest deadline), then record what ended."""
        timeout = None
        if self.timeout_s is not None:
            nearest = min(batch.submitted for batch in self.in_flight.values()) + self.timeout_s
            timeout = max(0.0, nearest - time.perf_counter())
        done, _ = wait(list(self.in_flight), timeout=timeout, return_when=FIRST_COMPLETED)
        for future in done:
            batch = self.in_flight.pop(future)
            self._record(batch, future)
        if self.timeout_s is not None:
            now = time.perf_counter()
            for future, batch in list(self.in_flight.items()):
                if now - batch.submitted < self.timeout_s:
                    continue
                del self.in_flight[future]
                if future.done():  # ended between the wait and this check
                    self._record(batch, future)
                else:
                    future.cancel()  # frees the worker only if the call had not started
                    self._finish_batch(batch, [], f"timed out after {self.timeout_s:g} s", end=now)

    def _record(self, batch: _Batch, future: Future) -> None:
        error = future.exception()
        if error is not None:
            self._finish_batch(batch, [], f"{type(error).__name__}: {error}")
            return
        try:
            results = checked_results(future.result(), len(batch.queries), batch.name)
        except SourceError as error:
            self._finish_batch(batch, [], str(error))
            return
        self._finish_batch(batch, [tuple(passages[: self.k]) for passages in results], None)

    def _finish_batch(
        self, batch: _Batch, results: list[tuple[Passage, ...]], error: str | None, end: float | None = None
    ) -> None:
        if end is None:
            end = batch.ended if batch.ended is not None else time.perf_counter()
        start_abs = batch.started if batch.started is not None else batch.submitted
        for position, label in enumerate(batch.labels):
            node = self.plan.nodes[label]
            self._finish(
                NodeRun(
                    label=label,
                    source=node.source,
                    query=batch.queries[position],
                    passages=results[position] if error is None else (),
                    error=error,
                    start=start_abs - self.t0,
                    end=end - self.t0,
                    batch=batch.index,
                    substitutions=batch.substitutions[position],
                    query_cut=batch.cut[position],
                )
            )

    def _finish_without_call(
        self, node: PlanNode, query: str, substitutions: dict[str, str | None], error: str
    ) -> None:
        now = self._now()
        self._finish(
            NodeRun(
                label=node.label,
                source=node.source,
                query=query,
                passages=(),
                error=error,
                start=now,
                end=now,
                batch=None,
                substitutions=substitutions,
            )
        )

    def _finish(self, run: NodeRun) -> None:
        self.finished[run.label] = run
        for child in self.graph.successors(run.label):
            self.waiting[child] -= 1
            if self.waiting[child] == 0:
                self.ready.append(child)

    def _query(self, node: PlanNode) -> tuple[str, dict[str, str | None]]:
        """The node's query with its ancestors' placeholders filled (or removed), and what was used."""
        if self.substitute is False or "{" not in node.query:
            return node.query, {}
        ancestors = nx.ancestors(self.graph, node.label)
        substitutions: dict[str, str | None] = {}

        def fill(match: re.Match[str]) -> str:
            label = match.group(1).upper()
            if label not in ancestors:
                return match.group(0)
            value = self._value(label)
            substitutions[label] = value
            return value if value is not None else ""

        query = " ".join(_PLACEHOLDER_RE.sub(fill, node.query).split())
        return query, substitutions

    def _value(self, label: str) -> str | None:
        if label not in self.values:
            parent = self.finished[label]
            if not parent.ok or not parent.passages:
                self.values[label] = None
            elif self.substitute is True:
                self.values[label] = parent.passages[0].title
            else:
                self.values[label] = self.substitute(parent)  # type: ignore[operator]
        return self.values[label]
