"""RLOO, REINFORCE Leave-One-Out (Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline for free!";
Ahmadian et al. 2024, "Back to basics: revisiting REINFORCE style optimization for learning from human
feedback in LLMs"): no critic; each of a question's k samples is compared with the mean score of the
*other* k - 1 samples, so the baseline never contains the sample it judges and the estimate stays unbiased.

The advantage is exactly TRL's (``RLOOTrainer``) and OpenRLHF's (``advantage_estimator=rloo``)::

    A_i = r_i - (sum_j r_j - r_i) / (k - 1)

with no further k / (k - 1) factor: neither scales it, though A_i equals k / (k - 1) times GRPO's centred
score r_i - mean_j r_j, so RLOO's advantages are those of Dr. GRPO (no std division) enlarged by k / (k - 1).
With the KL in the reward (TRL's default), r_i is the score minus kl_coef x the sequence's summed KL.
The update is PPO's clipped surrogate on every trained token of the row, as both libraries do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from agents.learners.advantages import _group_inverse, filter_groups
from agents.learners.base import Algorithm
from agents.learners.config import AlgorithmConfig
from agents.learners.core import as_bool
from agents.learners.registry import lookup_advantage, register_advantage, register_algorithm

if TYPE_CHECKING:
    from agents.rollout.batch import TrainBatch

__all__ = ["RLOO", "RLOOConfig", "leave_one_out_scores", "rloo_advantages"]


@dataclass
class RLOOConfig(AlgorithmConfig):
    """RLOO's settings (every :class:`~agents.learners.config.AlgorithmConfig` field; ``group_size`` is RLOO's
    k and must be at least 2, since a leave-one-out baseline needs another sample).

    Defaults are TRL's ``RLOOTrainer`` unless said.
    """

    group_size: int = 4  # Ahmadian et al. 2024 compare k = 2 and k = 4; k = 4 learned better
    kl_coef: float = 0.05  # TRL RLOOConfig's KL coefficient
    kl_estimator: str = "k1"  # TRL: log-prob difference of the sampled tokens, summed over the sequence
    kl_in_reward: bool = True  # TRL and OpenRLHF's RLOO subtract the KL from the reward

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError(
                f"RLOO's leave-one-out baseline needs another sample: group_size must be >= 2, got {self.group_size}")


def leave_one_out_scores(scores: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """(B,) each row's score minus the mean score of the other rows of its question group.

    A row alone in its group has no other sample to compare with: it gets 0, as GRPO's singleton does
    (TRL and OpenRLHF never see one, their groups being complete by construction). Computed in double
    precision and returned in the scores' float type.
    """
    dense, n_groups = _group_inverse(group_index)
    out_dtype = scores.dtype if scores.is_floating_point() else torch.get_default_dtype()
    s = scores.to(torch.float64)
    counts = torch.zeros(n_groups, dtype=s.dtype, device=s.device).index_add_(0, dense, torch.ones_like(s))
    sums = torch.zeros_like(counts).index_add_(0, dense, s)
    k = counts[dense]
    baseline = (sums[dense] - s) / (k - 1).clamp_min(1)
    return torch.where(k > 1, s - baseline, torch.zeros_like(s)).to(out_dtype)


@register_advantage("rloo")
def rloo_advantages(batch: TrainBatch, scores: torch.Tensor, config: AlgorithmConfig) -> torch.Tensor:
    """The RLOO estimator: :func:`leave_one_out_scores` of each row on all its trained tokens; (B, T)."""
    per_row = leave_one_out_scores(scores, batch.group_index)
    return torch.where(as_bool(batch.trained_mask), per_row[:, None], torch.zeros((), dtype=per_row.dtype))


@register_algorithm
class RLOO(Algorithm):
    """REINFORCE Leave-One-Out with PPO's clipped surrogate (see the module docstring)."""

    name = "rloo"
    config_class = RLOOConfig
    config: RLOOConfig

    def compute_advantages(self, batch: TrainBatch) -> dict[str, float]:
        """Leave-one-out advantages of the scores (reduced by kl_coef x the row's summed KL when the KL is
        in the reward) on every trained token."""
        scores = batch.scores.to(batch.token_rewards.dtype)
        kl_rewards = self.kl_rewards(batch)
        if kl_rewards is not None:
            scores = scores + kl_rewards.sum(dim=1)
        batch.advantages = lookup_advantage("rloo")(batch, scores, self.config)
        stats = self._advantage_stats(batch, kl_rewards)
        stats["groups/informative_frac"] = float(filter_groups(scores, batch.group_index).float().mean()) if len(batch) else 0.0
        return stats
