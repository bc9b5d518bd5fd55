"""The loss terms every learner shares: clipped surrogate, KL estimators, entropy, clipped value loss,
and loss aggregation over trained tokens with global denominators.

Conventions (see :class:`~agents.rollout.batch.TrainBatch`): per-token tensors are (B, T) and aligned
with ``input_ids``; ``mask`` is the trained-on mask (agent tokens the learner trains on), as bool or 0/1
floats. Every statistic is over trained tokens only, and masked positions are selected away with
``torch.where`` rather than multiplied by 0: a pad position may hold ``-inf`` or garbage, and
``inf * 0`` is NaN in the forward pass and in the backward pass alike.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "AGG_MODES", "KL_ESTIMATORS", "BatchCounts", "PolicyLossTerms", "ValueLossTerms", "aggregate", "as_bool",
    "entropy_from_logits", "kl_estimate", "masked_mean", "masked_sum", "policy_loss", "rollout_correction",
    "RolloutCorrection", "token_share", "value_loss",
]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
"""Loss aggregation modes, named as verl's ``loss_agg_mode`` names them. Three are verl's formulas (with
denominators counted over the whole batch, :class:`BatchCounts`); ``seq-mean-token-sum-norm`` is not: it
divides by rows x budget (Dr. GRPO, TRL's ``dr_grpo``), verl by the budget alone (see :func:`aggregate`)."""

KL_ESTIMATORS = ("k1", "k2", "k3")
"""Schulman's estimators of KL(policy || reference) from one sample of the policy."""

_LOG_RATIO_LIMIT = 20.0  # exp(20) ~ 5e8: keeps ratios finite however far a token's log-prob moved


def as_bool(mask: torch.Tensor) -> torch.Tensor:
    """The mask as bool (callers pass the batch's 0/1 float masks or bool masks)."""
    return mask if mask.dtype == torch.bool else mask > 0


@dataclass(frozen=True)
class BatchCounts:
    """Denominators of the whole (mini-)batch that one optimiser step covers.

    Each micro-batch's loss is divided by these *global* counts instead of its own, so the sum of the
    micro-batch losses is the full batch's loss in every aggregation mode, and gradient accumulation
    gives the full-batch gradient whatever the split (the same holds across data-parallel ranks when
    the counts are summed over ranks).

    Attributes:
        tokens: trained tokens in the batch.
        sequences: rows with at least one trained token (rows without any add nothing to any mode).
        norm_length: Dr. GRPO's constant length for ``seq-mean-token-sum-norm``: the generation budget
            (agent tokens per episode), not a length measured on the batch, which would re-introduce the
            length bias Dr. GRPO removes and change with the micro-batch's trimmed width.
    """

    tokens: float
    sequences: float
    norm_length: float

    @classmethod
    def from_mask(cls, mask: torch.Tensor, norm_length: float) -> BatchCounts:
        """The counts of a batch given its (B, T) trained mask."""
        if norm_length <= 0:
            raise ValueError(f"norm_length must be > 0, got {norm_length}")
        per_row = as_bool(mask).sum(dim=1)
        return cls(tokens=float(per_row.sum()), sequences=float((per_row > 0).sum()), norm_length=float(norm_length))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` over masked-in positions (masked-out values never enter, even NaN or inf)."""
    picked = torch.where(as_bool(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return picked.sum() if dim is None else picked.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over masked-in positions; 0 when there are none."""
    count = as_bool(mask).sum()
    return masked_sum(x, mask) / count.clamp_min(1)


def token_share(x: torch.Tensor, mask: torch.Tensor, counts: BatchCounts) -> float:
    """This micro-batch's share of the batch's token mean of ``x``: summing the shares of all
    micro-batches gives the mean over every trained token of the batch (for logging)."""
    return float(masked_sum(x.detach(), mask)) / max(counts.tokens, 1.0)


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str, counts: BatchCounts) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar over trained tokens, with the batch's global counts.

    * ``token-mean``: sum over all trained tokens / ``counts.tokens`` (every token weighs the same, so
      long responses weigh more: PPO's and Search-R1's choice).
    * ``seq-mean-token-mean``: each row's mean over its tokens, summed / ``counts.sequences`` (GRPO's
      paper form: every response weighs the same, so a token of a short response weighs more).
    * ``seq-mean-token-sum``: each row's token sum, summed / ``counts.sequences``.
    * ``seq-mean-token-sum-norm``: all token sums / (``counts.sequences`` x ``counts.norm_length``)
      (Dr. GRPO: a constant per-token weight, free of the length bias of the two means above).
      This is Dr. GRPO's and TRL's ``dr_grpo`` (sum / (batch size x max completion length)), not
      verl's mode of the same name, which divides the sum by the (padded) budget alone: for a batch of
      B rows verl's loss and gradient are B times these. Adam's steps hardly see a constant factor,
      but a gradient-norm clip (``optim.max_grad_norm``) and the logged loss do. Dividing by the rows
      too keeps the loss's scale, like the three modes above, independent of how many episodes a step
      plays.

    A row's own token count is exact inside a micro-batch (rows are never split), which is why only
    the batch-wide denominators have to be passed in.
    """
    keep = as_bool(mask)
    if mode == "token-mean":
        return masked_sum(loss, keep) / max(counts.tokens, 1.0)
    row_sums = masked_sum(loss, keep, dim=1)
    if mode == "seq-mean-token-mean":
        return (row_sums / keep.sum(dim=1).clamp_min(1)).sum() / max(counts.sequences, 1.0)
    if mode == "seq-mean-token-sum":
        return row_sums.sum() / max(counts.sequences, 1.0)
    if mode == "seq-mean-token-sum-norm":
        return row_sums.sum() / (max(counts.sequences, 1.0) * counts.norm_length)
    raise ValueError(f"unknown loss_agg_mode {mode!r}; known: {', '.join(AGG_MODES)}")


@dataclass
class PolicyLossTerms:
    """Per-token output of :func:`policy_loss`.

    Attributes:
        loss: (B, T) surrogate loss to minimise, 0 on masked positions.
        ratio: (B, T) probability ratio new/old (1 on masked positions).
        clipped: (B, T) bool, trained tokens where the ratio clip bounded the loss (zero gradient).
        dual_clipped: (B, T) bool, trained tokens where the dual clip capped a negative-advantage loss.
    """

    loss: torch.Tensor
    ratio: torch.Tensor
    clipped: torch.Tensor
    dual_clipped: torch.Tensor


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> PolicyLossTerms:
    """PPO's clipped surrogate per token, with an asymmetric clip range and an optional dual clip.

    loss = max(-A·r, -A·clip(r, 1 - clip_low, 1 + clip_high)), r = exp(logp - old_logp). A separate
    upper bound (DAPO's clip-higher, 0.28) leaves low-probability tokens room to grow, which keeps
    exploration alive. For A < 0 the loss above grows without bound in r (a token made much likelier
    than under the rollout policy); the dual clip (Ye et al. 2020) caps it at ``dual_clip · |A|``, so
    one stale token cannot dominate a batch.
    """
    keep = as_bool(mask)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    log_ratio = torch.where(keep, logprobs - old_logprobs, zero).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    adv = torch.where(keep, advantages, zero)
    unclipped = -adv * ratio
    clipped_loss = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped_loss)
    clipped = keep & (clipped_loss > unclipped)
    dual_clipped = torch.zeros_like(keep)
    if dual_clip is not None:
        cap = -adv * dual_clip  # = dual_clip * |A| where A < 0
        dual_clipped = keep & (adv < 0) & (loss > cap)
        loss = torch.where(adv < 0, torch.minimum(loss, cap), loss)
    return PolicyLossTerms(torch.where(keep, loss, zero), ratio, clipped, dual_clipped)


@dataclass
class RolloutCorrection:
    """Per-token weights that correct the policy gradient for a rollout engine whose log-probs differ from
    the trainer's (output of :func:`rollout_correction`).

    Attributes:
        weights: (B, T) detached factor for each trained token's policy-gradient loss (1 where no
            correction applies, 0 on masked rows and positions outside the mask).
        capped: (B, T) bool, trained tokens whose importance weight hit the cap.
        masked_rows: (B,) bool, rows dropped by the sequence mask.
    """

    weights: torch.Tensor
    capped: torch.Tensor
    masked_rows: torch.Tensor


def rollout_correction(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    tis_cap: float | None = None,
    seq_mask_delta: float | None = None,
) -> RolloutCorrection:
    """Importance weights for samples drawn by an engine (``rollout_logprobs``) but scored by the trainer
    (``old_logprobs``, the same weights in the trainer's numerics).

    Even a synchronous run is slightly off-policy when another engine samples (kernels, precision, a
    stale weight sync): the surrogate's ratio is taken against the trainer's log-probs, so the gradient
    estimates the trainer's policy gradient only after reweighting by π_old / π_engine per token.

    * Token-level truncated importance sampling (``tis_cap`` = C): each trained token's loss is multiplied
      by ``min(exp(old - rollout), C)``; the cap bounds the variance a token the engine found unlikely
      would add. ``None`` or ``0``: off.
    * Sequence mask (``seq_mask_delta`` = δ): a row whose geometric-mean ratio
      ``exp(mean_t(old - rollout))`` over its trained tokens leaves ``[1 - δ, 1 + δ]`` gets weight 0 (the
      engine and the trainer disagree about the whole episode: a broken sync, a numerics problem).
      ``None`` or ``0``: off.

    The weights carry no gradient. The log-ratio is clamped to ±20 like the surrogate's.
    """
    keep = as_bool(mask)
    zero = torch.zeros((), dtype=old_logprobs.dtype, device=old_logprobs.device)
    log_ratio = torch.where(keep, old_logprobs.detach() - rollout_logprobs.to(old_logprobs), zero)
    log_ratio = log_ratio.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    weights = torch.where(keep, torch.ones_like(log_ratio), zero)
    capped = torch.zeros_like(keep)
    if tis_cap:
        ratio = torch.exp(log_ratio)
        capped = keep & (ratio > tis_cap)
        weights = torch.where(keep, ratio.clamp(max=tis_cap), zero)
    masked_rows = torch.zeros(keep.shape[0], dtype=torch.bool, device=keep.device)
    if seq_mask_delta:
        tokens = keep.sum(dim=1)
        mean_log = masked_sum(log_ratio, keep, dim=1) / tokens.clamp_min(1)
        geo = torch.exp(mean_log)
        masked_rows = (tokens > 0) & ((geo < 1.0 - seq_mask_delta) | (geo > 1.0 + seq_mask_delta))
        weights = torch.where(masked_rows[:, None], zero, weights)
    return RolloutCorrection(weights.detach(), capped, masked_rows)


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str, clamp: float | None = None) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled token's log-probs.

    With log r = ref_logp - logp (r = p_ref / p_policy of the sampled token):
    ``k1`` = -log r (unbiased, high variance, can be negative per token);
    ``k2`` = (log r)² / 2 (biased, low variance; its gradient is the true KL's gradient in expectation);
    ``k3`` = r - 1 - log r (unbiased, always >= 0, low variance: GRPO's ``low_var_kl``).
    The log-ratio is clamped to ±20 so ``k3``'s exp stays finite; ``clamp`` also clamps the estimate to
    ``[-clamp, clamp]`` (verl's and OpenRLHF's ±10). Mask the result before reducing it.
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {kind!r}; known: {', '.join(KL_ESTIMATORS)}")
    log_r = (ref_logprobs - logprobs).clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    if kind == "k1":
        kl = -log_r
    elif kind == "k2":
        kl = 0.5 * log_r.square()
    else:
        kl = torch.exp(log_r) - 1.0 - log_r
    return kl if clamp is None else kl.clamp(-clamp, clamp)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution over the last dimension, stable for large logits.

    H = logsumexp(z) - sum softmax(z)·z, which never takes the log of a probability that underflowed
    to 0 (masked vocabulary entries with a large negative logit contribute exactly 0).
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


@dataclass
class ValueLossTerms:
    """Per-token output of :func:`value_loss`: ``loss`` (B, T), 0 on masked positions, and ``clipped``,
    the trained tokens where the clipped prediction gave the larger (used) error."""

    loss: torch.Tensor
    clipped: torch.Tensor


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = 0.5,
) -> ValueLossTerms:
    """PPO's clipped value loss per token: 0.5 · max((v - R)², (v_clip - R)²),
    v_clip = old_v + clip(v - old_v, -clip, clip).

    Taking the larger error keeps the critic from moving far from the values the advantages were
    computed with in one update (the value analogue of the ratio clip); ``clip=None`` gives the plain
    0.5 · (v - R)².
    """
    keep = as_bool(mask)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    v = torch.where(keep, values, zero)
    target = torch.where(keep, returns, zero)
    error = (v - target).square()
    if clip is None:
        return ValueLossTerms(torch.where(keep, 0.5 * error, zero), torch.zeros_like(keep))
    old = torch.where(keep, old_values, zero)
    v_clipped = old + (v - old).clamp(-clip, clip)
    error_clipped = (v_clipped - target).square()
    loss = 0.5 * torch.maximum(error, error_clipped)
    return ValueLossTerms(torch.where(keep, loss, zero), keep & (error_clipped > error))
