"""Scripted agents: baselines that write a protocol's dialect by rule (an oracle, retrieve-then-answer,
no search), their adapter to the rollout's agent protocol, and the demonstrations a warm start clones.

Imports :mod:`agents.rollout`'s agent protocol; needs no torch.
"""
from agents.scripted.agents import (
    DialectWriter, NoSearchAgent, OracleAgent, RetrieveThenAnswerAgent, ScriptedAgent, run_episode,
)
from agents.scripted.rollout_agent import ScriptedRolloutAgent

__all__ = ["DialectWriter", "NoSearchAgent", "OracleAgent", "RetrieveThenAnswerAgent", "ScriptedAgent",
           "ScriptedRolloutAgent", "run_episode"]
