"""PPO: a learned critic, GAE over agent tokens (carried through environment spans), value clipping.

Search-R1's PPO recipe (verl): γ = λ = 1, the KL penalty (k1, 0.001) in the token reward, a critic of
the actor's size trained at 10x the actor's learning rate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from agents.learners.advantages import gae, whiten
from agents.learners.base import Algorithm, PolicyOutputLike, require
from agents.learners.config import AlgorithmConfig, check_warmup
from agents.learners.registry import register_algorithm
from agents.learners.core import BatchCounts, aggregate, as_bool, masked_mean, token_share, value_loss

if TYPE_CHECKING:
    from agents.rollout.batch import TrainBatch

__all__ = ["PPO", "PPOConfig"]

CRITIC_KINDS = ("head", "separate")


@dataclass
class PPOConfig(AlgorithmConfig):
    """PPO's settings (every :class:`~agents.learners.config.AlgorithmConfig` field, plus the critic's).

    Defaults are Search-R1's PPO run (its ``train_ppo.sh`` on verl's ``ppo_trainer.yaml``) unless said.

    Attributes:
        gamma: discount per agent token (environment tokens do not discount).
        lam: GAE's λ; 1 gives Monte-Carlo returns minus the value baseline.
        critic: ``"separate"``, a critic model of its own (a copy of the policy's backbone with a scalar
            head, its own optimiser at ``critic_lr``), as Search-R1; or ``"head"``, a linear value head
            on the policy's last hidden state, trained with the policy through ``vf_coef`` (half the
            memory and compute, the usual choice on a CPU).
        critic_lr: the separate critic's learning rate.
        critic_warmup_ratio: the separate critic's linear learning-rate warm-up, as a share of the run's
            training steps (verl's ``critic.optim.lr_warmup_steps_ratio``); the policy's is the ``optim``
            group's.
        critic_warmup_steps: the same in training steps (use one of the two).
        vf_coef: weight of the value loss in the policy's loss when ``critic="head"``.
        value_clip: clip range of the value prediction around the rollout's values (None: unclipped).
        whiten_advantages: normalise GAE advantages over the batch's trained tokens (verl does, with
            the Bessel-corrected variance where :func:`~agents.learners.advantages.whiten` takes the
            population one).
    """

    group_size: int = 1  # Search-R1 PPO: one sample per question (n_agent=1)
    kl_coef: float = 0.001  # Search-R1: algorithm.kl_ctrl.kl_coef
    kl_estimator: str = "k1"  # verl's kl_penalty "kl" = k1
    kl_in_reward: bool = True  # verl PPO puts the KL penalty in the token reward
    entropy_coef: float = 0.001  # verl's actor.entropy_coeff in Search-R1's ppo_trainer.yaml
    gamma: float = 1.0  # Search-R1 / verl algorithm.gamma
    lam: float = 1.0  # Search-R1 / verl algorithm.lam
    critic: str = "separate"  # Search-R1 trains a separate critic from the base model
    critic_lr: float = 1e-5  # Search-R1 critic.optim.lr (actor: 1e-6)
    critic_warmup_ratio: float = 0.015  # Search-R1 train_ppo.sh: critic.optim.lr_warmup_steps_ratio
    critic_warmup_steps: int = 0
    vf_coef: float = 0.5  # not in the seed papers (separate critic); CleanRL's default for a shared head
    value_clip: float | None = 0.5  # verl critic.cliprange_value
    whiten_advantages: bool = True  # verl whitens GAE advantages over the response mask

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.critic not in CRITIC_KINDS:
            raise ValueError(f"unknown critic {self.critic!r}; known: {', '.join(CRITIC_KINDS)}")
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.lam <= 1.0):
            raise ValueError(f"gamma and lam must be in [0, 1], got {self.gamma}, {self.lam}")
        check_warmup(self.critic_warmup_steps, self.critic_warmup_ratio, "critic_warmup")
        if self.value_clip is not None and self.value_clip <= 0:
            raise ValueError(f"value_clip must be > 0 (or None), got {self.value_clip}")


@register_algorithm
class PPO(Algorithm):
    """PPO with GAE; the value term is in :meth:`loss` for a value head, in :meth:`critic_loss` for a
    separate critic (which the trainer steps with its own optimiser)."""

    name = "ppo"
    config_class = PPOConfig
    uses_critic = True
    config: PPOConfig

    @property
    def value_head(self) -> bool:
        return self.config.critic == "head"

    def compute_advantages(self, batch: TrainBatch) -> dict[str, float]:
        """GAE advantages and returns from ``token_rewards`` (minus the KL penalty when it is in the
        reward) and ``batch.values`` (the critic's values at rollout time)."""
        values = require(batch.values, "batch.values", "PPO's GAE needs the critic's values of the rollout")
        rewards = batch.token_rewards
        kl_rewards = self.kl_rewards(batch)
        if kl_rewards is not None:
            rewards = rewards + kl_rewards
        advantages, returns = gae(rewards, values, batch.trained_mask, self.config.gamma, self.config.lam)
        if self.config.whiten_advantages:
            advantages = whiten(advantages, batch.trained_mask, reduce_sum=self.reduce_sum)
        batch.advantages, batch.returns = advantages, returns
        stats = self._advantage_stats(batch, kl_rewards)
        stats["value/mean"] = float(masked_mean(values, batch.trained_mask))
        return stats

    def critic_loss(self, mb: TrainBatch, values: torch.Tensor, counts: BatchCounts) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped value loss of ``values`` (the critic's current (B, T) predictions, with grad)
        against ``mb.returns``, aggregated like the policy loss; additive over micro-batches."""
        keep = as_bool(mb.trained_mask)
        old = require(mb.values, "batch.values", "value clipping needs the critic's values of the rollout")
        returns = require(mb.returns, "batch.returns", "call compute_advantages(batch) before the value loss")
        terms = value_loss(values, old, returns, keep, self.config.value_clip)
        loss = aggregate(terms.loss, keep, self.config.loss_agg_mode, counts)
        stats = {"loss/value": float(loss.detach()), "value/clip_frac": token_share(terms.clipped.to(values.dtype), keep, counts)}
        return loss, stats

    def loss(self, mb: TrainBatch, out: PolicyOutputLike, counts: BatchCounts) -> tuple[torch.Tensor, dict[str, float]]:
        """The shared policy loss, plus ``vf_coef`` x the clipped value loss for a value head."""
        total, stats = super().loss(mb, out, counts)
        if self.value_head:
            values = require(out.values, "out.values", "PPO with critic='head' needs with_values=True")
            v_loss, v_stats = self.critic_loss(mb, values, counts)
            total = total + self.config.vf_coef * v_loss
            stats.update(v_stats)
            stats["loss/total"] = float(total.detach())
        return total, stats
