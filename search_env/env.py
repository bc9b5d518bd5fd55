"""SearchQA-v0: question answering with search as a token-level POMDP.

The agent emits token ids; the environment keeps the exact ids (token-in/token-out) and the bytes they
stand for (:class:`~search_env.episode.EpisodeBuffer`), and watches that byte stream for the
protocol's close tags. How a tag changes the episode is the transition (:mod:`search_env.transition`):
a closed search call hands out a request (:mod:`search_env.searching`) whose results are appended as
environment tokens; a closed answer (or an end-of-sequence token) ends the episode, and the reward is
computed here, once, from :mod:`rewards`. :mod:`search_env.types` says what an action, an observation
and a step result are; :mod:`search_env.resolve` turns the constructor's arguments into sources,
examples and a reward.

Speed: a token that cannot complete a tag (decided once per vocabulary entry) costs a few list appends.
A chunk of ids (an LLM's generation up to a stop string) is appended in bulk and searched once for the
first place where something happens (:meth:`~search_env.transition.Transition.advance`), so a chunk
gives exactly the episode that feeding its ids one by one gives, at a fixed cost of a few calls.

Batched stepping. ``step`` answers each request at once with this environment's
:class:`~search_env.searching.Searcher`. Callers that step many episodes together
(:class:`search_env.vector.BatchSearchQAEnv`) use the same four public pieces instead:
:meth:`SearchQAEnv.start_step`, :attr:`SearchQAEnv.pending_request`, :meth:`SearchQAEnv.take_results`
and :meth:`SearchQAEnv.finish_step`, and answer everyone's pending requests in one round.

NL-DAG plans (``call_kind="dag"``): two sets of rules read a plan, on purpose. The environment runs
any plan that :func:`~search_env.dag.validate.validate_plan` accepts and answers any other with an
error observation listing the violations. The ``reasoning-search`` reward scores the plan by the
reference's strict reading (:mod:`rewards.dag`: at most 6 nodes, its own line grammar), with this
environment's source and alias names as its tool list (the ``tools`` option, filled in here), so a
plan the environment ran is never scored ``unknown_tool``.
"""
from __future__ import annotations

from functools import partial
from itertools import accumulate
from typing import Any, Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rewards.registry import score
from rewards.result import RewardResult
from rewards.schedule import StepReward

from search_env.data.example import QAExample
from search_env.episode import EpisodeBuffer, Prompt
from search_env.protocols import Dialect, get_protocol
from search_env.resolve import (
    guard_sources, offer_plan_tools, resolve_budget, resolve_dataset, resolve_reward, resolve_source_names, resolve_sources,
)
from search_env.searching import MAX_QUERY_CHARS, PlanRequest, Request, Searcher, SearchRequest
from search_env.sources.base import Source
from search_env.tokenization import TokenCodec, as_codec
from search_env.tool_calls import fit_protocol
from search_env.trajectory import AGENT, ENVIRONMENT, Trajectory
from search_env.transition import Call, Stepping, Transition
from search_env.types import Action, Info, Observation, StepResult, action_ids, observation_space

__all__ = ["SearchQAEnv", "SearchRequest", "PlanRequest", "Request", "MAX_QUERY_CHARS", "prompt_text"]


def prompt_text(protocol: Dialect, codec: TokenCodec, question: str, *, use_chat: bool | None = None) -> str:
    """The prompt an episode of ``question`` starts from: the protocol's messages in the codec's chat
    template (``use_chat``; ``None``: when the codec has one), else the protocol's plain prompt. A
    function of its own so that a run can measure its prompts before it builds an environment or a model."""
    if codec.chat_template if use_chat is None else use_chat:
        return codec.render_chat(protocol.messages(question), tools=protocol.chat_tools) + protocol.assistant_prefix
    return protocol.plain_prompt(question)

_AGENT_ONLY = (AGENT,)
_STEP_IN_PROGRESS = "a step is in progress: give it its results (take_results) and finish it (finish_step)"


