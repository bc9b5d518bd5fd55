"""SearchQA-v0: question answering with search as a token-level POMDP.

The agent emits token ids; the environment keeps the exact ids (token-in/token-out), the bytes they
stand for, and watches that byte stream for the protocol's close tags. A closed search call is run
against a source and its formatted results are appended as environment tokens; a closed answer (or an
end-of-sequence token) ends the episode with a reward from :mod:`rewards`.

Speed: a token that cannot complete a tag (decided once per vocabulary entry: does it contain the last
byte of a watched tag?) costs a few list appends. A chunk of ids (an LLM's generation up to a stop
string) is scanned in bulk: its bytes are joined and searched with ``bytes.find``, and only the token
where something happens goes through the single-token logic, so a chunk gives exactly the episode that
feeding its ids one by one gives.

Calls are written as generators that *yield* a search request and receive its results: a single
environment answers each request at once, while :class:`search_env.vector.BatchSearchQAEnv` gathers the
requests of many environments and sends each source one batch.
"""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Callable, Generator, Mapping, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

import rewards

from search_env.data.example import QAExample
from search_env.protocols import Protocol, get_protocol
from search_env.sources.base import Passage, Source
from search_env.tokenization import TokenCodec, as_codec
from search_env.trajectory import AGENT, ENVIRONMENT, Span, ToolCall, Trajectory

__all__ = ["SearchQAEnv", "SearchRequest", "PlanRequest"]

MAX_QUERY_CHARS = 1000  #: longer queries are cut (and counted) before they reach a source
_AGENT_ONLY = (AGENT,)


@dataclass
class SearchRequest:
    """One query for one source, yielded by an episode that closed a call."""

    source: str
    query: str
    k: int


@dataclass
class PlanRequest:
    """An NL-DAG plan to execute over the environment's sources, yielded by a ``dag`` protocol call."""

    plan: Any
    k: int


Episode = Generator[Any, Any, None]


