"""GRPO: no critic; each response's advantage is its score relative to the other samples of its
question (group), shared by all its trained tokens. Dr. GRPO and DAPO are settings of the same class:

* Dr. GRPO: ``scale_rewards=False`` and ``loss_agg_mode="seq-mean-token-sum-norm"`` (no std division,
  no length normalisation: both bias the update towards particular questions and lengths);
* DAPO: ``clip_high=0.28`` (clip-higher), ``dynamic_sampling=True`` (drop all-equal groups),
  ``overlong_buffer > 0`` (soft overlong punishment), with ``loss_agg_mode="token-mean"``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from agents.learners.advantages import filter_groups, grpo_advantages, overlong_penalty
from agents.learners.base import Algorithm
from agents.learners.config import AlgorithmConfig
from agents.learners.registry import lookup_advantage, register_advantage, register_algorithm

if TYPE_CHECKING:
    from agents.rollout.batch import TrainBatch

__all__ = ["GRPO", "GRPOConfig", "group_relative_advantages"]


@dataclass
class GRPOConfig(AlgorithmConfig):
    """GRPO's settings (every :class:`~agents.learners.config.AlgorithmConfig` field, plus the options below).

    Defaults are Search-R1's GRPO run (``train_grpo.sh``; ReSearch and R-Search use the same group
    size and KL) unless said.

    Attributes:
        scale_rewards: divide the group-centred score by the group's std (GRPO); False is Dr. GRPO's
            "no std" (the centred score only).
        dynamic_sampling: DAPO's dynamic sampling: drop question groups whose samples all scored the
            same before the update (they carry no gradient).
        dynamic_sampling_rounds: with ``dynamic_sampling``, how many rollouts of ``questions_per_step``
            new questions a step may take to fill its batch with ``questions_per_step`` groups that
            differ (DAPO's refill, ``max_num_gen_batches``); the first groups kept are trained on. 1:
            train on what is left of one rollout.
        overlong_buffer: DAPO's soft overlong punishment over the last ``overlong_buffer`` agent tokens
            of the episode's ``max_new_tokens`` budget (0: off; at most that budget).
        overlong_penalty_factor: the punishment at and beyond the budget (DAPO: 1.0).
    """

    group_size: int = 5  # Search-R1 actor_rollout_ref.rollout.n_agent=5 (ReSearch and R-Search: 5 too)
    kl_coef: float = 0.001  # Search-R1 actor.kl_loss_coef
    kl_estimator: str = "k3"  # Search-R1 actor.kl_loss_type=low_var_kl (k3)
    kl_in_reward: bool = False  # GRPO's KL is a loss term (actor.use_kl_loss=true)
    entropy_coef: float = 0.001  # verl's actor.entropy_coeff in Search-R1's ppo_trainer.yaml
    scale_rewards: bool = True  # GRPO (DeepSeekMath); Dr. GRPO: False
    dynamic_sampling: bool = False  # DAPO: True
    dynamic_sampling_rounds: int = 1  # verl's DAPO recipe: algorithm.filter_groups.max_num_gen_batches
    overlong_buffer: int = 0  # DAPO: 4096 of a 20480-token budget
    overlong_penalty_factor: float = 1.0  # DAPO

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError(f"GRPO compares samples of a question: group_size must be >= 2, got {self.group_size}")
        if self.dynamic_sampling_rounds < 1:
            raise ValueError(f"dynamic_sampling_rounds must be >= 1, got {self.dynamic_sampling_rounds}")
        if self.dynamic_sampling_rounds > 1 and not self.dynamic_sampling:
            raise ValueError("dynamic_sampling_rounds > 1 refills the groups that dynamic sampling drops: set dynamic_sampling=True")
        if self.overlong_buffer < 0:
            raise ValueError(f"overlong_buffer must be >= 0, got {self.overlong_buffer}")


def agent_lengths(batch: TrainBatch) -> torch.Tensor:
    """(B,) agent tokens per row: what the ``max_new_tokens`` budget counts (environment tokens don't)."""
    return torch.tensor([int(t.agent_mask.sum()) for t in batch.trajectories], dtype=torch.long)


@register_advantage("grpo")
def group_relative_advantages(batch: TrainBatch, scores: torch.Tensor, config: GRPOConfig) -> torch.Tensor:
    """GRPO's estimator: each row's group-normalised score (centred only when ``config.scale_rewards`` is
    False) on all its trained tokens (:func:`~agents.learners.advantages.grpo_advantages`)."""
    return grpo_advantages(scores, batch.group_index, batch.trained_mask, scale=config.scale_rewards)


@register_algorithm
class GRPO(Algorithm):
    """Group-relative policy optimisation (and its Dr. GRPO / DAPO variants, see the module docstring).

    Attributes:
        advantage_estimator: the registered estimator (:func:`~agents.learners.registry.register_advantage`)
            that turns the shaped scores into advantages: ``"grpo"`` here; a subclass names another and
            keeps everything else (dynamic sampling, overlong punishment, KL in the reward).
    """

    name = "grpo"
    config_class = GRPOConfig
    config: GRPOConfig
    advantage_estimator: ClassVar[str] = "grpo"

    def __init__(self, config: GRPOConfig, *, max_new_tokens: int = 256) -> None:
        super().__init__(config, max_new_tokens=max_new_tokens)
        self.advantage_fn = lookup_advantage(self.advantage_estimator)
        if config.overlong_buffer > max_new_tokens:
            raise ValueError(f"overlong_buffer must be in [0, max_new_tokens={max_new_tokens}], got {config.overlong_buffer}")

    def shaped_scores(self, batch: TrainBatch) -> torch.Tensor:
        """(B,) the scores the groups compare: ``batch.scores`` plus the overlong penalty when it is on."""
        scores = batch.scores.to(batch.token_rewards.dtype)  # the per-token float type of the batch
        if self.config.overlong_buffer > 0:
            penalty = overlong_penalty(
                agent_lengths(batch), self.max_new_tokens, self.config.overlong_buffer,
                self.config.overlong_penalty_factor,
            )
            scores = scores + penalty.to(scores)
        return scores

    @property
    def rollout_rounds(self) -> int:
        """``dynamic_sampling_rounds``: DAPO's refill of the dropped groups."""
        return self.config.dynamic_sampling_rounds

    def filter_batch(self, batch: TrainBatch) -> TrainBatch:
        """With ``dynamic_sampling``, the rows of groups whose shaped scores differ (may be empty)."""
        if not self.config.dynamic_sampling:
            return batch
        keep = filter_groups(self.shaped_scores(batch), batch.group_index)
        return batch.select(torch.nonzero(keep).squeeze(1))

    def compute_advantages(self, batch: TrainBatch) -> dict[str, float]:
        """The ``advantage_estimator``'s advantages of the shaped scores (GRPO: group-normalised, on every
        trained token); with ``kl_in_reward`` the score is first reduced by kl_coef x the row's summed KL
        (verl's GRPO with a KL reward)."""
        shaped = self.shaped_scores(batch)
        scores = shaped
        kl_rewards = self.kl_rewards(batch)
        if kl_rewards is not None:
            scores = scores + kl_rewards.sum(dim=1)
        batch.advantages = self.advantage_fn(batch, scores, self.config)
        stats = self._advantage_stats(batch, kl_rewards)
        stats["groups/informative_frac"] = float(filter_groups(scores, batch.group_index).float().mean()) if len(batch) else 0.0
        if self.config.overlong_buffer > 0 and len(batch):
            stats["score/overlong_penalty"] = float((shaped - batch.scores.to(shaped.dtype)).mean())
        return stats
