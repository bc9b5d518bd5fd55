"""Agents that act in SearchQA-v0: scripted baselines now; LLM policies and learners build on them."""
from agents.scripted import DialectWriter, NoSearchAgent, OracleAgent, RetrieveThenAnswerAgent, ScriptedAgent, run_episode

__all__ = ["DialectWriter", "NoSearchAgent", "OracleAgent", "RetrieveThenAnswerAgent", "ScriptedAgent", "run_episode"]
