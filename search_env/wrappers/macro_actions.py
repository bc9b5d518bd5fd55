"""Macro actions: each turn, choose one of a few candidate calls instead of writing tokens.

Classic RL libraries (Stable-Baselines3 and the like) learn with a small discrete action space and a
fixed-size numeric observation, not a vocabulary-sized action space and a stream of text. This wrapper
gives them the same episodes as an LLM gets: each action stands for a whole search call or answer,
which is written as tokens in the protocol's own tags into the token-level environment, and the
reward is that environment's, so a policy learned here is scored exactly as an LLM policy is.
"""
from __future__ import annotations

import re
import string
from typing import Any, Callable, Iterator

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from numpy.typing import NDArray

from search_env.env import SearchQAEnv
from search_env.synthetic.schema import PASSAGE_TEMPLATES, RELATIONS
from search_env.trajectory import Trajectory
from search_env.types import Action, Info, Observation

__all__ = ["MacroActions"]

# A name of the synthetic world: capitalised words, "of" allowed inside ("University of Zarbo").
_NAME = r"[A-Z]\w*(?: (?:of )?[A-Z]\w*)*"
_VALUE = rf"(?:\d+|{_NAME})"


def _template_regex(template: str, slot: Callable[[str], str]) -> str:
    """``template`` as a regular expression: literal text escaped, each ``{field}`` a named group
    matching ``slot(field)`` (a repeated field must repeat the same text)."""
    parts, seen = [], set()
    for literal, field, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(f"(?P={field})" if field in seen else f"(?P<{field}>{slot(field)})")
            seen.add(field)
    return "".join(parts)


# The question forms of each relation (schema.Relation.ask, e.g. "Who founded {x}?") and its noun
# phrases ("the founder of {x}"), which nest to the right in a chain question.
_ASKS = [(r.name, re.compile(_template_regex(r.ask, lambda _: ".+"))) for r in RELATIONS]
_PHRASES = [(r.name, re.compile(_template_regex(r.phrase, lambda _: ".+"))) for r in RELATIONS if r.phrase]
# The sentences that state facts, one per passage template; their fields are relation names.
_FACT_SENTENCES = [re.compile(r"(?<!\w)" + _template_regex(t, lambda f: _NAME if f == "name" else _VALUE))
                   for t in PASSAGE_TEMPLATES.values()]


def _read_question(question: str) -> tuple[str, tuple[str, ...]]:
    """The subject of a chain question and its relations, innermost first: "Where did the founder of
    Xingu Group study?" is ("Xingu Group", ("founded_by", "studied_at")). ("", ()) for any other question."""
    text = question.strip()
    for relation, ask in _ASKS:
        match = ask.fullmatch(text)
        if match is None:
            continue
        described, relations = match["x"], [relation]
        while (peeled := _peel(described)) is not None:
            inner, described = peeled
            relations.insert(0, inner)
        if re.fullmatch(_NAME, described):
            return described, tuple(relations)
    return "", ()


def _peel(described: str) -> tuple[str, str] | None:
    """The relation of the noun phrase ``described`` and what it is about: "the founder of Xingu Group"
    is ("founded_by", "Xingu Group"); None when ``described`` is no such phrase."""
    for relation, phrase in _PHRASES:
        match = phrase.fullmatch(described)
        if match is not None:
            return relation, match["x"]
    return None


def _read_facts(text: str) -> Iterator[tuple[str, str, str]]:
    """The (subject, relation, value) facts that ``text`` states, in order of appearance."""
    found = sorted((m for sentence in _FACT_SENTENCES for m in sentence.finditer(text)), key=lambda m: m.start())
    for match in found:
        for relation, value in match.groupdict().items():
            if relation != "name":
                yield match["name"], relation, value


#: Features of one value slot: present, bridge, answer, asked relation, searched before, named by the question.
SLOT_FEATURES = 6