class SearchQAEnv(gym.Env[Observation, Action]):
    """A token-level environment for answering questions with search (see the module docstring).

    Args:
        protocol: a registered protocol name (``search-r1``, ``r1-searcher``, ``research``, ``r-search``,
            ``reasoning-search``) or a :class:`~search_env.protocols.Dialect`.
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
        max_turns: searches per episode, further calls get an error observation (None, the default:
            the protocol's :attr:`~search_env.protocols.Dialect.max_turns`, None there meaning
            unlimited; ``protocol.with_options(max_turns=None)`` lifts a protocol's budget).
        max_context: total tokens (prompt included) before truncation.
        max_result_tokens: cap on the document tokens of one result block (its prefix and closing
            suffix are kept).
        top_k: passages per query (None, the default: the protocol's).
        cache_size: wrap every source in an LRU cache of this many (query, k) entries (0: no cache).
        source_timeout_s: per-call time limit of every source; a late call becomes an error observation.
        chat_template: render the prompt with the tokenizer's chat template (``None``: when it has one).
        world_seed / world_size: seed and question count of the synthetic world.

    The settings are read once, at construction (the transition keeps them).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    #: Prompts kept by :meth:`_prompt` (a dataset's questions; beyond this many, new ones are not kept).
    PROMPTS_KEPT = 100_000

    def __init__(
        self,
        protocol: str | Dialect = "search-r1",
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
        max_turns: int | None = None,
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
        protocol = get_protocol(protocol)
        self.max_turns = resolve_budget("max_turns", max_turns, protocol.max_turns, low=0)
        self.top_k: int = resolve_budget("top_k", top_k, protocol.top_k, low=1)  # type: ignore[assignment]
        self.max_new_tokens = int(max_new_tokens)
        self.max_context = int(max_context)
        self.max_result_tokens = max_result_tokens
        self.codec: TokenCodec = as_codec(tokenizer)
        self.examples, world = resolve_dataset(dataset, world_seed, world_size)
        self.sources = guard_sources(resolve_sources(sources, world), cache_size, source_timeout_s)
        self.source_aliases, self.default_source = resolve_source_names(self.sources, default_source, source_aliases)
        self.searcher = Searcher(self.sources, self.source_aliases)  #: answers this environment's search requests
        self.protocol = offer_plan_tools(protocol, self.sources, self.source_aliases)
        plan_names = sorted(set(self.sources) | set(self.source_aliases))
        self.reward, self.reward_options = resolve_reward(self.protocol, reward, reward_options, plan_names)
        # The scorer of an episode's end. A preset name scores the same at every step: rewards.score is
        # called on it directly, which is all rewards.Preset(name) does, without that layer's keyword
        # repacking (a good part of an answer turn's cost). A StepReward is called with the training step.
        self._score: Callable[..., RewardResult] = (
            partial(score, self.reward) if isinstance(self.reward, str) else self._score_at_step
        )
        self.evidence_model, self.judge = evidence_model, judge
        self._reward_step = 0
        self.use_chat = bool(self.codec.chat_template) if chat_template is None else chat_template
        if self.use_chat and not self.codec.chat_template:
            raise ValueError("chat_template=True but the tokenizer has no chat template")
        if self.protocol.tool_calling is not None:  # its tools are these sources, its turns this tokenizer's
            self.protocol = fit_protocol(self.protocol, self.sources, self.default_source, self.codec, self.use_chat)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', not {render_mode!r}")
        self.render_mode = render_mode

        self._vocab = self.codec.vocab_size
        self.action_space = spaces.Discrete(self._vocab)
        self.observation_space = observation_space(self._vocab)
        self._transition = Transition(
            self.protocol, self.codec, max_new_tokens=self.max_new_tokens, max_context=self.max_context,
            max_turns=self.max_turns, top_k=self.top_k, default_source=self.default_source, plan_sources=plan_names,
            max_result_tokens=max_result_tokens,
        )
        self._token_bytes = self.codec.token_bytes
        self._attention = self._transition.scanner.attention  # per id: may it make something happen
        self._prompts: dict[str, Prompt] = {}  # see _prompt
        self._episode: EpisodeBuffer | None = None  # the current (or last) episode's record
        # The step in progress (see start_step), kept in plain attributes: a batch starts one per
        # episode and token, so an object per step would cost the batched token step measurably.
        self._in_step = False  # a step has started and not finished (start_step ... finish_step)
        self._stepping: Stepping | None = None  # the transition, paused at a request; None: none waits
        self._request: Request | None = None  # the request it waits on
        self._step_start = 0  # the token index where the step's observation begins
        self._step_chunk = False  # the action was a chunk (its info reports "consumed")
        self._consumed = 0  # ids of the action used, once the step has run to its end

    # ---------------------------------------------------------------------------------------------
    # Gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, Info]:
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
        self._episode = EpisodeBuffer(example, self.protocol.name, self._prompt(example.question))
        self._in_step = False
        self._stepping = self._request = None
        return self.first_observation(example)

    def first_observation(self, example: QAExample) -> tuple[Observation, Info]:
        """What :meth:`reset` returns for ``example`` (the prompt's ids and the info), without starting an
        episode: an :class:`~search_env.worker.EnvWorker` answers a reset with it while its worker resets."""
        prompt_ids = self._prompt(example.question)[0]
        obs: Observation = {"token_ids": prompt_ids, "producers": (ENVIRONMENT,) * len(prompt_ids)}
        return obs, {"question": example.question, "example_id": example.id, "prompt_length": len(prompt_ids)}

    def step(self, action: Action) -> StepResult:
        """Feed one token id (an ``int`` or numpy integer), or a chunk of ids (a list, tuple or integer
        array), and get what became visible. Anything else (a float, a str, bools) is a ``ValueError``.

        A chunk gives exactly the episode that feeding its ids one at a time gives: the observation is
        the concatenation, the reward the sum, ``info`` the last step's with ``events`` listing every
        event in order, and ``info["consumed"]`` the number of ids used (ids after the episode's end
        are ignored). The step that ends the episode reports ``trajectory``, ``reward_components``,
        ``answer`` and ``end_reason`` in ``info``.
        """
        ep = self._episode
        if ep is None or ep.end_reason is not None:
            raise gym.error.ResetNeeded("step() called on a finished episode (or before reset()); call reset()")
        if type(action) is int or (type(action) is not list and isinstance(action, np.integer)):  # a chunk skips the numpy check
            a = int(action)
            if a < 0 or a >= self._vocab:
                raise ValueError(f"token id {a} is outside the action space Discrete({self._vocab})")
            if not self._attention[a]:
                # Fast path: nothing can happen at this token but a budget running out.
                ep.ids.append(a)
                ep.producers.append(AGENT)
                text = ep.text
                text += self._token_bytes[a]
                ep.ends.append(len(text))
                ep.n_new += 1
                if ep.n_new < self.max_new_tokens and len(ep.ids) < self.max_context:
                    return {"token_ids": (a,), "producers": _AGENT_ONLY}, 0.0, False, False, {}
                ep.end("max_new_tokens" if ep.n_new >= self.max_new_tokens else "max_context", truncated=True)
                self._finish(ep)
                return self._step_result(ep, len(ep.ids) - 1, None)
        if type(action) is list:  # a sampler's chunk: plain ints in range are used as they are, uncopied (see below)
            vocab = self._vocab
            for t in action:
                if type(t) is not int or t < 0 or t >= vocab:
                    ids, chunk = action_ids(action, vocab)  # converts numpy ids, or raises with its message
                    break
            else:
                ids, chunk = action, True
        else:
            ids, chunk = action_ids(action, self._vocab)
        if self._in_step:
            raise RuntimeError(_STEP_IN_PROGRESS)
        start = len(ep.ids)
        # ``ids`` may be the caller's list: it is only read, and only until this call returns (the step's
        # searches are answered within it), so it needs no copy. start_step copies (action_ids does), as
        # its caller holds the step open across calls.
        used, call = self._transition.advance(ep, ids)
        if call is None:  # no search call closed (an answer turn, most chunks): no step to hold open
            if ep.end_reason is not None:
                self._finish(ep)
            return self._step_result(ep, start, used if chunk else None, ids)
        request = self._hold(ep, start, chunk, ids, used, call)
        while request is not None:
            request = self.take_results(self.searcher.answer({0: request})[0])
        return self.finish_step()

    def render(self) -> str | None:
        """The episode's text so far (prompt, agent text and observations)."""
        if self.render_mode == "ansi" and self._episode is not None:
            return self._episode.decode(0)
        return None

    def close(self) -> None:
        """Close the sources (and the threads that run NL-DAG plans)."""
        self.searcher.close()

    # ---------------------------------------------------------------------------------------------
    # Batched stepping: step() in four pieces, for callers that answer many episodes' requests at once
    def check_action(self, action: Any) -> tuple[list[int], bool]:
        """Raise the ``ValueError`` that :meth:`step` would raise for ``action``, changing nothing (a batch
        checks every episode's action before any episode starts its step). Returns the action's ids and
        whether it was a chunk, for :meth:`start_checked_step`."""
        return action_ids(action, self._vocab)

    def start_step(self, action: Action) -> Request | None:
        """Begin a step with ``action`` (checked as :meth:`step` checks it): the agent's tokens are taken
        up to the first search call they close, whose request is returned. None: the step needs no
        search, call :meth:`finish_step`."""
        return self.start_checked_step(*action_ids(action, self._vocab))

    def start_checked_step(self, ids: list[int], chunk: bool) -> Request | None:
        """:meth:`start_step` for an action already checked: ``ids`` and ``chunk`` as :meth:`check_action`
        returns them (a batch checks every episode's action first and need not check it twice)."""
        ep = self._episode
        if ep is None or ep.end_reason is not None:
            raise gym.error.ResetNeeded("start_step() called on a finished episode (or before reset()); call reset()")
        if self._in_step:
            raise RuntimeError(_STEP_IN_PROGRESS)
        self._in_step = True
        start = len(ep.ids)
        used, call = self._transition.advance(ep, ids)
        if call is not None:
            return self._hold(ep, start, chunk, ids, used, call)
        self._step_start, self._step_chunk, self._consumed = start, chunk, used  # the step has run to its end
        if ep.end_reason is not None:
            self._finish(ep)
        return None

    def _hold(self, ep: EpisodeBuffer, start: int, chunk: bool, ids: list[int], used: int, call: Call) -> Request | None:
        """Hold open a step whose search call closed (``ids`` taken up to ``used``; the step's observation
        begins at token ``start``), and run it on to the call's request."""
        self._in_step, self._step_start, self._step_chunk = True, start, chunk
        self._stepping = stepping = self._transition.with_calls(ep, ids, used, call)
        return self._resume(ep, stepping, None)

    @property
    def pending_request(self) -> Request | None:
        """The search request the step in progress waits on (None when it waits on nothing)."""
        return self._request

    def take_results(self, results: Any) -> Request | None:
        """Give the pending request its results (see :class:`SearchRequest` and :class:`PlanRequest`; an
        exception becomes an error observation). The step goes on to its next call, whose request is
        returned, or to its end (None: call :meth:`finish_step`)."""
        stepping, ep = self._stepping, self._episode
        if stepping is None or self._request is None or ep is None:
            raise RuntimeError("no search request is pending: call start_step() first")
        return self._resume(ep, stepping, results)

    def finish_step(self) -> StepResult:
        """End the step in progress and return what :meth:`step` returns for it."""
        ep = self._episode
        if not self._in_step or ep is None:
            raise RuntimeError("no step in progress: call start_step() first")
        if self._request is not None:
            raise RuntimeError("the step still waits on its search request: call take_results() first")
        self._in_step = False
        return self._step_result(ep, self._step_start, self._consumed if self._step_chunk else None)

    def _resume(self, ep: EpisodeBuffer, stepping: Stepping, value: Any) -> Request | None:
        """Run the step on to its next request (sending ``value``, the last request's results); at its
        end, score the episode if it ended."""
        try:
            self._request = stepping.send(value)
        except StopIteration as stop:
            self._stepping = self._request = None
            self._consumed = stop.value
            if ep.end_reason is not None:
                self._finish(ep)
        return self._request

    # ---------------------------------------------------------------------------------------------
    # State and helpers
    @property
    def done(self) -> bool:
        """True before the first reset and once the episode has ended (step() then needs reset())."""
        return self._episode is None or self._episode.end_reason is not None

    @property
    def terminated(self) -> bool:
        """The episode ended by an answer, EOS or an empty R1-Searcher query."""
        ep = self._episode
        return ep is not None and ep.end_reason is not None and not ep.truncated

    @property
    def truncated(self) -> bool:
        """The episode ended by a budget (tokens or context)."""
        return self._episode is not None and self._episode.truncated

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
        return prompt_text(self.protocol, self.codec, question, use_chat=self.use_chat)

    @property
    def example(self) -> QAExample:
        """The current (or last) episode's question."""
        return self._record().example

    @property
    def response_text(self) -> str:
        """Everything after the prompt so far: agent text and the observations inserted into it."""
        ep = self._record()
        return ep.decode(ep.prompt_bytes)

    @property
    def trajectory(self) -> Trajectory:
        """The current (or last) episode's record."""
        return self._record().trajectory

    def _record(self) -> EpisodeBuffer:
        if self._episode is None:
            raise RuntimeError("no episode yet: call reset()")
        return self._episode

    def _prompt(self, question: str) -> Prompt:
        """The prompt's ids, its bytes and each token's end offset in them. Kept per question: a trainer
        resets on the same questions again and again (G samples each), and rendering a chat template
        and encoding it was most of a reset."""
        kept = self._prompts.get(question)
        if kept is not None:
            return kept
        ids = tuple(self.codec.encode(self.render_prompt(question)))
        if len(ids) >= self.max_context:
            raise ValueError(f"the prompt has {len(ids)} tokens, not below max_context={self.max_context}")
        pieces = [self._token_bytes[t] for t in ids]
        prompt = (ids, b"".join(pieces), tuple(accumulate(map(len, pieces))))
        if len(self._prompts) < self.PROMPTS_KEPT:
            self._prompts[question] = prompt
        return prompt

    # ---------------------------------------------------------------------------------------------
    # The end of an episode: the reward, computed once
    def _finish(self, ep: EpisodeBuffer) -> None:
        traj = ep.complete(self.protocol)
        eos = ep.end_reason == "eos"
        if self.reward_options:
            result = self._score(traj.response_text, traj.golden_answers, question=traj.question, ended_with_eos=eos,
                                 evidence_model=self.evidence_model, judge=self.judge, **self.reward_options)
        else:  # spelled out: an empty **options still builds a keyword dict per call, a measurable part of an answer turn
            result = self._score(traj.response_text, traj.golden_answers, question=traj.question, ended_with_eos=eos,
                                 evidence_model=self.evidence_model, judge=self.judge)
        traj.reward = float(result.total)
        traj.reward_components = dict(result.components)
        ep.events.append({"event": "end", "token_index": len(ep.ids)})  # ep.event("end"), inline

    def _score_at_step(self, response: str, golden_answers: list[str], **kwargs: Any) -> RewardResult:
        """Score with the StepReward at the training step set by :meth:`set_reward_step`."""
        return self.reward(response, golden_answers, step=self._reward_step, **kwargs)  # type: ignore[operator]

    def _step_result(self, ep: EpisodeBuffer, start: int, consumed: int | None, ids: list[int] | None = None) -> StepResult:
        """What the step that began at token ``start`` made visible, and the episode's end if it came.
        ``consumed``: how many ids of the chunk ``ids`` the step used (None for one id)."""
        if consumed is not None and len(ep.ids) - start == consumed:
            # A chunk's step appends the ids it uses as agent tokens, so when no observation came (no result,
            # no error) its tokens are those ids, every one the agent's: no slices of the record are needed.
            obs: Observation = {"token_ids": tuple(ids) if ids is not None and consumed == len(ids) else tuple(ep.ids[start:]),
                                "producers": _AGENT_ONLY * consumed}
        else:
            obs = {"token_ids": tuple(ep.ids[start:]), "producers": tuple(ep.producers[start:])}
        events = ep.events
        if ep.end_reason is None:
            info: Info = {} if consumed is None else {"consumed": consumed}
            if events:  # the step's events, leaving none for the next step
                info["events"], ep.events = events, []
            return obs, 0.0, False, False, info
        # The episode's end: the same keys in the same order, the dict built at once.
        traj = ep.trajectory
        if consumed is not None and events:
            ep.events = []
            info = {"consumed": consumed, "events": events, "trajectory": traj, "reward_components": traj.reward_components,
                    "answer": traj.answer, "end_reason": traj.end_reason}
        else:
            info = {} if consumed is None else {"consumed": consumed}
            if events:
                info["events"], ep.events = events, []
            info["trajectory"], info["reward_components"] = traj, traj.reward_components
            info["answer"], info["end_reason"] = traj.answer, traj.end_reason
        return obs, traj.reward, not ep.truncated, ep.truncated, info
