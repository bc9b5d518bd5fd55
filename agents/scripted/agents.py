"""Scripted agents: baselines and the test harness, driving the environment through its public API.

Each agent writes text in the protocol's own dialect (:class:`DialectWriter`) and hands it to the
environment as a chunk of token ids, exactly like an LLM rollout that stops at the protocol's stop
strings. A turn of native tool calls (the ``tool-calls`` protocols) ends with the end-of-sequence id,
as a chat model ends its turn, since the calls run when the turn ends (:func:`ends_turn`). They differ
in what they write:

* :class:`OracleAgent` follows the gold decomposition (one search per sub-question, parents' gold
  answers substituted; with native tool calls, all of them as parallel calls in one turn), or where
  there is none searches for the gold passages, and answers with the gold answer: the ceiling of a
  protocol and a check that the environment, sources and reward agree;
* :class:`RetrieveThenAnswerAgent` searches the question once and answers with the top passage's title;
* :class:`NoSearchAgent` answers at once from the question alone.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from search_env.data.example import QAExample, SubQuestion
from search_env.protocols import Dialect
from search_env.trajectory import Trajectory

__all__ = ["DialectWriter", "ScriptedAgent", "OracleAgent", "RetrieveThenAnswerAgent", "NoSearchAgent", "ends_turn",
           "gold_contexts", "run_episode"]

_DAG_TOOLS = {"wiki": "General", "news": "News", "papers": "Academy"}
#: Node labels of the plans the oracle writes for gold passages.
_LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class DialectWriter:
    """Writes thoughts, calls and answers the way a protocol's model is trained to, reading only the
    protocol's data (its tags and writing fields), so a registered dialect is written its own way."""

    protocol: Dialect

    def think(self, text: str) -> str:
        return self.protocol.thought_template.format(text=text)

    def call(self, query: str) -> str:
        """One search call; with native tool calls, a call of the first tool (the default source)."""
        calling = self.protocol.tool_calling
        if calling is not None:
            return calling.write([(calling.default_tool, query)])
        return f"{self.protocol.call_open} {query} {self.protocol.call_close}"

    def tool_calls(self, calls: list[tuple[str | None, str]]) -> str:
        """Native tool calls, run in parallel when the turn ends: (source, query) pairs, a source the
        protocol offers no tool for (or None) going to the first tool."""
        calling = self.protocol.tool_calling
        if calling is None:
            raise ValueError(f"protocol {self.protocol.name!r} has no native tool calls")
        offered = {name for name, _ in calling.tools}
        return calling.write([(source if source in offered else calling.default_tool, query) for source, query in calls])

    def plan(self, nodes: list[tuple[str, str, str | None]], edges: list[tuple[str, str]]) -> str:
        """An NL-DAG call: ``nodes`` are (label, query, source name or None)."""
        lines = ["Nodes:"] + [f"{label}: {query} ({_DAG_TOOLS.get(source or 'wiki', 'General')})" for label, query, source in nodes]
        lines += ["Edges:", " ; ".join(f"{u} -> {v}" for u, v in edges)] if edges else []
        return f"{self.protocol.call_open}\n" + "\n".join(lines) + f"\n{self.protocol.call_close}"

    def answer(self, answer: str, evidence: str | None = None) -> str:
        """The final answer; ``evidence`` goes in an evidence block first where the dialect has one."""
        p = self.protocol
        block = f"{p.evidence_open} {evidence} {p.evidence_close}" if evidence and p.evidence_open else ""
        return f"{p.answer_prefix}{block}{p.answer_open} {p.answer_template.format(answer=answer)} {p.answer_close}"


def ends_turn(protocol: Dialect, text: str | None) -> bool:
    """Whether the end-of-sequence id follows a turn of ``text``: the agent stopped writing, or wrote the
    answer of a protocol whose answer does not end the episode, or native tool calls, which run when
    the turn ends."""
    if not text or (not protocol.answer_ends_episode and protocol.answer_close in text):
        return True
    return protocol.tool_calling is not None and protocol.tool_calling.find(text) is not None


class ScriptedAgent(Protocol):
    """What :func:`run_episode` needs of an agent: ``start`` sees the example (only an oracle may
    look past the question), ``next_text`` returns the next chunk given the last observation's text
    (None or "" to stop, which sends the end-of-sequence token)."""

    def start(self, example: QAExample) -> None: ...

    def next_text(self, writer: DialectWriter, observation_text: str) -> str | None: ...


def run_episode(env: Any, agent: ScriptedAgent, *, seed: int | None = None, options: dict | None = None, max_chunks: int = 32) -> Trajectory:
    """Run one episode of ``agent`` in ``env`` (a SearchQA env, wrapped or not) and return its record.

    Text chunks are encoded once and stepped as id chunks; an agent that stops writing gets the
    end-of-sequence token, which ends the episode. What the environment appended after a chunk is
    read from the episode's trajectory, not from the observation, which an observation wrapper may
    have turned into a window or the whole context.
    """
    base = env.unwrapped
    writer = DialectWriter(base.protocol)
    env.reset(seed=seed, options=options)
    agent.start(base.example)
    observation_text = ""
    for _ in range(max_chunks):
        text = agent.next_text(writer, observation_text)
        ids = base.codec.encode(text) if text else []
        if ends_turn(base.protocol, text):
            ids = ids + [min(base.codec.eos_ids)]
        appended_from = len(base.trajectory.token_ids) + len(ids)
        _, _, terminated, truncated, _ = env.step(ids)
        if terminated or truncated:
            break
        observation_text = base.codec.decode(base.trajectory.token_ids[appended_from:])
    else:
        raise RuntimeError(f"{type(agent).__name__} did not finish an episode within {max_chunks} chunks")
    return base.trajectory


