"""Agents that act in SearchQA-v0 and the learners that train them.

Scripted baselines (no extra dependencies) are imported with the package; the LLM policies, rollouts,
learners and trainer need the ``agents`` extra (torch, transformers) and are imported on first use::

    from agents import GRPOConfig, TrainConfig, build_trainer

    config = TrainConfig("grpo", algorithm=GRPOConfig(group_size=8)).updated(
        {"run.steps": 50, "warm_start.steps": 200, "eval.every": 10, "run.output_dir": "runs/grpo"})
    trainer = build_trainer(config)
    result = trainer.train()
    trainer.close_environments()

(:class:`~agents.training.config.TrainConfig` lists every group and field; ``python -m agents.train
--help`` shows the same settings as flags.)

The extension hooks are here too: :func:`register_algorithm` (with :func:`register_advantage` and
:func:`register_policy_loss`), :func:`register_engine` (an engine with its own copy of the weights
inherits :class:`EngineWithWeights`), :func:`register_backend`, and :class:`Callback`
for a run's events; every algorithm's config class is exported beside them. A search source is
registered in ``search_env`` (:func:`search_env.sources.register_source`).
"""
from __future__ import annotations

import os
from importlib import import_module
from typing import Any

# MKL's matrix products sum in an order that depends on the thread count unless told otherwise: on an
# AVX-512 CPU a weight gradient on two threads differs in its last bits from one thread's, so a run whose
# warm start follows the free cores (agents.training.cpu_threads) would depend on the machine's load. Strict
# conditional numerical reproducibility makes the products the same on any thread count; MKL reads the
# setting at its first product, so it is set here, before any. A value the user set is kept.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

from agents.scripted import (
    DialectWriter, NoSearchAgent, OracleAgent, RetrieveThenAnswerAgent, ScriptedAgent, ScriptedRolloutAgent, run_episode,
)

#: Public names that live in modules needing torch, and the module each comes from.
_LAZY = {
    "TrainConfig": "agents.training.config",
    "TrainBatch": "agents.rollout.batch",
    "HFPolicy": "agents.policies.policy", "PolicyOutput": "agents.policies.policy", "ValueModel": "agents.policies.policy",
    "tiny_causal_lm": "agents.policies.loading", "load_smollm2": "agents.policies.loading", "load_policy": "agents.policies.loading",
    "RolloutAgent": "agents.rollout.agent", "Chunk": "agents.rollout.agent", "SamplingParams": "agents.rollout.agent",
    "HFSampler": "agents.rollout.hf_sampler",
    "collect_rollouts": "agents.rollout.collect", "Rollout": "agents.rollout.collect", "build_batch": "agents.rollout.batch",
    "ALGORITHMS": "agents.learners", "Algorithm": "agents.learners", "lookup_algorithm": "agents.learners",
    "register_algorithm": "agents.learners", "register_advantage": "agents.learners", "register_policy_loss": "agents.learners",
    "AlgorithmConfig": "agents.learners", "PPOConfig": "agents.learners", "GRPOConfig": "agents.learners",
    "RLOOConfig": "agents.learners", "GSPOConfig": "agents.learners", "GiGPOConfig": "agents.learners",
    "ReinforcePPConfig": "agents.learners", "ReinforcePPBaselineConfig": "agents.learners",
    "RolloutEngine": "agents.rollout.engines", "EngineSetup": "agents.rollout.engines", "register_engine": "agents.rollout.engines",
    "EngineWithWeights": "agents.rollout.engine_weights",
    "TrainingBackend": "agents.training.backends", "TorchBackend": "agents.training.backends",
    "register_backend": "agents.training.backends",
    "Callback": "agents.training.callbacks",
    "Trainer": "agents.training.trainer", "TrainResult": "agents.training.result",
    "build_trainer": "agents.training.build",
    "warm_start": "agents.training.warm_start",
    "EvalResult": "agents.training.evaluation", "evaluate": "agents.training.evaluation", "summarize": "agents.training.evaluation",
}

__all__ = ["DialectWriter", "NoSearchAgent", "OracleAgent", "RetrieveThenAnswerAgent", "ScriptedAgent", "ScriptedRolloutAgent", "run_episode",
           *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
