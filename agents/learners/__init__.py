"""Learners: PPO, GRPO (with Dr. GRPO and DAPO options), REINFORCE++ and REINFORCE++-baseline, RLOO, GSPO
and GiGPO over one shared core (clipped surrogate, KL estimators, loss aggregation, advantage estimators),
each a small :class:`Algorithm` with its own config dataclass, registered by name::

    from agents.learners import GRPOConfig, lookup_algorithm

    algorithm = lookup_algorithm("grpo")(GRPOConfig(clip_high=0.28), max_new_tokens=256)

A new algorithm is a subclass of :class:`Algorithm` decorated with :func:`register_algorithm`; a new
advantage estimator or policy loss is a function decorated with :func:`register_advantage` or
:func:`register_policy_loss`, named by the subclass.
"""
from __future__ import annotations

from agents.learners.base import Algorithm, PolicyOutputLike
from agents.learners.config import AlgorithmConfig
from agents.learners.core import AGG_MODES, KL_ESTIMATORS, BatchCounts
from agents.learners.gigpo import GiGPO, GiGPOConfig
from agents.learners.grpo import GRPO, GRPOConfig
from agents.learners.gspo import GSPO, GSPOConfig
from agents.learners.ppo import PPO, PPOConfig
from agents.learners.registry import (
    ADVANTAGES, ALGORITHMS, POLICY_LOSSES, lookup_advantage, lookup_algorithm, lookup_policy_loss, register_advantage,
    register_algorithm, register_policy_loss,
)
from agents.learners.reinforce_pp import ReinforcePP, ReinforcePPBaseline, ReinforcePPBaselineConfig, ReinforcePPConfig
from agents.learners.rloo import RLOO, RLOOConfig

__all__ = [
    "ADVANTAGES", "AGG_MODES", "ALGORITHMS", "Algorithm", "AlgorithmConfig", "BatchCounts", "GRPO", "GRPOConfig", "GSPO",
    "GSPOConfig", "GiGPO", "GiGPOConfig", "KL_ESTIMATORS", "POLICY_LOSSES", "PPO", "PPOConfig", "PolicyOutputLike", "RLOO",
    "RLOOConfig", "ReinforcePP", "ReinforcePPBaseline", "ReinforcePPBaselineConfig", "ReinforcePPConfig",
    "lookup_advantage", "lookup_algorithm", "lookup_policy_loss", "register_advantage", "register_algorithm",
    "register_policy_loss",
]
