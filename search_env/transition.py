"""The POMDP's transition: how the agent's tokens change an episode.

Each agent token is appended to the episode's record (:class:`~search_env.episode.EpisodeBuffer`).
When its bytes complete one of the protocol's close tags, the turn's text is read:

- an answer's close tag records the answer (the episode's first one counts) and ends the episode,
  unless the protocol runs on to the end-of-sequence token (ReSearch);
- a call's close tag is checked (an open tag in the same turn, not inside an answer, a search left in
  the turn budget), its content read as a query or an NL-DAG plan, and a request is yielded; the
  results that come back are formatted as the protocol says and appended as environment tokens;
- anything malformed (a close tag without its open tag, an empty query, an invalid plan, a failed
  search) is appended as an error observation and counted, never raised.

An end-of-sequence token ends the episode, except under a ``"tools"`` dialect when the turn it ends holds
tool calls: those are read, run together and answered with one tool turn (:mod:`search_env.tool_calls`).
The token and context budgets truncate an episode. NL-DAG plans:
the environment runs any plan that :func:`~search_env.dag.validate.validate_plan` accepts (at most 8
nodes, every node's source one of the environment's sources or aliases, edges between declared nodes,
acyclic) and answers any other with an error observation listing the violations.
"""
from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from typing import Any, Collection, Generator, Sequence

from search_env.episode import EpisodeBuffer
from search_env.protocols import Dialect
from search_env.scanner import TagScanner
from search_env.searching import MAX_QUERY_CHARS, PlanRequest, Request, SearchRequest
from search_env.sources.base import Passage
from search_env.tokenization import TokenCodec
from search_env.tool_calls import MAX_CALLS_PER_TURN, ParsedCall
from search_env.trajectory import Span, ToolCall

__all__ = ["Transition"]

_LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # the nodes of the plan that runs one turn's tool calls

#: What the transition yields (search requests), what it is sent back (their results), and what it returns.
Stepping = Generator[Request, Any, int]
#: One closed search call's transition: it yields the call's request and is sent its results.
Call = Generator[Request, Any, None]


