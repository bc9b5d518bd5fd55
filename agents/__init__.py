"""Agents that act in SearchQA-v0 and the learners that train them.

Scripted baselines (no extra dependencies) are imported with the package; the LLM policies, rollouts,
learners and trainer need the ``agents`` extra (torch, transformers) and are imported on first use::

    from agents import build_trainer, GRPOConfig
    trainer = build_trainer(GRPOConfig(steps=50, sft_steps=200, eval_every=10))
    result = trainer.train()
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

from agents.scripted import DialectWriter, NoSearchAgent, OracleAgent, RetrieveThenAnswerAgent, ScriptedAgent, run_episode

#: Public names that live in modules needing torch, and the module each comes from.
_LAZY = {
    "TrainConfig": "agents.config",
    "TrainBatch": "agents.batch",
    "HFPolicy": "agents.policy", "PolicyOutput": "agents.policy", "ValueModel": "agents.policy",
    "tiny_causal_lm": "agents.models", "load_smollm2": "agents.models", "load_policy": "agents.models",
    "RolloutAgent": "agents.interface", "ScriptedRolloutAgent": "agents.interface", "Chunk": "agents.interface",
    "HFSampler": "agents.sampler",
    "collect_rollouts": "agents.rollout", "build_batch": "agents.rollout", "Rollout": "agents.rollout",
    "ALGORITHMS": "agents.learners", "Algorithm": "agents.learners", "build_algorithm": "agents.learners",
    "PPOConfig": "agents.learners", "GRPOConfig": "agents.learners", "ReinforcePPConfig": "agents.learners",
    "ReinforcePPBaselineConfig": "agents.learners",
    "TrainingBackend": "agents.backend", "TorchBackend": "agents.backend",
    "Trainer": "agents.trainer", "TrainResult": "agents.trainer",
    "build_trainer": "agents.train",
    "warm_start": "agents.sft",
    "EvalResult": "agents.evaluation", "evaluate": "agents.evaluation", "summarize": "agents.evaluation",
}

__all__ = ["DialectWriter", "NoSearchAgent", "OracleAgent", "RetrieveThenAnswerAgent", "ScriptedAgent", "run_episode",
           *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
