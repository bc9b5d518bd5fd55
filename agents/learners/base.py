"""What every learner shares: the :class:`Algorithm` interface the trainer drives, and the loss that
PPO, GRPO and REINFORCE++ have in common (clipped surrogate, KL to the reference as a loss term,
entropy bonus). An algorithm differs from another only in its advantages and a few extra loss terms.

The trainer's loop, for each rollout::

    batch = algorithm.filter_batch(batch)          # GRPO's dynamic sampling drops rows; else a no-op
    # fill batch.old_logprobs, batch.ref_logprobs (if algorithm.uses_reference), batch.values (critic)
    stats = algorithm.compute_advantages(batch)    # fills batch.advantages (+ batch.returns)
    for mini in mini-batches:
        counts = algorithm.counts(mini)            # global denominators of this optimiser step
        for mb in mini.micro_batches(size):
            out = policy.forward(..., with_entropy=..., with_values=algorithm.value_head)
            loss, mb_stats = algorithm.loss(mb, out, counts)
            loss.backward()                        # summed over micro-batches = the mini-batch's loss
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Protocol

import torch

from agents.config import TrainConfig
from agents.learners.core import (
    AGG_MODES, KL_ESTIMATORS, BatchCounts, aggregate, as_bool, kl_estimate, masked_mean, policy_loss, token_share,
)

if TYPE_CHECKING:
    from agents.batch import TrainBatch

__all__ = ["Algorithm", "PolicyOutputLike", "check_train_config", "require"]


class PolicyOutputLike(Protocol):
    """What :meth:`Algorithm.loss` reads of the policy's forward pass (``agents.policy.PolicyOutput``):
    (B, T) token-aligned tensors with grad; ``entropy`` and ``values`` are None when not asked for."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    values: torch.Tensor | None


def require(value: torch.Tensor | None, name: str, why: str) -> torch.Tensor:
    """``value`` itself, or a one-line error naming the missing batch field and what needs it."""
    if value is None:
        raise ValueError(f"{name} is None: {why}")
    return value


def check_train_config(config: TrainConfig, algo: str) -> None:
    """One-line errors for settings no algorithm can run with (called by every config's ``__post_init__``,
    so a bad YAML recipe or command-line override fails when it is loaded, not mid-training)."""
    name = type(config).__name__
    if config.algo != algo:
        raise ValueError(f"{name} is the config of algo {algo!r}, not {config.algo!r}")
    if config.loss_agg_mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {config.loss_agg_mode!r}; known: {', '.join(AGG_MODES)}")
    if config.kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {config.kl_estimator!r}; known: {', '.join(KL_ESTIMATORS)}")
    if not 0.0 <= config.clip_low < 1.0 or config.clip_high < 0.0:
        raise ValueError(f"clip range needs 0 <= clip_low < 1 and clip_high >= 0, got {config.clip_low}, {config.clip_high}")
    if config.dual_clip is not None and config.dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None to turn it off), got {config.dual_clip}")
    if config.kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {config.kl_coef}")
    if config.group_size < 1 or config.max_new_tokens < 1:
        raise ValueError(f"group_size and max_new_tokens must be >= 1, got {config.group_size}, {config.max_new_tokens}")