class Transition:
    """The transition rules of one environment (see the module docstring), with its settings.

    Args:
        protocol / codec: the tag dialect and the tokenizer (environment text is encoded with it).
        max_new_tokens / max_context: the agent-token and total-token budgets.
        max_turns: searches per episode (None: unlimited).
        top_k: passages per query.
        default_source: the source single queries go to.
        plan_sources: the source names and aliases an NL-DAG plan may use.
        max_result_tokens: cap on the document tokens of one result block (None: no cap).
    """

    def __init__(
        self,
        protocol: Dialect,
        codec: TokenCodec,
        *,
        max_new_tokens: int,
        max_context: int,
        max_turns: int | None,
        top_k: int,
        default_source: str,
        plan_sources: Collection[str],
        max_result_tokens: int | None,
    ) -> None:
        self.protocol, self.codec = protocol, codec
        # A "tools" dialect's calls run at the turn's EOS token: only its answer's close tag is watched.
        self._tools = protocol.tool_calling if protocol.call_kind == "tools" else None
        tags = (protocol.answer_close,) if self._tools is not None else (protocol.call_close, protocol.answer_close)
        self.scanner = TagScanner(codec, tags)
        self._answer_tag = len(tags) - 1
        self.token_bytes = codec.token_bytes
        self.max_new_tokens, self.max_context, self.max_turns = max_new_tokens, max_context, max_turns
        self.top_k, self.default_source, self.plan_sources = top_k, default_source, set(plan_sources)
        self.max_result_tokens = max_result_tokens
        # The tags the transition looks for in the episode's bytes, encoded once.
        self._call_open, self._answer_open = protocol.call_open.encode(), protocol.answer_open.encode()
        self._answer_close, self._call_close = protocol.answer_close.encode(), protocol.call_close.encode()

    def advance(self, ep: EpisodeBuffer, ids: Sequence[int], i: int = 0) -> tuple[int, Call | None]:
        """Take ``ids`` from ``i`` on until they run out, the episode ends or a search call closes. Returns
        the index after the last id taken, and the closed call's transition (None when no call closed),
        which :meth:`with_calls` runs with the rest of the ids.

        A chunk gives exactly the episode its ids give one at a time. The ids the budgets leave room for
        are appended as one run. When one of them may need attention (one set test tells), the run's
        first event is found at once: the earliest watched tag that ends in its bytes
        (:meth:`TagScanner.first_tag`, a ``bytes.find`` per tag) or its first EOS id; the ids after the
        event's token are taken back off, and taken again once the event is handled. So a chunk, an
        answer turn above all, pays a fixed cost of a few calls rather than one per id, and a step
        without a search call runs as plain calls: no generator is made, resumed and stopped for it."""
        n = len(ids)
        scanner, token_bytes = self.scanner, self.token_bytes
        max_new, max_context = self.max_new_tokens, self.max_context
        while i < n and ep.end_reason is None:
            stop = i + max_new - ep.n_new  # where the first budget to run out ends the run
            context_stop = i + max_context - len(ep.ids)
            if context_stop < stop:
                stop = context_stop
            if stop > n:
                stop = n
            run = ids if i == 0 and stop == n else ids[i:stop]  # only read: a whole chunk needs no copy
            if scanner.attention_ids.isdisjoint(run):
                ep.append_agent(run, token_bytes)
                i = stop
            else:
                first, after = len(ep.ids), len(ep.text)
                eos = None
                if not scanner.eos_ids.isdisjoint(run):
                    eos = next(k for k, t in enumerate(run) if t in scanner.eos_ids)
                    run = run[: eos + 1]
                ep.append_agent(run, token_bytes)
                found = scanner.first_tag(ep.text, after, ep.turn_start)
                if found is not None:
                    tag, at, end = found
                    last = bisect_left(ep.ends, end, first)  # the token that completes the tag
                    if last + 1 < len(ep.ids):
                        ep.take_back(last + 1)
                    i += last + 1 - first
                    if tag != self._answer_tag:
                        return i, self._close_call(ep, at)
                    self._close_answer(ep, at, last)
                elif eos is not None:
                    if self._tools is not None and self._tools.find(ep.decode(ep.turn_start)) is not None:
                        return i + eos + 1, self._tool_turn(ep)
                    ep.end("eos", truncated=False)
                    return i + eos + 1, None
                else:
                    i += len(run)
            if ep.end_reason is None and (ep.n_new >= max_new or len(ep.ids) >= max_context):  # _check_budgets, inline
                ep.end("max_new_tokens" if ep.n_new >= max_new else "max_context", truncated=True)
        return i, None

    def with_calls(self, ep: EpisodeBuffer, ids: Sequence[int], i: int, call: Call | None) -> Stepping:
        """The rest of a step whose search call closed (``call``, from :meth:`advance`, with ``ids`` taken
        up to ``i``): a generator that yields each call's request, is sent its results, takes the ids
        after it (running each further call the same way) and returns how many ids were used."""
        while call is not None:
            yield from call
            self._check_budgets(ep)  # the call's close tag may have been the budget's last token
            i, call = self.advance(ep, ids, i)
        return i

    def _check_budgets(self, ep: EpisodeBuffer) -> None:
        """End the episode, truncated, when its last token used up the token or the context budget."""
        if ep.end_reason is None and (ep.n_new >= self.max_new_tokens or len(ep.ids) >= self.max_context):
            ep.end("max_new_tokens" if ep.n_new >= self.max_new_tokens else "max_context", truncated=True)

    def _close_answer(self, ep: EpisodeBuffer, at: int, last: int) -> None:
        """The answer's close tag starts at byte ``at`` and ends in token ``last``."""
        p = self.protocol
        opened = ep.text.rfind(self._answer_open, ep.turn_start, at)
        if opened == -1:
            ep.counters["invalid_calls"] += 1
            self._insert(ep, p.invalid_action_text or p.error_text(f"{p.answer_close} without {p.answer_open}"), "error", "invalid_answer")
            return
        # Offsets are bytes of the record (a tag's length is its encoded length, not its characters'): the
        # span is add_span("answer", opened, at + len(self._answer_close)), whose last token is ``last``.
        ep.trajectory.spans.append(Span("answer", bisect_right(ep.ends, opened), last + 1))
        if ep.answer_at is None:  # the first answer of the episode is the one recorded
            ep.answer_at = (opened + len(self._answer_open), at)
        if p.answer_ends_episode:
            ep.end("answer", truncated=False)
        else:
            ep.event("answer")

    def _close_call(self, ep: EpisodeBuffer, at: int) -> Call:
        p = self.protocol
        text, turn = ep.text, ep.turn_start
        if text.rfind(self._answer_open, turn, at) > text.rfind(self._answer_close, turn, at):
            ep.counters["calls_inside_answer"] += 1
            ep.event("call_inside_answer")
            return
        opened = text.rfind(self._call_open, turn, at)
        if opened == -1:
            ep.counters["invalid_calls"] += 1
            self._insert(ep, p.invalid_action_text or p.error_text(f"{p.call_close} without {p.call_open}"), "error", "invalid_call")
            return
        ep.add_span("call", opened, at + len(self._call_close))
        content = ep.decode(opened + len(self._call_open), at)
        if self.max_turns is not None and ep.n_searches >= self.max_turns:
            ep.counters["budget_exhausted_calls"] += 1
            self._insert(ep, p.error_text(f"Search budget of {self.max_turns} calls is used up; give the final answer."), "error", "search_budget")
            return
        if p.call_kind == "dag":
            yield from self._dag_call(ep, content)
            return
        query = p.clean_query(content)
        if not query:
            ep.counters["empty_queries"] += 1
            if p.empty_query_ends_episode:
                ep.event("empty_query")
                ep.end("empty_query", truncated=False)
            else:
                self._insert(ep, p.invalid_action_text or p.error_text("The query is empty."), "error", "empty_query")
            return
        if len(query) > MAX_QUERY_CHARS:
            ep.counters["queries_cut"] += 1
            query = query[:MAX_QUERY_CHARS]
        call = ToolCall(turn=ep.n_searches + 1, kind="query", content=query, sources=[self.default_source], k=self.top_k)
        passages: list[Passage] | None = yield from self._run_call(ep, call, SearchRequest(self.default_source, query, self.top_k))
        if passages is None:
            return
        call.passage_ids = [ps.id for ps in passages]
        self._insert_results(ep, p.format_docs(passages) if passages else p.empty_results_text)

    def _dag_call(self, ep: EpisodeBuffer, content: str) -> Generator[Request, Any, None]:
        from search_env.dag import format_dag_results, format_violations, parse_plan, validate_plan

        p = self.protocol
        plan = parse_plan(content)
        violations = validate_plan(plan, known_sources=self.plan_sources)
        if violations:
            ep.counters["invalid_plans"] += 1
            self._insert(ep, p.error_text(f"Invalid search plan:\n{format_violations(violations)}"), "error", "invalid_plan")
            return
        call = ToolCall(turn=ep.n_searches + 1, kind="dag", content=content, sources=[], k=self.top_k)
        run = yield from self._run_call(ep, call, PlanRequest(plan, self.top_k))
        if run is None:
            return
        call.nodes = [node.to_dict() for node in run.nodes]
        call.sources = sorted({node.source for node in run.nodes})
        call.passage_ids = [ps.id for node in run.nodes for ps in node.passages]
        ep.counters["source_errors"] += sum(1 for node in run.nodes if node.error)
        ep.counters["queries_cut"] += sum(1 for node in run.nodes if node.query_cut)
        self._insert_results(ep, format_dag_results(run, p.format_docs))

    def _tool_turn(self, ep: EpisodeBuffer) -> Call:
        """The tool calls of the turn that just ended: every call that names a known tool with a query,
        within the search budget, runs (all of them as one plan of independent nodes, so in parallel,
        calls to one source in one batch), and each call's response, an error for a bad call, goes in
        one tool turn, in call order."""
        from search_env.dag import Plan, PlanNode

        p, calling = self.protocol, self._tools
        turn = ep.decode(ep.turn_start)
        first = calling.find(turn) or 0
        ep.add_span("call", ep.turn_start + len(turn[:first].encode()), len(ep.text))
        slots: list[str] = []  # each call's response, in call order
        nodes: dict[str, PlanNode] = {}
        where: dict[str, int] = {}  # a node's slot
        for index, call in enumerate(calling.read(turn)):
            call = self._usable(ep, call, index, len(nodes))
            if call.error is not None:
                ep.counters[call.counter] += 1
                slots.append(p.error_text(call.error))
            else:
                label = _LABELS[len(nodes)]
                nodes[label], where[label] = PlanNode(label, call.query, call.name, index + 1), len(slots)
                slots.append("")
        if nodes:
            done = ep.n_searches
            ep.n_searches += len(nodes)
            ep.counters["searches"] += len(nodes)
            started = time.time()
            response = yield PlanRequest(Plan(nodes=nodes, edges=[]), self.top_k)
            runs = {} if isinstance(response, BaseException) else {run.label: run for run in response.nodes}
            for number, node in enumerate(nodes.values(), done + 1):
                run = runs.get(node.label)
                call = ToolCall(turn=number, kind="tool", content=node.query, sources=[node.source], k=self.top_k,
                                started_at=started, duration_s=time.time() - started)
                ep.trajectory.tool_calls.append(call)
                error = f"{type(response).__name__}: {response}" if run is None else run.error
                if error is not None:
                    call.error = error
                    ep.counters["source_errors"] += 1
                    slots[where[node.label]] = p.error_text(f"Search failed: {error}")
                else:
                    call.passage_ids = [ps.id for ps in run.passages]
                    ep.counters["queries_cut"] += run.query_cut
                    slots[where[node.label]] = self._capped(p.results_text(list(run.passages)))
        text = calling.tool_turn(slots)
        self._insert_ids(ep, self.codec.encode(text), "result" if nodes else "error", "results" if nodes else "invalid_call")

    def _usable(self, ep: EpisodeBuffer, call: ParsedCall, index: int, running: int) -> ParsedCall:
        """``call`` as read, or an error where it cannot run: past the calls of a turn, an unknown tool, or
        no search left in the budget."""
        if call.error is not None:
            return call
        if index >= MAX_CALLS_PER_TURN:
            return ParsedCall(error=f"at most {MAX_CALLS_PER_TURN} calls run in one turn")
        if call.name not in self.plan_sources:
            names = ", ".join(name for name, _ in self._tools.tools)
            return ParsedCall(error=f"unknown tool {call.name!r}; the tools are {names}")
        if self.max_turns is not None and ep.n_searches + running >= self.max_turns:
            return ParsedCall(error=f"Search budget of {self.max_turns} calls is used up; give the final answer.",
                              kind="budget")
        return call

    def _capped(self, text: str) -> str:
        """One tool response cut to ``max_result_tokens`` (the whole tool turn is then encoded once)."""
        cap = self.max_result_tokens
        if cap is None:
            return text
        ids = self.codec.encode(text)
        return text if len(ids) <= cap else self.codec.decode(ids[:cap])

    def _run_call(self, ep: EpisodeBuffer, call: ToolCall, request: Request) -> Generator[Request, Any, Any]:
        """Count and time one call, yield its request, record it; a failure (the answer is an
        exception) becomes an error observation and None is returned."""
        ep.n_searches += 1
        ep.counters["searches"] += 1
        call.started_at = time.time()
        response = yield request
        call.duration_s = time.time() - call.started_at
        ep.trajectory.tool_calls.append(call)
        if isinstance(response, BaseException):
            call.error = f"{type(response).__name__}: {response}"
            ep.counters["source_errors"] += 1
            self._insert(ep, self.protocol.error_text(f"Search failed: {call.error}"), "error", "source_error")
            return None
        return response

    # -- observations: environment text appended to the context --------------------------------
    def _insert_results(self, ep: EpisodeBuffer, docs: str) -> None:
        """A result block: the protocol's prefix, ``docs`` (cut to ``max_result_tokens``), its suffix."""
        prefix, suffix = self.protocol.result_prefix, self.protocol.result_suffix
        ids = self.codec.encode(prefix + docs + suffix)
        cap = self.max_result_tokens
        if cap is not None:
            head, body, tail = self.codec.encode(prefix), self.codec.encode(docs), self.codec.encode(suffix)
            if len(body) > cap:
                ids = head + body[:cap] + tail
        self._insert_ids(ep, ids, "result", "results")

    def _insert(self, ep: EpisodeBuffer, text: str, kind: str, event: str) -> None:
        self._insert_ids(ep, self.codec.encode(text), kind, event)

    def _insert_ids(self, ep: EpisodeBuffer, ids: list[int], kind: str, event: str) -> None:
        """Append an observation, cut where the context is full (which then ends the episode)."""
        room = self.max_context - len(ep.ids)
        ep.append_environment(ids[:room], self.token_bytes, kind)
        ep.event(event)
        if len(ids) > room:
            ep.end("max_context", truncated=True)