class SearchQAEnv(gym.Env):
    """A token-level environment for answering questions with search (see the module docstring).

    Args:
        protocol: a registered protocol name (``search-r1``, ``r1-searcher``, ``research``, ``r-search``,
            ``reasoning-search``) or a :class:`~search_env.protocols.Protocol`.
        dataset: ``"synthetic"`` (the built-in world), a list of :class:`QAExample`, or a dataset name/path
            understood by :func:`search_env.data.loaders.load_dataset`.
        sources: a :class:`Source`, or a mapping of names to sources. Default: BM25 over the synthetic
            world, one source per world source plus ``"all"`` for single-query protocols.
        default_source: the source single-query calls go to (default: ``"all"`` if present, else the first).
        source_aliases: extra names for sources (e.g. ``{"general": "wiki"}``) used by NL-DAG plans.
        tokenizer: ``None`` (built-in tokenizer), a transformers or ``tokenizers`` tokenizer, or a path.
        reward / reward_options: override the protocol's reward preset and its options.
        evidence_model / judge: model-based reward parts passed to :func:`rewards.score`.
        max_new_tokens: agent tokens per episode before truncation.
        max_turns: searches per episode (-1, the default: the protocol's; None: unlimited); further calls
            get an error observation.
        max_context: total tokens (prompt included) before truncation.
        max_result_tokens: cap on the document tokens of one result block (the closing tag is kept).
        top_k: passages per query (default: the protocol's).
        cache_size: wrap every source in an LRU cache of this many (query, k) entries (0: no cache).
        source_timeout_s: per-call time limit of every source; a late call becomes an error observation.
        chat_template: render the prompt with the tokenizer's chat template (``None``: when it has one).
        world_seed / world_size: seed and question count of the synthetic world.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        protocol: str | Protocol = "search-r1",
        dataset: str | Sequence[QAExample] = "synthetic",
        sources: Source | Mapping[str, Source] | None = None,
        *,
        default_source: str | None = None,
        source_aliases: Mapping[str, str] | None = None,
        tokenizer: Any = None,
        reward: str | None = None,
        reward_options: Mapping[str, Any] | None = None,
        evidence_model: Callable[[str, str], str] | None = None,
        judge: Callable[[str, list[str], str], float] | None = None,
        max_new_tokens: int = 1024,
        max_turns: int | None = -1,
        max_context: int = 8192,
        max_result_tokens: int | None = None,
        top_k: int | None = None,
        cache_size: int = 0,
        source_timeout_s: float | None = None,
        chat_template: bool | None = None,
        world_seed: int = 0,
        world_size: int = 1000,
        render_mode: str | None = None,
    ) -> None:
        self.protocol = get_protocol(protocol)
        self.codec: TokenCodec = as_codec(tokenizer)
        self.examples, world = _resolve_dataset(dataset, world_seed, world_size)
        self.sources = _guard_sources(_resolve_sources(sources, world), cache_size, source_timeout_s)
        self.source_aliases = {k.lower(): v.lower() for k, v in (source_aliases or _default_aliases(self.sources)).items()}
        self.default_source = (default_source or ("all" if "all" in self.sources else next(iter(self.sources)))).lower()
        if self.default_source not in self.sources:
            raise ValueError(f"default_source {self.default_source!r} is not one of {sorted(self.sources)}")
        self.reward_preset = reward or self.protocol.reward
        self.reward_options = dict(self.protocol.reward_options if reward is None else {}, **(reward_options or {}))
        self.evidence_model, self.judge = evidence_model, judge
        self.max_new_tokens = int(max_new_tokens)
        self.max_turns = self.protocol.max_turns if max_turns == -1 else max_turns
        self.max_context = int(max_context)
        self.max_result_tokens = max_result_tokens
        self.top_k = top_k or self.protocol.top_k
        self.use_chat = bool(self.codec.chat_template) if chat_template is None else chat_template
        if self.use_chat and not self.codec.chat_template:
            raise ValueError("chat_template=True but the tokenizer has no chat template")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', not {render_mode!r}")
        self.render_mode = render_mode

        vocab = self.codec.vocab_size
        self.action_space = spaces.Discrete(vocab)
        self.observation_space = spaces.Dict(
            {
                "token_ids": spaces.Sequence(spaces.Discrete(vocab)),
                "producers": spaces.Sequence(spaces.Discrete(2)),
            }
        )
        self._vocab = vocab
        self._tok_bytes = self.codec.token_bytes
        self._eos = self.codec.eos_ids
        self._watched = (self.protocol.call_close.encode(), self.protocol.answer_close.encode())
        self._max_tag = max(len(t) for t in self._watched)
        # Which ids may complete a watched tag (they hold a tag's last byte), and which need attention.
        self._may_close, self._attention = self.codec.tag_tables(frozenset(t[-1] for t in self._watched))
        self._done = True
        self._traj: Trajectory | None = None

    # ---------------------------------------------------------------------------------------------
    # Gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start an episode. ``options``: ``{"index": i}`` or ``{"example": QAExample}`` picks the question
        (default: drawn with the environment's seeded generator)."""
        super().reset(seed=seed)
        options = options or {}
        if "example" in options:
            example = options["example"]
        elif "index" in options:
            example = self.examples[int(options["index"])]
        else:
            example = self.examples[int(self.np_random.integers(len(self.examples)))]
        self.example = example
        prompt_text = self.render_prompt(example.question)
        prompt_ids = self.codec.encode(prompt_text)
        if len(prompt_ids) >= self.max_context:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens, not below max_context={self.max_context}")
        self._ids: list[int] = list(prompt_ids)
        self._producers = bytearray(len(prompt_ids))
        self._buf = bytearray()
        self._ends: list[int] = []
        self._append_bytes(prompt_ids)
        self._prompt_bytes = len(self._buf)
        self._turn_start = len(self._buf)
        self._n_new = 0
        self._n_searches = 0
        self._step_events: list[dict[str, Any]] = []
        self._answer_at: tuple[int, int] | None = None
        self._counters = {
            "searches": 0, "invalid_calls": 0, "empty_queries": 0, "budget_exhausted_calls": 0,
            "calls_inside_answer": 0, "source_errors": 0, "invalid_plans": 0, "queries_cut": 0,
            "unterminated_calls": 0, "env_tokens": 0,
        }
        self._traj = Trajectory(
            question=example.question, golden_answers=list(example.golden_answers), protocol=self.protocol.name,
            example_id=example.id, prompt_length=len(prompt_ids), token_ids=self._ids,
            producers=self._producers, trained=bytearray(),
        )
        self._traj.counters = self._counters
        self._done = False
        obs = {"token_ids": tuple(prompt_ids), "producers": (ENVIRONMENT,) * len(prompt_ids)}
        return obs, {"question": example.question, "example_id": example.id, "prompt_length": len(prompt_ids)}

    def step(self, action: int | Sequence[int]):
        """Feed one token id, or a chunk of ids (a list or 1-d array), and get what became visible.

        A chunk gives exactly the episode that feeding its ids one at a time gives: the observation is
        the concatenation, the reward the sum, ``info`` the last step's with ``events`` listing every
        event in order, and ``info["consumed"]`` the number of ids used (ids after the episode's end
        are ignored).
        """
        if self._done:
            raise gym.error.ResetNeeded("step() called on a finished episode (or before reset()); call reset()")
        if isinstance(action, (int, np.integer)):
            a = int(action)
            if a < 0 or a >= self._vocab:
                raise ValueError(f"token id {a} is outside the action space Discrete({self._vocab})")
            if not self._attention[a]:
                # Fast path: nothing can happen at this token but a budget running out.
                self._ids.append(a)
                self._producers.append(AGENT)
                self._buf += self._tok_bytes[a]
                self._ends.append(len(self._buf))
                self._n_new += 1
                if self._n_new < self.max_new_tokens and len(self._ids) < self.max_context:
                    return {"token_ids": (a,), "producers": _AGENT_ONLY}, 0.0, False, False, {}
                start = len(self._ids) - 1
                self._finish("max_new_tokens" if self._n_new >= self.max_new_tokens else "max_context", truncated=True)
                return self._step_result(start, None)
        ids, chunk = self._action_ids(action)
        start = len(self._ids)
        _drive(self._advance(ids), self._answer_request)
        return self._step_result(start, self._consumed if chunk else None)

    def _action_ids(self, action: int | Sequence[int]) -> tuple[list[int], bool]:
        """Validated ids of an action, and whether it was a chunk (rather than one id)."""
        if isinstance(action, (int, np.integer)):
            ids, chunk = [int(action)], False
        else:
            ids, chunk = np.asarray(action, dtype=np.int64).reshape(-1).tolist(), True
        if ids and (min(ids) < 0 or max(ids) >= self._vocab):
            raise ValueError(f"token ids must lie in [0, {self._vocab}) (the action space)")
        return ids, chunk

    def render(self) -> str | None:
        """The episode's text so far (prompt, agent text and observations)."""
        if self.render_mode == "ansi" and self._traj is not None:
            return self._buf.decode("utf-8", errors="replace")
        return None

    def close(self) -> None:
        for source in {id(s): s for s in self.sources.values()}.values():
            source.close()

    # ---------------------------------------------------------------------------------------------
    # Public helpers
    def render_prompt(self, question: str) -> str:
        """The prompt text for ``question`` under this environment's protocol and tokenizer."""
        if self.use_chat:
            return self.codec.render_chat(self.protocol.messages(question)) + self.protocol.assistant_prefix
        return self.protocol.plain_prompt(question)

    @property
    def response_text(self) -> str:
        """Everything after the prompt so far: agent text and the observations inserted into it."""
        return self._buf[self._prompt_bytes :].decode("utf-8", errors="replace")

    @property
    def trajectory(self) -> Trajectory:
        """The current (or last) episode's record."""
        if self._traj is None:
            raise RuntimeError("no episode yet: call reset()")
        return self._traj

    # ---------------------------------------------------------------------------------------------
    # Episode mechanics (generators: they yield requests and receive results)
    def _advance(self, ids: Sequence[int]) -> Episode:
        self._consumed = 0
        self._step_events: list[dict[str, Any]] = []
        self._answer_at: tuple[int, int] | None = None
        n = len(ids)
        i = 0
        while i < n and not self._done:
            j = self._next_attention(ids, i)
            if j > i:
                self._append_agent_bulk(ids[i:j])
            if j < n:
                yield from self._agent_token(ids[j])
                j += 1
            i = j
        self._consumed = i

    def _next_attention(self, ids: Sequence[int], i: int) -> int:
        """The first index >= i whose token needs the single-token logic (may end a tag, is EOS, or
        exhausts a budget); ``len(ids)`` when none does. Exact, so bulk appends never skip an event."""
        room = min(self.max_new_tokens - self._n_new, self.max_context - len(self._ids))
        limit = min(len(ids), i + room - 1)  # the token that exhausts a budget needs attention
        attention = self._attention
        for j in range(i, limit):
            if attention[ids[j]]:
                break
        else:
            return limit
        if j == i or not self._may_close[ids[j]] or ids[j] in self._eos:
            return j
        # ids[j] may close a tag: search the joined bytes of ids[i:limit] once, in C.
        tb = self._tok_bytes
        chunk = b"".join([tb[t] for t in ids[i:limit]])
        base = len(self._buf)
        back = min(self._max_tag - 1, base - self._turn_start)
        window = bytes(self._buf[base - back :]) + chunk
        end = None
        for tag in self._watched:
            pos = window.find(tag)
            while pos != -1 and pos + len(tag) <= back:  # ended before this chunk: already handled
                pos = window.find(tag, pos + 1)
            if pos != -1 and (end is None or pos + len(tag) < end):
                end = pos + len(tag)
        eos_at = next((k for k in range(j, limit) if ids[k] in self._eos), limit)
        if end is None:
            return eos_at
        lengths = accumulate(len(tb[t]) for t in ids[i:limit])
        tag_at = i + bisect.bisect_left(list(lengths), end - back)
        return min(tag_at, eos_at)

    def _append_agent_bulk(self, ids: Sequence[int]) -> None:
        tb = self._tok_bytes
        base = len(self._buf)
        self._ids.extend(ids)
        self._producers.extend(b"\x01" * len(ids))
        pieces = [tb[t] for t in ids]
        self._ends.extend(x + base for x in accumulate(map(len, pieces)))
        self._buf += b"".join(pieces)
        self._n_new += len(ids)

    def _append_bytes(self, ids: Sequence[int]) -> None:
        tb = self._tok_bytes
        for t in ids:
            self._buf += tb[t]
            self._ends.append(len(self._buf))

    def _agent_token(self, a: int) -> Episode:
        before = len(self._buf)
        self._ids.append(a)
        self._producers.append(AGENT)
        self._buf += self._tok_bytes[a]
        self._ends.append(len(self._buf))
        self._n_new += 1
        if a in self._eos:
            self._finish("eos", truncated=False)
            return
        if self._may_close[a]:
            tag, at = self._completed_tag(before)
            if tag == 1:
                self._close_answer(at)
            elif tag == 0:
                yield from self._close_call(at)
        if not self._done and (self._n_new >= self.max_new_tokens or len(self._ids) >= self.max_context):
            self._finish("max_new_tokens" if self._n_new >= self.max_new_tokens else "max_context", truncated=True)

    def _completed_tag(self, before: int) -> tuple[int, int]:
        """Which watched tag (0 = call close, 1 = answer close; -1 none) ends in the bytes after
        ``before``, and the byte offset where it starts. The earliest-ending one wins."""
        best, best_end, best_at = -1, None, -1
        for which, tag in enumerate(self._watched):
            lo = max(self._turn_start, before - len(tag) + 1)
            pos = self._buf.find(tag, lo)
            if pos != -1 and (best_end is None or pos + len(tag) < best_end):
                best, best_end, best_at = which, pos + len(tag), pos
        return best, best_at

    def _close_answer(self, at: int) -> None:
        p = self.protocol
        opened = self._buf.rfind(p.answer_open.encode(), self._turn_start, at)
        if opened == -1:
            self._counters["invalid_calls"] += 1
            self._insert(p.invalid_action_text or p.error_text(f"{p.answer_close} without {p.answer_open}"), "error", "invalid_answer")
            return
        self._add_span("answer", opened, at + len(p.answer_close))
        if self._answer_at is None:
            self._answer_at = (opened + len(p.answer_open), at)
        if p.answer_ends_episode:
            self._finish("answer", truncated=False)
        else:
            self._event("answer")

    def _close_call(self, at: int) -> Episode:
        p = self.protocol
        buf, turn = self._buf, self._turn_start
        answer_open = buf.rfind(p.answer_open.encode(), turn, at)
        if answer_open > buf.rfind(p.answer_close.encode(), turn, at):
            self._counters["calls_inside_answer"] += 1
            self._event("call_inside_answer")
            return
        opened = buf.rfind(p.call_open.encode(), turn, at)
        if opened == -1:
            self._counters["invalid_calls"] += 1
            self._insert(p.invalid_action_text or p.error_text(f"{p.call_close} without {p.call_open}"), "error", "invalid_call")
            return
        self._add_span("call", opened, at + len(p.call_close))
        content = buf[opened + len(p.call_open) : at].decode("utf-8", errors="replace")
        if self.max_turns is not None and self._n_searches >= self.max_turns:
            self._counters["budget_exhausted_calls"] += 1
            self._insert(p.error_text(f"Search budget of {self.max_turns} calls is used up; give the final answer."), "error", "search_budget")
            return
        if p.call_kind == "dag":
            yield from self._dag_call(content)
            return
        query = p.clean_query(content)
        if not query:
            self._counters["empty_queries"] += 1
            if p.empty_query_ends_episode:
                self._event("empty_query")
                self._finish("empty_query", truncated=False)
            else:
                self._insert(p.invalid_action_text or p.error_text("The query is empty."), "error", "empty_query")
            return
        if len(query) > MAX_QUERY_CHARS:
            self._counters["queries_cut"] += 1
            query = query[:MAX_QUERY_CHARS]
        call = ToolCall(turn=self._n_searches + 1, kind="query", content=query, sources=[self.default_source], k=self.top_k)
        passages: list[Passage] | None = yield from self._run_call(call, SearchRequest(self.default_source, query, self.top_k))
        if passages is None:
            return
        call.passage_ids = [ps.id for ps in passages]
        self._insert_results(p.result_prefix, p.format_docs(passages) if passages else p.empty_results_text, p.result_suffix)

    def _dag_call(self, content: str) -> Episode:
        from search_env.dag import format_dag_results, parse_plan, validate_plan

        p = self.protocol
        plan = parse_plan(content)
        known = set(self.sources) | set(self.source_aliases)
        violations = validate_plan(plan, known_sources=known)
        if violations:
            self._counters["invalid_plans"] += 1
            listing = "; ".join(str(v) for v in violations)
            self._insert(p.error_text(f"Invalid search plan: {listing}"), "error", "invalid_plan")
            return
        call = ToolCall(turn=self._n_searches + 1, kind="dag", content=content, sources=[], k=self.top_k)
        run = yield from self._run_call(call, PlanRequest(plan, self.top_k))
        if run is None:
            return
        call.nodes = [node.to_dict() for node in run.nodes]
        call.sources = sorted({node.source for node in run.nodes})
        call.passage_ids = [ps.id for node in run.nodes for ps in node.passages]
        self._counters["source_errors"] += sum(1 for node in run.nodes if node.error)
        self._insert_results(p.result_prefix, format_dag_results(run, p.format_docs), p.result_suffix)

    def _run_call(self, call: ToolCall, request: SearchRequest | PlanRequest) -> Generator[Any, Any, Any]:
        """Count and time one call, yield its request, record it; a failure (the answer is an
        exception) becomes an error observation and None is returned."""
        self._n_searches += 1
        self._counters["searches"] += 1
        call.started_at = time.time()
        response = yield request
        call.duration_s = time.time() - call.started_at
        self.trajectory.tool_calls.append(call)
        if isinstance(response, BaseException):
            call.error = f"{type(response).__name__}: {response}"
            self._counters["source_errors"] += 1
            self._insert(self.protocol.error_text(f"Search failed: {call.error}"), "error", "source_error")
            return None
        return response

    # -- writing environment text ---------------------------------------------------------------
    def _insert_results(self, prefix: str, docs: str, suffix: str) -> None:
        ids = self.codec.encode(prefix + docs + suffix)
        cap = self.max_result_tokens
        if cap is not None:
            head, body, tail = self.codec.encode(prefix), self.codec.encode(docs), self.codec.encode(suffix)
            if len(body) > cap:
                ids = head + body[:cap] + tail
        self._insert_ids(ids, "result", "results")

    def _insert(self, text: str, kind: str, event: str) -> None:
        self._insert_ids(self.codec.encode(text), kind, event)

    def _insert_ids(self, ids: list[int], kind: str, event: str) -> None:
        room = self.max_context - len(self._ids)
        cut = len(ids) > room
        ids = ids[:room]
        start_tok = len(self._ids)
        self._ids.extend(ids)
        self._producers.extend(bytes(len(ids)))
        self._append_bytes(ids)
        self._counters["env_tokens"] += len(ids)
        self._turn_start = len(self._buf)
        self.trajectory.spans.append(Span(kind, start_tok, len(self._ids)))
        self._event(event)
        if cut:
            self._finish("max_context", truncated=True)

    def _add_span(self, kind: str, byte_start: int, byte_end: int) -> None:
        first = bisect.bisect_right(self._ends, byte_start)
        last = bisect.bisect_left(self._ends, byte_end) + 1
        self.trajectory.spans.append(Span(kind, first, last))

    def _event(self, name: str) -> None:
        self._step_events.append({"event": name, "token_index": len(self._ids)})

    # -- the end of an episode ------------------------------------------------------------------
    def _finish(self, reason: str, *, truncated: bool) -> None:
        self._done = True
        self._terminated, self._truncated = not truncated, truncated
        traj = self.trajectory
        p = self.protocol
        if truncated and self._buf.rfind(p.call_open.encode(), self._turn_start) > self._buf.rfind(p.call_close.encode(), self._turn_start):
            self._counters["unterminated_calls"] += 1
        traj.end_reason = reason
        traj.response_text = self.response_text
        if self._answer_at is not None:
            begin, end = self._answer_at
            traj.answer = self._buf[begin:end].decode("utf-8", errors="replace").strip()
        traj.trained = self._trained_mask()
        ended_with_eos = reason == "eos"
        result = rewards.score(
            self.reward_preset, traj.response_text, traj.golden_answers, question=traj.question,
            ended_with_eos=ended_with_eos, evidence_model=self.evidence_model, judge=self.judge, **self.reward_options,
        )
        traj.reward = float(result.total)
        traj.reward_components = dict(result.components)
        self._event("end")

    def _trained_mask(self) -> bytearray:
        """Agent tokens are trained on, observations are not; a protocol may exclude agent spans."""
        mask = bytearray(self._producers)
        for open_tag, close_tag in self.protocol.untrained_agent_spans:
            o, c = open_tag.encode(), close_tag.encode()
            pos = self._buf.find(o, self._prompt_bytes)
            while pos != -1:
                end = self._buf.find(c, pos + len(o))
                end = len(self._buf) if end == -1 else end + len(c)
                first = bisect.bisect_right(self._ends, pos)
                last = bisect.bisect_left(self._ends, end) + 1
                for t in range(first, min(last, len(mask))):
                    mask[t] = 0
                pos = self._buf.find(o, end)
        return mask

    # -- answering requests in a single environment --------------------------------------------
    def _answer_request(self, request: Any) -> Any:
        if isinstance(request, SearchRequest):
            return self.search_batch(request.source, [request.query], request.k)[0]
        return self.run_plan(request)

    def search_batch(self, source: str, queries: list[str], k: int) -> list[list[Passage] | BaseException]:
        """Run queries on one source; a failure becomes the exception object for each query."""
        try:
            results = self.sources[source].search(queries, k)
        except Exception as exc:  # noqa: BLE001 - a source failure is an observation, never a crash
            return [exc] * len(queries)
        return [list(r[:k]) for r in results]

    def run_plan(self, request: PlanRequest) -> Any:
        """Execute an NL-DAG plan over this environment's sources (exceptions are returned, not raised)."""
        from search_env.dag import execute_plan

        try:
            return execute_plan(request.plan, self.sources, k=request.k, aliases=self.source_aliases)
        except Exception as exc:  # noqa: BLE001
            return exc

    def _step_result(self, start: int, consumed: int | None):
        ids, producers = tuple(self._ids[start:]), tuple(self._producers[start:])
        info: dict[str, Any] = {} if consumed is None else {"consumed": consumed}
        if self._step_events:
            info["events"] = list(self._step_events)
        reward = 0.0
        terminated = truncated = False
        if self._done:
            traj = self.trajectory
            reward = traj.reward
            terminated, truncated = self._terminated, self._truncated
            info.update(trajectory=traj, reward_components=traj.reward_components, answer=traj.answer, end_reason=traj.end_reason)
        self._step_events = []
        return {"token_ids": ids, "producers": producers}, reward, terminated, truncated, info