class OracleAgent:
    """Searches every sub-question of the gold decomposition that needs a search (parents' gold
    answers substituted) and answers with the gold answer.

    A sub-question needs a search unless the dataset names the sources of its sub-questions and
    names none for this one, which has parents: the synthetic world's comparisons and yes/no checks,
    answered from their parents' answers. MuSiQue names no sources, so each of its steps is searched.

    A question without a decomposition but with gold passages (HotpotQA, 2Wiki and PopQA rows'
    supporting contexts, :func:`gold_contexts`) is answered after one search per gold passage, by its
    title - under an NL-DAG protocol, a plan of one node per passage - so the oracle shows what finding
    the gold passages earns; the evidence it cites is their text. A question with neither is answered
    at once.
    """

    def start(self, example: QAExample) -> None:
        self._example = example
        contexts = [] if example.decomposition else gold_contexts(example)
        if contexts:
            self._queue = [SubQuestion(label, c["title"], "") for label, c in zip(_LABELS, contexts)]
            self._evidence = " ".join(c["text"] for c in contexts)
        else:
            names_sources = any(n.source is not None for n in example.decomposition)
            self._queue = [n for n in example.decomposition if n.source is not None or not n.parents or not names_sources]
            self._evidence = " ".join(n.answer for n in example.decomposition)
        self._planned = False

    def next_text(self, writer: DialectWriter, observation_text: str) -> str | None:
        ex = self._example
        answers = {n.label: n.answer for n in ex.decomposition}
        if writer.protocol.call_kind == "dag":
            if self._planned:
                return writer.answer(ex.golden_answers[0])
            self._planned = True
            nodes = [(n.label, _substitute(n.query, answers), n.source) for n in self._queue]
            known = {n.label for n in self._queue}
            edges = [(p, n.label) for n in self._queue for p in n.parents if p in known]
            return writer.think("I plan the sub-questions.") + writer.plan(nodes, edges)
        if self._queue and writer.protocol.tool_calling is not None:
            calls = [(n.source, _substitute(n.query, answers)) for n in self._queue]
            self._queue = []
            return writer.think("I search every sub-question at once.") + "\n" + writer.tool_calls(calls)
        if self._queue:
            node = self._queue.pop(0)
            return writer.think(f"I need: {node.query}") + writer.call(_substitute(node.query, answers))
        return writer.think("I have what I need.") + writer.answer(ex.golden_answers[0], evidence=self._evidence)


def gold_contexts(example: QAExample) -> list[dict[str, Any]]:
    """The example's supporting contexts (``metadata["contexts"]`` rows flagged ``is_supporting``, as
    the FlashRAG loaders keep them), one per title, in the dataset's order."""
    contexts = example.metadata.get("contexts") or []
    kept: dict[str, dict[str, Any]] = {}
    for context in contexts:
        if context.get("is_supporting") and context.get("title") and context["title"] not in kept:
            kept[context["title"]] = context
    return list(kept.values())


class RetrieveThenAnswerAgent:
    """One search with the question, then the top passage's title as the answer."""

    def start(self, example: QAExample) -> None:
        self._question = example.question
        self._searched = False

    def next_text(self, writer: DialectWriter, observation_text: str) -> str | None:
        if not self._searched:
            self._searched = True
            if writer.protocol.call_kind == "dag":
                return writer.think("One lookup.") + writer.plan([("A", _keywords(self._question), None)], [])
            return writer.think("Let me search.") + writer.call(_keywords(self._question))
        title = _top_title(observation_text) or "unknown"
        return writer.think("The top result names it.") + writer.answer(title, evidence=observation_text.strip()[:300])


class NoSearchAgent:
    """Answers from the question alone: "yes" to yes/no questions, else its last capitalised name."""

    def start(self, example: QAExample) -> None:
        self._question = example.question

    def next_text(self, writer: DialectWriter, observation_text: str) -> str | None:
        q = self._question.strip()
        if re.match(r"^(is|was|are|were|did|does|do|has|have)\b", q, re.IGNORECASE):
            guess = "yes"
        else:
            names = re.findall(r"\b[A-Z][a-z]+(?: [A-Z][a-z]+)*", q[1:])
            guess = names[-1] if names else "unknown"
        return writer.think("I answer from memory.") + writer.answer(guess)


def _substitute(query: str, answers: dict[str, str]) -> str:
    return re.sub(r"\{([A-Z])\}", lambda m: answers.get(m.group(1), m.group(0)), query)


def _keywords(question: str) -> str:
    return question.strip().rstrip("?")


_TITLE_PATTERNS = (re.compile(r"Title: ([^)\n]+)\)"), re.compile(r"^\(1\)([^\n]+)$", re.M), re.compile(r"<result>\n([^\n]+)\n"))


def _top_title(observation_text: str) -> str | None:
    for pattern in _TITLE_PATTERNS:
        match = pattern.search(observation_text)
        if match:
            return match.group(1).strip()
    return None
