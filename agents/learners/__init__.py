"""Learners: PPO, GRPO (with Dr. GRPO and DAPO options), REINFORCE++ and REINFORCE++-baseline over one
shared core (clipped surrogate, KL estimators, loss aggregation, advantage estimators), each a small
:class:`Algorithm` with its own config dataclass, registered by name::

    from agents.learners import GRPOConfig, lookup_algorithm

    algorithm = lookup_algorithm("grpo")(GRPOConfig(clip_high=0.28), max_new_tokens=256)

A new algorithm is a subclass of :class:`Algorithm` decorated with :func:`register_algorithm`.
"""
from __future__ import annotations

from agents.learners.base import Algorithm, PolicyOutputLike
from agents.learners.config import AlgorithmConfig
from agents.learners.core import AGG_MODES, KL_ESTIMATORS, BatchCounts
from agents.learners.grpo import GRPO, GRPOConfig
from agents.learners.ppo import PPO, PPOConfig
from agents.learners.registry import ALGORITHMS, lookup_algorithm, register_algorithm
from agents.learners.reinforce_pp import ReinforcePP, ReinforcePPBaseline, ReinforcePPBaselineConfig, ReinforcePPConfig

__all__ = [
    "AGG_MODES", "ALGORITHMS", "Algorithm", "AlgorithmConfig", "BatchCounts", "GRPO", "GRPOConfig", "KL_ESTIMATORS", "PPO",
    "PPOConfig", "PolicyOutputLike", "ReinforcePP", "ReinforcePPBaseline", "ReinforcePPBaselineConfig",
    "ReinforcePPConfig", "lookup_algorithm", "register_algorithm",
]
