"""The scripted baselines as a :class:`~agents.rollout.agent.RolloutAgent`, so they play through
:func:`agents.rollout.collect.collect_rollouts` exactly as an LLM policy does (demonstrations, sanity rows)."""
from __future__ import annotations

from typing import Callable, Sequence

from agents.rollout.agent import Chunk
from agents.scripted.agents import DialectWriter, ScriptedAgent, ends_turn
from search_env.data.example import QAExample
from search_env.protocols import Dialect
from search_env.tokenization import TokenCodec

__all__ = ["ScriptedRolloutAgent", "text_chunk"]


def text_chunk(text: str, codec: TokenCodec, protocol: Dialect, budget: int) -> Chunk:
    """A turn written as text, as the ids an LLM would have sampled: its tokens, then end-of-sequence when
    the turn is empty (the agent has nothing more to say), closes an answer of a protocol whose answer
    does not end the episode by itself, or holds native tool calls (:func:`ends_turn`); cut to ``budget`` ids."""
    ids = codec.encode(text) if text else []
    if ends_turn(protocol, text):
        ids.append(min(codec.eos_ids))
    return Chunk(ids[:budget])


class ScriptedRolloutAgent:
    """A rollout agent over the scripted agents of :mod:`agents.scripted.agents` (one instance per row).

    ``make_agent`` builds a fresh agent for each row, e.g. ``ScriptedRolloutAgent(OracleAgent)``. Each
    chunk is the agent's text in the protocol's dialect, encoded once; when the agent stops writing (or
    has written the answer of a protocol whose answer does not end the episode) the end-of-sequence id
    follows, exactly as :func:`agents.scripted.agents.run_episode` does.
    """

    def __init__(self, make_agent: Callable[[], ScriptedAgent]) -> None:
        self.make_agent = make_agent

    def begin(self, prompt_ids: Sequence[Sequence[int]], *, examples: Sequence[QAExample], protocol: Dialect, codec: TokenCodec) -> None:
        self._codec, self._protocol, self._writer = codec, protocol, DialectWriter(protocol)
        self._agents: list[ScriptedAgent | None] = [self.make_agent() for _ in prompt_ids]
        for agent, example in zip(self._agents, examples):
            agent.start(example)
        self._observations = [""] * len(prompt_ids)

    def generate(self, rows: Sequence[int], budgets: Sequence[int]) -> list[Chunk]:
        chunks = []
        for row, budget in zip(rows, budgets):
            text = self._agents[row].next_text(self._writer, self._observations[row])
            chunks.append(text_chunk(text, self._codec, self._protocol, budget))
        return chunks

    def feed(self, row: int, token_ids: Sequence[int]) -> None:
        self._observations[row] = self._codec.decode(token_ids)

    def finish(self, row: int) -> None:
        self._agents[row] = None