class MacroActions(gym.Wrapper[NDArray[np.float32], np.int64, Observation, Action], gym.utils.RecordConstructorArgs):
    """A SearchQA environment as a choice among ``2 + 2 * slots`` candidate calls per turn, observed as
    a vector of ``max_steps + 6 * slots`` numbers in [0, 1].

    Actions:

    * 0: search the question's subject (the name the question asks about);
    * 1: search the question as written (the query of a retrieve-then-answer baseline);
    * ``2 + i``: search the i-th value of the last results; ``2 + slots + i``: answer with it.

    The values of the last results are the names and numbers their passages state as facts: those
    stated by a relation the question asks about first, then the others, each group in order of
    appearance; the first ``slots`` are offered. A candidate with nothing behind it (no subject read,
    fewer values than slots) writes an empty call, which the environment answers as it answers any
    agent's (an error observation for a search, a wrong answer), so every action is always legal:
    Stable-Baselines3's PPO has no action masks.

    Observation: the turn, one-hot over ``max_steps``; then per value slot whether it holds a value,
    whether that value is a bridge (the answer of an inner hop of the question, following the facts
    read so far from its subject) or the answer (of its last hop), whether a relation the question asks
    about (by name) states it, whether it was searched before and whether the question names it. These
    are what a reader of the text can tell, and all a policy needs for the multi-hop strategy (search
    the subject, search each bridge, answer; :meth:`scripted_action` plays it), while choosing blindly
    among the candidates mostly fails.

    Reading: the question and the results are read with the phrasing of the synthetic world
    (:mod:`search_env.synthetic.schema`), from the text the agent sees (the results are taken from the
    trajectory's result spans, so an observation wrapper inside this one changes nothing); the gold
    answers and decomposition are never looked at. Chain questions are read; for another question
    (yes/no, comparison, another dataset's) the subject and the bridge and answer flags stay empty.

    An episode that has not answered after ``max_steps`` turns is truncated (reward 0), so a 2-hop
    question needs ``max_steps >= 3``. ``info`` is the inner environment's; :attr:`candidates` shows
    the text each action writes now.

    Args:
        env: a SearchQA environment (wrapped or not) whose protocol takes single-query calls.
        slots: how many values of the last results are offered to search or to answer.
        max_steps: turns per episode.
    """

    def __init__(self, env: gym.Env[Observation, Action], slots: int = 3, max_steps: int = 4) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, slots=slots, max_steps=max_steps)  # env.spec can remake it
        gym.Wrapper.__init__(self, env)
        base = env.unwrapped
        if not isinstance(base, SearchQAEnv):
            raise TypeError(f"MacroActions wraps a SearchQA environment, not {type(base).__name__}")
        if base.protocol.call_kind != "query":
            raise ValueError(f"MacroActions writes single-query calls; protocol {base.protocol.name!r} takes NL-DAG plans")
        if slots < 1 or max_steps < 1:
            raise ValueError(f"slots and max_steps must be >= 1, got slots={slots}, max_steps={max_steps}")
        self.slots, self.max_steps = int(slots), int(max_steps)
        self.action_space = spaces.Discrete(2 + 2 * self.slots)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(self.max_steps + SLOT_FEATURES * self.slots,), dtype=np.float32)
        self._base = base
        self._question = self._subject = ""
        self._relations: tuple[str, ...] = ()
        self._facts: dict[tuple[str, str], str] = {}  # (subject, relation) -> value, read this episode
        self._last: list[tuple[str, str, str]] = []  # the facts of the last results
        self._searched: set[str] = set()
        self._turn = 0
        self._done = True
        self._calls: list[tuple[str, str | None]] = []  # per action: its text, and its query if a search

    @property
    def candidates(self) -> tuple[str, ...]:
        """The text each action writes now (action ``i`` writes ``candidates[i]``)."""
        return tuple(text for text, _ in self._calls)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[NDArray[np.float32], Info]:
        """Start an episode of the inner environment (``options`` pick the question as there)."""
        _, info = self.env.reset(seed=seed, options=options)
        self._question = info["question"]
        self._subject, self._relations = _read_question(self._question)
        self._facts, self._last, self._searched = {}, [], set()
        self._turn, self._done = 0, False
        return self._observe(), info

    def step(self, action: np.int64 | int) -> tuple[NDArray[np.float32], float, bool, bool, Info]:
        """Write candidate ``action``'s call into the inner environment and read what came back."""
        if self._done:
            raise gym.error.ResetNeeded("step() called on a finished episode (or before reset()); call reset()")
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is outside the action space Discrete({self.action_space.n})")
        text, query = self._calls[int(action)]
        ids = self._base.codec.encode(text)
        if query is None and not self._base.protocol.answer_ends_episode:
            ids.append(min(self._base.codec.eos_ids))  # the answer ends the episode only with end-of-sequence
        trajectory = self._base.trajectory
        spans_before = len(trajectory.spans)
        _, reward, terminated, truncated, info = self.env.step(ids)
        self._turn += 1
        if query is not None:
            self._searched.add(query)
        self._read_results(trajectory, spans_before)
        truncated = truncated or (not terminated and self._turn >= self.max_steps)
        self._done = terminated or truncated
        return self._observe(), float(reward), terminated, truncated, info

    def scripted_action(self, observation: NDArray[np.float32]) -> int:
        """The multi-hop strategy the observation is made for, read off ``observation`` alone: answer
        with the value flagged as the answer, else search a bridge not searched yet, else search the
        question's subject. A scripted baseline, and a check that the observation says enough."""
        slots = np.asarray(observation[self.max_steps:]).reshape(self.slots, SLOT_FEATURES) > 0
        present, bridge, answer, searched = slots[:, 0], slots[:, 1], slots[:, 2], slots[:, 4]
        if (present & answer).any():
            return 2 + self.slots + int(np.argmax(present & answer))
        if (present & bridge & ~searched).any():
            return 2 + int(np.argmax(present & bridge & ~searched))
        return 0

    def _read_results(self, trajectory: Trajectory, spans_before: int) -> None:
        """Read the facts of the results appended since span ``spans_before`` (none after an error)."""
        ids = trajectory.token_ids
        texts = [self._base.codec.decode(ids[span.start:span.end]) for span in trajectory.spans[spans_before:] if span.kind == "result"]
        self._last = [fact for text in texts for fact in _read_facts(text)]
        self._facts.update(((subject, relation), value) for subject, relation, value in self._last)

    def _observe(self) -> NDArray[np.float32]:
        """Offer the candidates of the next step (their calls) and return the observation."""
        hops = self._resolved()
        inner = hops[: len(self._relations) - 1]  # the bridges found so far
        answer = hops[-1] if self._relations and len(hops) == len(self._relations) else None
        asked: dict[str, bool] = {}  # value -> stated by a relation the question asks about
        for _, relation, value in self._last:
            asked[value] = asked.get(value, False) or relation in self._relations
        values = sorted(asked, key=lambda value: not asked[value])[: self.slots]

        observation = np.zeros(self.observation_space.shape, dtype=np.float32)
        observation[min(self._turn, self.max_steps - 1)] = 1.0
        for i, value in enumerate(values):
            flags = (True, value in inner, value == answer, asked[value], value in self._searched, value in self._question)
            start = self.max_steps + SLOT_FEATURES * i
            observation[start:start + SLOT_FEATURES] = flags

        offered = values + [""] * (self.slots - len(values))
        self._calls = [(self._call(self._subject), self._subject), (self._call(self._question), self._question)]
        self._calls += [(self._call(value), value) for value in offered]
        self._calls += [(self._answer(value), None) for value in offered]
        return observation

    def _resolved(self) -> list[str]:
        """The answers of the question's hops that the facts read so far give, from its subject on."""
        hops, subject = [], self._subject
        for relation in self._relations:
            value = self._facts.get((subject, relation))
            if value is None:
                break
            hops.append(value)
            subject = value
        return hops

    def _call(self, query: str) -> str:
        protocol = self._base.protocol
        return f"{protocol.call_open} {query} {protocol.call_close}"

    def _answer(self, value: str) -> str:
        protocol = self._base.protocol
        return f"{protocol.answer_prefix}{protocol.answer_open} {protocol.answer_template.format(answer=value)} {protocol.answer_close}"
