"""A rollout engine whose agents are scripted, for trainer tests that need episodes of a known shape (a
search in every episode) whatever the policy writes: ``Trainer(..., engine=ScriptedEngine(RetrieveThenAnswerAgent))``."""
from __future__ import annotations

from typing import Any

from agents.scripted import ScriptedRolloutAgent


class ScriptedEngine:
    """A :class:`~agents.rollout.engines.RolloutEngine` whose agents play ``agent_class`` (a scripted
    agent): it holds no weights, so there is nothing to follow, sync or release."""

    logprobs_are_trainers = False
    decodes_trained_policy = False
    needs_policy = False
    reuse_logprobs = False

    def __init__(self, agent_class: type) -> None:
        self.agent_class = agent_class

    def agent(self, *, greedy: bool, seed: int, first_row: int = 0) -> ScriptedRolloutAgent:
        return ScriptedRolloutAgent(self.agent_class)

    def attach(self, backend: Any) -> ScriptedEngine:
        return self

    def sync(self) -> None:
        pass

    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass

    def close(self) -> None:
        pass