class Algorithm(ABC):
    """Base of the learners: the shared policy loss, and the hooks an algorithm fills in.

    Attributes:
        name: the registry name (``--algo``).
        config_class: the config dataclass this algorithm takes.
        uses_critic: whether the trainer must fill ``batch.values`` before :meth:`compute_advantages`.
        config: the run's settings.
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type[TrainConfig]] = TrainConfig
    uses_critic: ClassVar[bool] = False

    def __init__(self, config: TrainConfig) -> None:
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config

    @property
    def uses_reference(self) -> bool:
        """Whether a frozen reference policy is needed (its log-probs in ``batch.ref_logprobs``)."""
        return self.config.kl_coef > 0

    @property
    def value_head(self) -> bool:
        """Whether :meth:`loss` needs ``out.values`` from a value head on the policy (PPO with
        ``critic="head"``); a separate critic is trained by the trainer through ``critic_loss``."""
        return False

    @property
    def needs_entropy(self) -> bool:
        """Whether :meth:`loss` needs ``out.entropy`` (an entropy bonus is on)."""
        return self.config.entropy_coef != 0

    def counts(self, batch: TrainBatch) -> BatchCounts:
        """The global denominators of one optimiser step over ``batch`` (see :class:`BatchCounts`);
        Dr. GRPO's constant length is the episode's agent-token budget, ``max_new_tokens``."""
        return BatchCounts.from_mask(batch.trained_mask, self.config.max_new_tokens)

    def filter_batch(self, batch: TrainBatch) -> TrainBatch:
        """The rows worth training on; all of them unless an algorithm filters (GRPO's dynamic sampling).
        Call it before computing log-probs so dropped rows cost no forward pass."""
        return batch

    @property
    def rollout_rounds(self) -> int:
        """How many rollouts a step may take to refill the groups :meth:`filter_batch` drops (1: none)."""
        return 1

    @abstractmethod
    def compute_advantages(self, batch: TrainBatch) -> dict[str, float]:
        """Fill ``batch.advantages`` (and ``batch.returns`` where the algorithm has returns) from the
        rewards and, when KL is in the reward, from ``batch.old_logprobs`` and ``batch.ref_logprobs``.
        Returns statistics over trained tokens for logging."""

    def kl_rewards(self, batch: TrainBatch) -> torch.Tensor | None:
        """-kl_coef · KL_t per trained token (0 elsewhere) when the KL penalty goes in the reward, else
        None. KL is measured between the rollout policy (``old_logprobs``) and the reference, as
        REINFORCE++ and verl's PPO do, so it is a fixed part of the reward during the update."""
        if not (self.uses_reference and self.config.kl_in_reward):
            return None
        why = "KL in the reward needs the rollout policy's and the reference's log-probs"
        old = require(batch.old_logprobs, "batch.old_logprobs", why)
        ref = require(batch.ref_logprobs, "batch.ref_logprobs", why)
        keep = as_bool(batch.trained_mask)
        kl = kl_estimate(old, ref, self.config.kl_estimator)
        return torch.where(keep, -self.config.kl_coef * kl, torch.zeros((), dtype=kl.dtype))

    def loss(self, mb: TrainBatch, out: PolicyOutputLike, counts: BatchCounts) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's share of the mini-batch's loss: clipped surrogate, plus kl_coef·KL to the
        reference when KL is a loss term (GRPO's way), minus entropy_coef·entropy.

        Every term is aggregated with ``config.loss_agg_mode`` and the global ``counts``, so summing the
        returned losses (and their gradients) over the micro-batches of a mini-batch gives the mini-batch's
        loss whatever the split. The statistics are additive shares in the same sense: sum them over the
        micro-batches of a mini-batch; token statistics (``kl``, ``entropy``, ``policy/*``) are means over
        trained tokens whatever the aggregation mode.
        """
        cfg = self.config
        keep = as_bool(mb.trained_mask)
        old = require(mb.old_logprobs, "batch.old_logprobs", "the clipped surrogate needs the rollout policy's log-probs")
        adv = require(mb.advantages, "batch.advantages", "call compute_advantages(batch) before loss()")
        terms = policy_loss(
            out.logprobs, old, adv, keep, clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip
        )
        pg_loss = aggregate(terms.loss, keep, cfg.loss_agg_mode, counts)
        total = pg_loss
        stats = {
            "loss/policy": float(pg_loss.detach()),
            "policy/clip_frac": token_share(terms.clipped.to(old.dtype), keep, counts),
            "policy/dual_clip_frac": token_share(terms.dual_clipped.to(old.dtype), keep, counts),
            "policy/ratio": token_share(terms.ratio, keep, counts),
            "policy/approx_kl": token_share(kl_estimate(out.logprobs.detach(), old, "k3"), keep, counts),
        }
        if self.uses_reference and not cfg.kl_in_reward:
            ref = require(mb.ref_logprobs, "batch.ref_logprobs", "the KL loss needs the reference's log-probs")
            kl = kl_estimate(out.logprobs, ref, cfg.kl_estimator)
            kl_loss = aggregate(kl, keep, cfg.loss_agg_mode, counts)
            total = total + cfg.kl_coef * kl_loss
            stats["loss/kl"] = float(kl_loss.detach())
            stats["kl"] = token_share(kl, keep, counts)
        if cfg.entropy_coef != 0:
            entropy = require(out.entropy, "out.entropy", "entropy_coef != 0: run the policy with with_entropy=True")
            entropy_loss = aggregate(entropy, keep, cfg.loss_agg_mode, counts)
            total = total - cfg.entropy_coef * entropy_loss
            stats["loss/entropy"] = float(entropy_loss.detach())
        if out.entropy is not None:
            stats["entropy"] = token_share(out.entropy, keep, counts)
        stats["loss/total"] = float(total.detach())
        return total, stats

    def _advantage_stats(self, batch: TrainBatch, kl_rewards: torch.Tensor | None) -> dict[str, float]:
        """Statistics every algorithm logs after :meth:`compute_advantages` (over trained tokens)."""
        keep = as_bool(batch.trained_mask)
        adv = require(batch.advantages, "batch.advantages", "compute_advantages did not fill it")
        mean = masked_mean(adv, keep)
        stats = {
            "score/mean": float(batch.scores.float().mean()) if len(batch) else 0.0,
            "advantage/mean": float(mean),
            "advantage/std": float(masked_mean((adv - mean).square(), keep).sqrt()),
        }
        if kl_rewards is not None:
            stats["kl_reward"] = float(masked_mean(-kl_rewards / self.config.kl_coef, keep))
        if batch.returns is not None:
            stats["return/mean"] = float(masked_mean(batch.returns, keep))
        return stats
