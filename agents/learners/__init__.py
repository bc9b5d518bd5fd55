"""Learners: PPO, GRPO (with Dr. GRPO and DAPO options), REINFORCE++ and REINFORCE++-baseline over one
shared core (clipped surrogate, KL estimators, loss aggregation, advantage estimators), each a small
:class:`Algorithm` with its own config dataclass, looked up by name::

    algo_cls, config_cls = lookup_algorithm("grpo")
    algorithm = algo_cls(config_cls(model="tiny", clip_high=0.28))
"""
from __future__ import annotations

from agents.config import TrainConfig
from agents.learners.base import Algorithm, PolicyOutputLike
from agents.learners.core import AGG_MODES, KL_ESTIMATORS, BatchCounts
from agents.learners.grpo import GRPO, GRPOConfig
from agents.learners.ppo import PPO, PPOConfig
from agents.learners.reinforce_pp import ReinforcePP, ReinforcePPBaseline, ReinforcePPBaselineConfig, ReinforcePPConfig

__all__ = [
    "AGG_MODES", "ALGORITHMS", "Algorithm", "BatchCounts", "GRPO", "GRPOConfig", "KL_ESTIMATORS", "PPO", "PPOConfig",
    "PolicyOutputLike", "ReinforcePP", "ReinforcePPBaseline", "ReinforcePPBaselineConfig", "ReinforcePPConfig",
    "build_algorithm", "lookup_algorithm",
]

ALGORITHMS: dict[str, tuple[type[Algorithm], type[TrainConfig]]] = {
    cls.name: (cls, cls.config_class) for cls in (PPO, GRPO, ReinforcePP, ReinforcePPBaseline)
}
"""Algorithm name (``--algo``) -> (algorithm class, config class)."""


def lookup_algorithm(name: str) -> tuple[type[Algorithm], type[TrainConfig]]:
    """The (algorithm class, config class) registered as ``name``, or a one-line error listing the names."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}") from None


def build_algorithm(config: TrainConfig) -> Algorithm:
    """The algorithm named by ``config.algo``, configured by ``config``."""
    algo_cls, _ = lookup_algorithm(config.algo)
    return algo_cls(config)
