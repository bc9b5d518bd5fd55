"""GSPO, Group Sequence Policy Optimization (Zheng et al., Qwen team 2025, arXiv:2507.18071): GRPO's
group-normalised advantages, but the importance ratio and its clip are the sequence's, not each token's.

The sequence ratio is the geometric mean of the token ratios over the row's trained tokens,
``s_i = exp(mean_t (log pi(y_t) - log pi_old(y_t)))`` (the paper's length-normalised
``(pi(y_i|x) / pi_old(y_i|x))^(1/|y_i|)``), and the objective ``min(s_i A_i, clip(s_i, 1 - eps_low,
1 + eps_high) A_i)`` is averaged over sequences. Token ratios multiply the noise of every token into the
update; one ratio per sequence matches the unit the reward judges, which is why the paper's clip range is
so small (3e-4 / 4e-4: a sequence ratio moves far less than a token's).

It is computed in the paper's GSPO-token form, ``s_{i,t} = sg[s_i] · pi(y_t) / sg[pi(y_t)]``: every
trained token carries the value s_i, and with one advantage per row (GRPO's estimator) and the
``seq-mean-token-mean`` aggregation the loss and its gradient are exactly the sequence-level objective's,
while micro-batching, the rollout correction, the KL and entropy terms work as for every other algorithm
(a row is never split across micro-batches, so its mean stays whole). Environment tokens (search results)
are outside the trained mask and enter neither the ratio nor the length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from agents.learners.config import AlgorithmConfig
from agents.learners.core import _LOG_RATIO_LIMIT, PolicyLossTerms, as_bool, masked_sum
from agents.learners.grpo import GRPO, GRPOConfig
from agents.learners.registry import register_algorithm, register_policy_loss

__all__ = ["GSPO", "GSPOConfig", "gspo_policy_loss"]


@dataclass
class GSPOConfig(GRPOConfig):
    """GSPO's settings: GRPO's (group-normalised advantages, its DAPO options), with the sequence clip range
    in ``clip_low`` / ``clip_high``. Defaults are the paper's and verl's GSPO recipe's unless said.
    ``dual_clip`` is not defined for a sequence ratio and must stay None."""

    clip_low: float = 3e-4  # GSPO paper: left clip 3e-4
    clip_high: float = 4e-4  # GSPO paper: right clip 4e-4
    kl_coef: float = 0.0  # GSPO's objective has no KL term (verl recipe: use_kl_loss=False)
    entropy_coef: float = 0.0  # verl's GSPO recipe: entropy_coeff 0
    loss_agg_mode: str = "seq-mean-token-mean"  # the paper's mean over sequences of per-sequence terms

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dual_clip is not None:
            raise ValueError("GSPO clips the sequence ratio; dual_clip is a token-level PPO option: leave it None")


@register_policy_loss("gspo")
def gspo_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     config: AlgorithmConfig) -> PolicyLossTerms:
    """GSPO's per-token loss (GSPO-token form, see the module docstring): every trained token of row i has
    ratio s_i = exp(masked mean of the row's log-ratios) in value, and the gradient of s_i · log pi(y_t);
    loss = max(-A·s, -A·clip(s, 1 - clip_low, 1 + clip_high)). ``clipped`` marks the trained tokens of
    rows the clip bounded; there is no dual clip. The sequence log-ratio is clamped to ±20 like a token's."""
    keep = as_bool(mask)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    new = torch.where(keep, logprobs, zero)
    log_ratio = torch.where(keep, new - old_logprobs, zero)
    seq_log_ratio = masked_sum(log_ratio, keep, dim=1) / keep.sum(dim=1).clamp_min(1)
    seq_log_ratio = seq_log_ratio.clamp(-_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    # value s_i on every token; gradient s_i x d log pi(y_t) (the detached parts carry none)
    ratio = torch.exp(seq_log_ratio.detach()[:, None] + new - new.detach())
    adv = torch.where(keep, advantages, zero)
    unclipped = -adv * ratio
    clipped_loss = -adv * ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high)
    loss = torch.maximum(unclipped, clipped_loss)
    clipped = keep & (clipped_loss > unclipped)
    one = torch.ones((), dtype=ratio.dtype, device=ratio.device)
    return PolicyLossTerms(torch.where(keep, loss, zero), torch.where(keep, ratio, one), clipped, torch.zeros_like(keep))


@register_algorithm
class GSPO(GRPO):
    """Group Sequence Policy Optimization: GRPO's advantages with the sequence-level ratio and clip of
    :func:`gspo_policy_loss` (see the module docstring)."""

    name = "gspo"
    config_class = GSPOConfig
    config: GSPOConfig
    policy_loss_name = "gspo"
