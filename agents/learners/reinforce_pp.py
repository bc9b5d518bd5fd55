"""REINFORCE++ (Hu 2025) and REINFORCE++-baseline: no critic; a token-level reward (the outcome on the
last trained token, -β·KL on every trained token), its discounted return carried across environment
spans, whitened over the whole batch's trained tokens, and PPO's clipped surrogate.

The -baseline variant first subtracts the mean score of the row's question group (no std division),
then does the same; R1-Searcher trains with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from agents.learners.advantages import group_normalized_scores, place_on_last_token, reinforce_pp_returns, whiten
from agents.learners.base import Algorithm
from agents.learners.config import AlgorithmConfig
from agents.learners.registry import register_algorithm

if TYPE_CHECKING:
    from agents.rollout.batch import TrainBatch

__all__ = ["ReinforcePP", "ReinforcePPBaseline", "ReinforcePPBaselineConfig", "ReinforcePPConfig"]


@dataclass
class ReinforcePPConfig(AlgorithmConfig):
    """REINFORCE++'s settings (every :class:`~agents.learners.config.AlgorithmConfig` field, plus ``gamma``).

    Defaults follow the REINFORCE++ paper and OpenRLHF's ``reinforce`` estimator unless said; the
    group size is AlgorithmConfig's (plain REINFORCE++ needs no groups, but comparing algorithms on equal
    batches is easier with one).

    Attributes:
        gamma: discount per agent token of the return (environment tokens do not discount).
    """

    kl_coef: float = 0.01  # REINFORCE++ / OpenRLHF example scripts (init_kl_coef 0.01)
    kl_estimator: str = "k1"  # OpenRLHF's default kl_estimator
    kl_in_reward: bool = True  # REINFORCE++ puts the token-level KL penalty in the reward
    gamma: float = 1.0  # REINFORCE++ / OpenRLHF default

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")


@dataclass
class ReinforcePPBaselineConfig(ReinforcePPConfig):
    """REINFORCE++-baseline's settings; defaults are R1-Searcher's (PROTOCOLS.md) unless said."""

    group_size: int = 16  # R1-Searcher: 16 samples per question
    kl_coef: float = 1e-4  # R1-Searcher runs with 0 or 1e-4 (k1 in the reward)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError(f"the group-mean baseline needs group_size >= 2, got {self.group_size}")


@register_algorithm
class ReinforcePP(Algorithm):
    """REINFORCE++: whitened discounted returns of the KL-shaped token reward as advantages."""

    name = "reinforce++"
    config_class = ReinforcePPConfig
    config: ReinforcePPConfig

    def outcome_rewards(self, batch: TrainBatch) -> torch.Tensor:
        """(B, T) the outcome part of the token reward: ``batch.token_rewards`` (score on the last trained token)."""
        return batch.token_rewards

    def compute_advantages(self, batch: TrainBatch) -> dict[str, float]:
        """Returns of (outcome reward - β·KL), whitened over the batch's trained tokens."""
        rewards = self.outcome_rewards(batch)
        kl_rewards = self.kl_rewards(batch)
        if kl_rewards is not None:
            rewards = rewards + kl_rewards
        batch.returns = reinforce_pp_returns(rewards, batch.trained_mask, self.config.gamma)
        batch.advantages = whiten(batch.returns, batch.trained_mask, reduce_sum=self.reduce_sum)
        return self._advantage_stats(batch, kl_rewards)


@register_algorithm
class ReinforcePPBaseline(ReinforcePP):
    """REINFORCE++-baseline: the group's mean score is subtracted from the outcome reward first."""

    name = "reinforce++-baseline"
    config_class = ReinforcePPBaselineConfig
    config: ReinforcePPBaselineConfig

    def outcome_rewards(self, batch: TrainBatch) -> torch.Tensor:
        """``token_rewards`` minus the group-mean score on the last trained token. A row alone in its
        group is its own baseline, so it gets 0 (as in GRPO)."""
        scores = batch.scores.to(batch.token_rewards.dtype)
        baseline = scores - group_normalized_scores(scores, batch.group_index, scale=False)
        return batch.token_rewards - place_on_last_token(baseline, batch.trained_mask)
