"""SearchQA-v0: question answering with search as a token-level POMDP.

The agent emits token ids; the environment keeps the exact ids (token-in/token-out), the bytes they
stand for, and watches that byte stream for the protocol's close tags (:mod:`search_env.scanner`). A
closed search call is run against a source and its formatted results are appended as environment
tokens; a closed answer (or an end-of-sequence token) ends the episode with a reward from :mod:`rewards`.

Speed: a token that cannot complete a tag (decided once per vocabulary entry) costs a few list appends.
A chunk of ids (an LLM's generation up to a stop string) is scanned in bulk, and only the token where
something happens goes through the single-token logic, so a chunk gives exactly the episode that
feeding its ids one by one gives.

Batched stepping. A step that closes a search call stops at the call and hands out a request
(:class:`SearchRequest` or :class:`PlanRequest`); the step goes on once the request's results are in.
``step`` answers each request at once on this environment's sources. Callers that step many episodes
together (:class:`search_env.vector.BatchSearchQAEnv`) use the same four public pieces instead:
:meth:`SearchQAEnv.start_step`, :attr:`SearchQAEnv.pending_request`, :meth:`SearchQAEnv.take_results`
and :meth:`SearchQAEnv.finish_step`, and send each source one batch of everyone's pending queries.

NL-DAG plans (``call_kind="dag"``): two sets of rules read a plan, on purpose. The environment runs
any plan that :func:`~search_env.dag.validate.validate_plan` accepts (at most 8 nodes, every node's
source one of this environment's sources or aliases, edges between declared nodes, acyclic) and
answers any other with an error observation listing the violations. The ``reasoning-search`` reward
scores the plan by the reference's strict reading (:mod:`rewards.dag`: at most 6 nodes, its own line
grammar), with this environment's source and alias names as its tool list (the ``tools`` option,
filled in here), so a plan the environment ran is never scored ``unknown_tool``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Callable, Generator, Mapping, Sequence, Union

import gymnasium as gym
import numpy as np
from gymnasium import spaces

import rewards
from rewards.schedule import StepReward

from search_env.data.example import QAExample
from search_env.protocols import Protocol, get_protocol
from search_env.resolve import default_aliases, guard_sources, offered_plan_tools, resolve_dataset, resolve_reward, resolve_sources
from search_env.scanner import TagScanner, token_range
from search_env.sources.base import Passage, Source, checked_results
from search_env.tokenization import TokenCodec, as_codec
from search_env.trajectory import AGENT, ENVIRONMENT, Span, ToolCall, Trajectory

__all__ = ["SearchQAEnv", "SearchRequest", "PlanRequest", "Request", "MAX_QUERY_CHARS"]

MAX_QUERY_CHARS = 1000  #: longer queries (single queries and DAG nodes) are cut, and counted, before a source sees them
_AGENT_ONLY = (AGENT,)


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
Episode = Generator[Request, Any, None]


class SearchQAEnv(gym.Env):
    """A token-level environment for answering questions with search (see the module docstring).

    Args:
        protocol: a registered protocol name (``search-r1``, ``r1-searcher``, ``research``, ``r-search``,
            ``reasoning-search``) or a :class:`~search_env.protocols.Protocol`.
        dataset: ``"synthetic"`` (the built-in world), a list of :class:`QAExample`, or a dataset name/path
            understood by :func:`search_env.data.loaders.load_dataset`.
        sources: a :class:`Source`, a corpus path (jsonl; searched with BM25 as source ``"wiki"``), or a
            mapping of names to sources or corpus paths. Default: BM25 over the synthetic world, one
            source per world source plus ``"all"`` for single-query protocols.
        default_source: the source single-query calls go to (default: ``"all"`` if present, else the first).
        source_aliases: extra names for sources (e.g. ``{"general": "wiki"}``) used by NL-DAG plans.
        tokenizer: ``None`` (built-in tokenizer), a transformers or ``tokenizers`` tokenizer, or a path.
        reward: the protocol's preset by default; a preset name, or a :class:`rewards.schedule.StepReward`
            (``StagedReward``, ``Preset``, ``ComponentMix``, ``RewardMix``) scored at the training step
            set with :meth:`set_reward_step`.
        reward_options: keyword options for the reward (replacing the protocol's when ``reward`` is given).
        evidence_model / judge: model-based reward parts passed to :func:`rewards.score`.
        max_new_tokens: agent tokens per episode before truncation.
        max_turns: searches per episode (-1, the default: the protocol's; None: unlimited); further calls
            get an error observation.
        max_context: total tokens (prompt included) before truncation.
        max_result_tokens: cap on the document tokens of one result block (its prefix and closing
            suffix are kept).
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
        sources: Source | str | Mapping[str, Source | str] | None = None,
        *,
        default_source: str | None = None,
        source_aliases: Mapping[str, str] | None = None,
        tokenizer: Any = None,
        reward: str | StepReward | None = None,
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
        self.examples, world = resolve_dataset(dataset, world_seed, world_size)
        self.sources = guard_sources(resolve_sources(sources, world), cache_size, source_timeout_s)
        self.source_aliases = {k.lower(): v.lower() for k, v in (source_aliases or default_aliases(self.sources)).items()}
        self.default_source = (default_source or ("all" if "all" in self.sources else next(iter(self.sources)))).lower()
        if self.default_source not in self.sources:
            raise ValueError(f"default_source {self.default_source!r} is not one of {sorted(self.sources)}")
        plan_names = sorted(set(self.sources) | set(self.source_aliases))
        if self.protocol.call_kind == "dag" and self.protocol.plan_tools:
            offered = offered_plan_tools(self.protocol.plan_tools, self.sources, self.source_aliases)
            if offered != self.protocol.plan_tools:
                self.protocol = self.protocol.with_options(plan_tools=offered)
        self.reward, self.reward_options = resolve_reward(self.protocol, reward, reward_options, plan_names)
        self.evidence_model, self.judge = evidence_model, judge
        self._reward_step = 0
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
        self._scanner = TagScanner(self.codec, (self.protocol.call_close, self.protocol.answer_close))
        self._tok_bytes = self.codec.token_bytes
        self._attention = self._scanner.attention
        self._done = True
        self._terminated = self._truncated = False
        self._traj: Trajectory | None = None
        self._episode: Episode | None = None  # the step in progress (see start_step)
        self._request: Request | None = None
        self._prompts: dict[str, tuple[tuple[int, ...], bytes, tuple[int, ...]]] = {}  # see _prompt

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
        prompt_ids, prompt_bytes, prompt_ends = self._prompt(example.question)
        self._ids: list[int] = list(prompt_ids)
        self._producers = bytearray(len(prompt_ids))
        self._buf = bytearray(prompt_bytes)
        self._ends: list[int] = list(prompt_ends)
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
        self._terminated = self._truncated = False
        self._episode = self._request = None
        return self.first_observation(example)

    def first_observation(self, example: QAExample) -> tuple[dict[str, Any], dict[str, Any]]:
        """What :meth:`reset` returns for ``example`` (the prompt's ids and the info), without starting an
        episode: an :class:`~search_env.worker.EnvWorker` answers a reset with it while its worker resets."""
        prompt_ids = self._prompt(example.question)[0]
        obs = {"token_ids": prompt_ids, "producers": (ENVIRONMENT,) * len(prompt_ids)}
        return obs, {"question": example.question, "example_id": example.id, "prompt_length": len(prompt_ids)}

    def step(self, action: int | Sequence[int]):
        """Feed one token id (an ``int`` or numpy integer), or a chunk of ids (a list, tuple or integer
        array), and get what became visible. Anything else (a float, a str, bools) is a ``ValueError``.

        A chunk gives exactly the episode that feeding its ids one at a time gives: the observation is
        the concatenation, the reward the sum, ``info`` the last step's with ``events`` listing every
        event in order, and ``info["consumed"]`` the number of ids used (ids after the episode's end
        are ignored).
        """
        if self._done:
            raise gym.error.ResetNeeded("step() called on a finished episode (or before reset()); call reset()")
        if type(action) is int or isinstance(action, np.integer):
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
        request = self.start_step(action)
        while request is not None:
            request = self.take_results(self.answer(request))
        return self.finish_step()

    def render(self) -> str | None:
        """The episode's text so far (prompt, agent text and observations)."""
        if self.render_mode == "ansi" and self._traj is not None:
            return self._buf.decode("utf-8", errors="replace")
        return None

    def close(self) -> None:
        for source in {id(s): s for s in self.sources.values()}.values():
            source.close()

    # ---------------------------------------------------------------------------------------------
    # Batched stepping: step() in four pieces, for callers that answer many episodes' requests at once
    def start_step(self, action: int | Sequence[int]) -> Request | None:
        """Begin a step with ``action`` (checked as :meth:`step` checks it): the agent's tokens are taken
        up to the first search call they close, whose request is returned. None: the step needs no
        search, call :meth:`finish_step`."""
        return self.start_checked_step(*self._action_ids(action))

    def start_checked_step(self, ids: list[int], chunk: bool) -> Request | None:
        """:meth:`start_step` for an action already checked: ``ids`` and ``chunk`` as :meth:`check_action`
        returns them (a batch checks every episode's action first and need not check it twice)."""
        if self._done:
            raise gym.error.ResetNeeded("start_step() called on a finished episode (or before reset()); call reset()")
        if self._episode is not None:
            raise RuntimeError("a step is in progress: give it its results (take_results) and finish it (finish_step)")
        self._step_start, self._step_chunk = len(self._ids), chunk
        self._episode = self._advance(ids)
        return self._resume(None)

    @property
    def pending_request(self) -> Request | None:
        """The search request the step in progress waits on (None when it waits on nothing)."""
        return self._request

    def take_results(self, results: Any) -> Request | None:
        """Give the pending request its results (see :class:`SearchRequest` and :class:`PlanRequest`; an
        exception becomes an error observation). The step goes on to its next call, whose request is
        returned, or to its end (None: call :meth:`finish_step`)."""
        if self._request is None:
            raise RuntimeError("no search request is pending: call start_step() first")
        return self._resume(results)

    def finish_step(self):
        """End the step in progress and return what :meth:`step` returns for it."""
        if self._episode is None:
            raise RuntimeError("no step in progress: call start_step() first")
        if self._request is not None:
            raise RuntimeError("the step still waits on its search request: call take_results() first")
        self._episode = None
        return self._step_result(self._step_start, self._consumed if self._step_chunk else None)

    def answer(self, request: Request) -> list[Passage] | Any | BaseException:
        """Run one request on this environment's sources, as :meth:`step` does (a failure is returned)."""
        if isinstance(request, SearchRequest):
            return self.search_batch(request.source, [request.query], request.k)[0]
        return self.run_plan(request)

    def search_batch(self, source: str, queries: list[str], k: int) -> list[list[Passage] | BaseException]:
        """Run queries on one source, at most ``k`` passages each. A failure, or results that are not one
        list of passages per query, becomes an exception object for each query, naming the source."""
        try:
            results = checked_results(self.sources[source].search(queries, k), len(queries), source)
        except Exception as exc:  # noqa: BLE001 - a source failure is an observation, never a crash
            return [exc] * len(queries)
        return [r[:k] for r in results]

    def run_plan(self, request: PlanRequest) -> Any:
        """Execute an NL-DAG plan over this environment's sources (exceptions are returned, not raised)."""
        from search_env.dag import execute_plan

        try:
            return execute_plan(
                request.plan, self.sources, k=request.k, aliases=self.source_aliases, max_query_chars=MAX_QUERY_CHARS
            )
        except Exception as exc:  # noqa: BLE001
            return exc

    @property
    def done(self) -> bool:
        """True before the first reset and once the episode has ended (step() then needs reset())."""
        return self._done

    @property
    def terminated(self) -> bool:
        """The episode ended by an answer, EOS or an empty R1-Searcher query."""
        return self._terminated

    @property
    def truncated(self) -> bool:
        """The episode ended by a budget (tokens or context)."""
        return self._truncated

    # ---------------------------------------------------------------------------------------------
    # Public helpers
    def set_reward_step(self, step: int) -> None:
        """Score the episodes that end from now on at training step ``step`` (a trainer calls this every
        step, so a :class:`rewards.schedule.StepReward` such as R1-Searcher's two stages follows it).
        A preset name scores the same at every step."""
        if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"the reward step must be an int >= 0, got {step!r}")
        self._reward_step = int(step)

    @property
    def reward_step(self) -> int:
        """The training step episodes are scored at (see :meth:`set_reward_step`)."""
        return self._reward_step

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
    def check_action(self, action: Any) -> tuple[list[int], bool]:
        """Raise the ``ValueError`` that :meth:`step` would raise for ``action``, changing nothing (a batch
        checks every episode's action before any episode starts its step). Returns the action's ids and
        whether it was a chunk, for :meth:`start_checked_step`."""
        return self._action_ids(action)

    def _action_ids(self, action: Any) -> tuple[list[int], bool]:
        """Checked ids of an action, and whether it was a chunk (rather than one id)."""
        if type(action) is int or isinstance(action, np.integer):
            ids, chunk = [int(action)], False
        elif isinstance(action, (list, tuple)):
            ids, chunk = list(action), True
            kinds = set(map(type, ids))
            if kinds - {int}:
                if not all(kind is not bool and issubclass(kind, (int, np.integer)) for kind in kinds):
                    names = ", ".join(sorted(kind.__name__ for kind in kinds))
                    raise ValueError(f"token ids must be integers, not {names}")
                ids = [int(t) for t in ids]
        elif isinstance(action, np.ndarray) or hasattr(action, "__array__"):
            array = np.asarray(action)
            if array.dtype.kind not in "iu":
                raise ValueError(f"token ids must be integers, not an array of {array.dtype}")
            ids, chunk = array.reshape(-1).tolist(), True
        else:
            raise ValueError(f"an action is a token id (int) or a sequence of ids, not {type(action).__name__}")
        if ids and (min(ids) < 0 or max(ids) >= self._vocab):
            raise ValueError(f"token ids must lie in [0, {self._vocab}) (the action space)")
        return ids, chunk

    def _resume(self, value: Any) -> Request | None:
        try:
            self._request = self._episode.send(value)  # type: ignore[union-attr]
        except StopIteration:
            self._request = None
        return self._request

    def _advance(self, ids: Sequence[int]) -> Episode:
        self._consumed = 0
        n = len(ids)
        i = 0
        while i < n and not self._done:
            room = min(self.max_new_tokens - self._n_new, self.max_context - len(self._ids))
            j = self._scanner.next_attention(ids, i, room, self._buf, self._turn_start)
            if j > i:
                self._append_agent_bulk(ids[i:j])
            if j < n:
                yield from self._agent_token(ids[j])
                j += 1
            i = j
        self._consumed = i

    def _append_agent_bulk(self, ids: Sequence[int]) -> None:
        tb = self._tok_bytes
        base = len(self._buf)
        self._ids.extend(ids)
        self._producers.extend(b"\x01" * len(ids))
        pieces = [tb[t] for t in ids]
        self._ends.extend(x + base for x in accumulate(map(len, pieces)))
        self._buf += b"".join(pieces)
        self._n_new += len(ids)

    #: Prompts kept by :meth:`_prompt` (a dataset's questions; beyond this many, new ones are not kept).
    PROMPTS_KEPT = 100_000

    def _prompt(self, question: str) -> tuple[tuple[int, ...], bytes, tuple[int, ...]]:
        """The prompt's ids, its bytes and each token's end offset in them. Kept per question: a trainer
        resets on the same questions again and again (G samples each), and rendering a chat template and
        encoding it was most of a reset (SmolLM2's template, Search-R1's prompt: 81-84 us per reset
        before, 5-10 us after; the demo's 64-episode batch reset 0.64 -> 0.27 ms)."""
        kept = self._prompts.get(question)
        if kept is not None:
            return kept
        ids = tuple(self.codec.encode(self.render_prompt(question)))
        if len(ids) >= self.max_context:
            raise ValueError(f"the prompt has {len(ids)} tokens, not below max_context={self.max_context}")
        pieces = [self._tok_bytes[t] for t in ids]
        prompt = (ids, b"".join(pieces), tuple(accumulate(map(len, pieces))))
        if len(self._prompts) < self.PROMPTS_KEPT:
            self._prompts[question] = prompt
        return prompt

    def _append_bytes(self, ids: Sequence[int]) -> None:
        tb = self._tok_bytes
        base = len(self._buf)
        pieces = [tb[t] for t in ids]
        self._ends.extend(x + base for x in accumulate(map(len, pieces)))
        self._buf += b"".join(pieces)

    def _agent_token(self, a: int) -> Episode:
        before = len(self._buf)
        self._ids.append(a)
        self._producers.append(AGENT)
        self._buf += self._tok_bytes[a]
        self._ends.append(len(self._buf))
        self._n_new += 1
        if a in self._scanner.eos_ids:
            self._finish("eos", truncated=False)
            return
        if self._scanner.may_close[a]:
            tag, at = self._scanner.completed_tag(self._buf, before, self._turn_start)
            if tag == 1:
                self._close_answer(at)
            elif tag == 0:
                yield from self._close_call(at)
        if not self._done and (self._n_new >= self.max_new_tokens or len(self._ids) >= self.max_context):
            self._finish("max_new_tokens" if self._n_new >= self.max_new_tokens else "max_context", truncated=True)

    def _close_answer(self, at: int) -> None:
        p = self.protocol
        opened = self._buf.rfind(p.answer_open.encode(), self._turn_start, at)
        if opened == -1:
            self._counters["invalid_calls"] += 1
            self._insert(p.invalid_action_text or p.error_text(f"{p.answer_close} without {p.answer_open}"), "error", "invalid_answer")
            return
        self._add_span("answer", opened, at + len(p.answer_close))
        if self._answer_at is None:  # the first answer of the episode is the one recorded
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
        from search_env.dag import format_dag_results, format_violations, parse_plan, validate_plan

        p = self.protocol
        plan = parse_plan(content)
        violations = validate_plan(plan, known_sources=set(self.sources) | set(self.source_aliases))
        if violations:
            self._counters["invalid_plans"] += 1
            self._insert(p.error_text(f"Invalid search plan:\n{format_violations(violations)}"), "error", "invalid_plan")
            return
        call = ToolCall(turn=self._n_searches + 1, kind="dag", content=content, sources=[], k=self.top_k)
        run = yield from self._run_call(call, PlanRequest(plan, self.top_k))
        if run is None:
            return
        call.nodes = [node.to_dict() for node in run.nodes]
        call.sources = sorted({node.source for node in run.nodes})
        call.passage_ids = [ps.id for node in run.nodes for ps in node.passages]
        self._counters["source_errors"] += sum(1 for node in run.nodes if node.error)
        self._counters["queries_cut"] += sum(1 for node in run.nodes if node.query_cut)
        self._insert_results(p.result_prefix, format_dag_results(run, p.format_docs), p.result_suffix)

    def _run_call(self, call: ToolCall, request: Request) -> Generator[Request, Any, Any]:
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
        self.trajectory.spans.append(Span(kind, *token_range(self._ends, byte_start, byte_end)))

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
        context = dict(
            question=traj.question, ended_with_eos=reason == "eos", evidence_model=self.evidence_model,
            judge=self.judge, **self.reward_options,
        )
        if isinstance(self.reward, str):
            result = rewards.score(self.reward, traj.response_text, traj.golden_answers, **context)
        else:
            result = self.reward(traj.response_text, traj.golden_answers, step=self._reward_step, **context)
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
                first, last = token_range(self._ends, pos, end)
                for t in range(first, min(last, len(mask))):
                    mask[t] = 0
                pos = self._buf.find(o, end)
        return mask

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
