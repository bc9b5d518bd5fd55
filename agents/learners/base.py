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
from typing import TYPE_CHECKING, Callable, ClassVar, Protocol

import torch

from agents.learners.config import AlgorithmConfig
from agents.learners.core import (
    BatchCounts, PolicyLossTerms, aggregate, as_bool, kl_estimate, masked_mean, policy_loss, rollout_correction,
    token_share,
)
from agents.learners.registry import lookup_policy_loss, register_policy_loss

if TYPE_CHECKING:
    from agents.rollout.batch import TrainBatch

__all__ = ["Algorithm", "PolicyOutputLike", "clipped_surrogate", "require"]


class PolicyOutputLike(Protocol):
    """What :meth:`Algorithm.loss` reads of the policy's forward pass (``agents.policies.policy.PolicyOutput``):
    (B, T) token-aligned tensors with grad; ``entropy`` and ``values`` are None when not asked for."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    values: torch.Tensor | None


def require(value: torch.Tensor | None, name: str, why: str) -> torch.Tensor:
    """``value`` itself, or a one-line error naming the missing batch field and what needs it."""
    if value is None:
        raise ValueError(f"{name} is None: {why}")
    return value


@register_policy_loss("vanilla")
def clipped_surrogate(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                      config: AlgorithmConfig) -> PolicyLossTerms:
    """PPO's per-token clipped surrogate with the config's clip range and dual clip
    (:func:`~agents.learners.core.policy_loss`): the policy loss of every algorithm unless one names another."""
    return policy_loss(logprobs, old_logprobs, advantages, mask,
                       clip_low=config.clip_low, clip_high=config.clip_high, dual_clip=config.dual_clip)


class Algorithm(ABC):
    """Base of the learners: the shared policy loss, and the hooks an algorithm fills in.

    Subclass it, set ``name`` and ``config_class``, and decorate the class with
    :func:`agents.learners.register_algorithm` to make it reachable by ``--algo`` and recipes.

    Everything the trainer calls is declared here: :meth:`filter_batch`, :attr:`rollout_rounds`,
    :meth:`compute_advantages`, :meth:`counts`, :meth:`loss`, :meth:`critic_loss` and the properties
    that say which model outputs are needed (:attr:`uses_reference`, :attr:`uses_critic`,
    :attr:`value_head`, :attr:`needs_entropy`).

    Args:
        config: the algorithm's settings (an instance of ``config_class``).
        max_new_tokens: the episode's agent-token budget: Dr. GRPO's constant length and DAPO's overlong
            window are measured against it.

    Attributes:
        name: the registry name (``--algo``); written only here.
        config_class: the config dataclass this algorithm takes.
        uses_critic: whether the trainer must fill ``batch.values`` before :meth:`compute_advantages`.
        policy_loss_name: the registered policy loss (:func:`~agents.learners.registry.register_policy_loss`)
            :meth:`loss` uses per token: ``"vanilla"``, PPO's clipped surrogate, unless a subclass names another.
        reduce_sum: sums a tensor over data-parallel ranks (set by the trainer from its backend when there
            are several), so batch-wide statistics such as whitening cover the whole batch; ``None`` on one
            process.
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    uses_critic: ClassVar[bool] = False
    policy_loss_name: ClassVar[str] = "vanilla"

    def __init__(self, config: AlgorithmConfig, *, max_new_tokens: int = 256) -> None:
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.policy_loss_fn = lookup_policy_loss(self.policy_loss_name)
        self.config = config
        self.max_new_tokens = max_new_tokens
        self.reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None

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
        """Whether :meth:`loss` needs ``out.entropy`` (an entropy bonus is on). The trainer asks for it
        only then, or when it logs entropy."""
        return self.config.entropy_coef != 0

    def critic_loss(self, mb: TrainBatch, values: torch.Tensor, counts: BatchCounts) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of a separate critic on micro-batch ``mb`` (``values``: its current predictions, with
        grad), additive over micro-batches like :meth:`loss`. Only an algorithm with
        ``uses_critic`` and no value head has one; the trainer calls it for no other."""
        raise TypeError(f"{self.name} trains no separate critic")

    def counts(self, batch: TrainBatch) -> BatchCounts:
        """The global denominators of one optimiser step over ``batch`` (see :class:`BatchCounts`);
        Dr. GRPO's constant length is the episode's agent-token budget, ``max_new_tokens``."""
        return BatchCounts.from_mask(batch.trained_mask, self.max_new_tokens)

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
        kl = kl_estimate(old, ref, self.config.kl_estimator, self.config.kl_clamp)
        return torch.where(keep, -self.config.kl_coef * kl, torch.zeros((), dtype=kl.dtype))

    def loss(self, mb: TrainBatch, out: PolicyOutputLike, counts: BatchCounts) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's share of the mini-batch's loss: the policy loss (``policy_loss_name``; PPO's clipped
        surrogate by default), plus kl_coef·KL to the reference when KL is a loss term (GRPO's way), minus
        entropy_coef·entropy. With ``tis_cap`` or
        ``seq_mask_delta`` set and the rollout engine's log-probs in the batch, each token's surrogate is
        weighted by :func:`~agents.learners.core.rollout_correction` (the KL and entropy terms are not).

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
        terms = self.policy_loss_fn(out.logprobs, old, adv, keep, cfg)
        correction_stats: dict[str, float] = {}
        if (cfg.tis_cap or cfg.seq_mask_delta) and mb.rollout_logprobs is not None:
            fix = rollout_correction(old, mb.rollout_logprobs, keep, tis_cap=cfg.tis_cap, seq_mask_delta=cfg.seq_mask_delta)
            terms.loss = terms.loss * fix.weights
            correction_stats = {
                "rollout_correction/weight": token_share(fix.weights, keep, counts),
                "rollout_correction/capped_frac": token_share(fix.capped.to(old.dtype), keep, counts),
                "rollout_correction/masked_rows": float(fix.masked_rows.sum()) / max(counts.sequences, 1.0),
            }
        pg_loss = aggregate(terms.loss, keep, cfg.loss_agg_mode, counts)
        total = pg_loss
        stats = {
            **correction_stats,
            "loss/policy": float(pg_loss.detach()),
            "policy/clip_frac": token_share(terms.clipped.to(old.dtype), keep, counts),
            "policy/dual_clip_frac": token_share(terms.dual_clipped.to(old.dtype), keep, counts),
            "policy/ratio": token_share(terms.ratio, keep, counts),
            "policy/approx_kl": token_share(kl_estimate(out.logprobs.detach(), old, "k3"), keep, counts),
        }
        if self.uses_reference and not cfg.kl_in_reward:
            ref = require(mb.ref_logprobs, "batch.ref_logprobs", "the KL loss needs the reference's log-probs")
            kl = kl_estimate(out.logprobs, ref, cfg.kl_estimator, cfg.kl_clamp)
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