def _drive(episode: Episode, answer: Callable[[Any], Any]) -> None:
    """Run an episode generator to its end, answering each request it yields with ``answer``."""
    try:
        request = next(episode)
        while True:
            request = episode.send(answer(request))
    except StopIteration:
        pass


# -- construction helpers ----------------------------------------------------------------------------
def _resolve_dataset(dataset: Any, seed: int, size: int) -> tuple[list[QAExample], Any]:
    if isinstance(dataset, str) and dataset == "synthetic":
        from search_env.synthetic import generate_world

        world = generate_world(seed=seed, n_questions=size)
        return list(world.questions), world
    if isinstance(dataset, str):
        from search_env.data.loaders import load_dataset

        examples = list(load_dataset(dataset))
    else:
        examples = list(dataset)
    if not examples:
        raise ValueError("the dataset is empty")
    return examples, None


def _resolve_sources(sources: Any, world: Any) -> dict[str, Source]:
    if sources is None:
        if world is None:
            raise ValueError("pass sources=... (a Source or a mapping of names to sources) for a non-synthetic dataset")
        from search_env.sources.bm25 import BM25Source

        resolved: dict[str, Source] = {name: BM25Source(passages, name=name) for name, passages in world.sources.items()}
        resolved["all"] = BM25Source(world.passages(), name="all")
        return resolved
    if isinstance(sources, Source):
        return {sources.name.lower(): sources}
    resolved = {str(name).lower(): src for name, src in sources.items()}
    if not resolved:
        raise ValueError("sources is empty")
    return resolved


def _guard_sources(sources: dict[str, Source], cache_size: int, timeout_s: float | None) -> dict[str, Source]:
    """Wrap each distinct source once: a time limit inside, an LRU cache outside (a hit costs no call)."""
    if not cache_size and timeout_s is None:
        return sources
    from search_env.sources.cache import CachedSource
    from search_env.sources.time_limit import TimeLimitedSource

    wrapped: dict[int, Source] = {}
    for source in sources.values():
        if id(source) not in wrapped:
            guarded = TimeLimitedSource(source, timeout_s) if timeout_s is not None else source
            wrapped[id(source)] = CachedSource(guarded, maxsize=cache_size) if cache_size else guarded
    return {name: wrapped[id(source)] for name, source in sources.items()}


def _default_aliases(sources: Mapping[str, Source]) -> dict[str, str]:
    """Reasoning-search's tool names mapped onto the synthetic world's sources, when both exist."""
    aliases = {"general": "wiki", "academy": "papers", "search": "wiki"}
    return {k: v for k, v in aliases.items() if v in sources and k not in sources}
