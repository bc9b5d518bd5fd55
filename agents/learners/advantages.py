"""Advantage and return estimators over token-aligned (B, T) tensors, with trained-token masks.

An LLM search episode interleaves agent tokens (trained on) with environment tokens (the prompt, search
results, error messages: not trained on). Environment tokens are not agent steps: no action was taken
there, so they carry no advantage and they neither discount nor cut the credit flowing back from later
agent tokens. Every recursion below therefore runs over the trained tokens of a row as if they were
consecutive: the "next step" of an agent token is the next *trained* token, whatever lies between.
Outputs are 0 on positions that are not trained.
"""
from __future__ import annotations

from typing import Callable

import torch

from agents.learners.core import as_bool, masked_mean, masked_sum

__all__ = [
    "filter_groups", "gae", "group_normalized_scores", "grpo_advantages", "overlong_penalty",
    "place_on_last_token", "reinforce_pp_returns", "whiten",
]


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the trained tokens of each row.

    For trained token t with next trained token t' (none: the episode's end, value 0):
    δ_t = r_t + γ·V(t') - V(t) and A_t = δ_t + γλ·A_t'. ``values[b, t]`` is the value of the state before
    token t, so V(t') already sees the environment tokens between t and t'. Rewards on untrained
    positions are ignored (the episode reward sits on the last trained token). The end of a row is
    treated as terminal, truncated or not, as verl and OpenRLHF do.

    Returns:
        (advantages, returns), both (B, T), with returns = A + V on trained tokens (the critic's target).
    """
    keep = as_bool(mask)
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        on = keep[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(on, adv, zero)
        # carry through untrained positions: only a trained token becomes the "next step"
        next_value = torch.where(on, values[:, t], next_value)
        next_adv = torch.where(on, adv, next_adv)
    returns = torch.where(keep, advantages + values, zero)
    return advantages, returns


def reinforce_pp_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted return-to-go G_t = r_t + γ·G_t' over the trained tokens of each row (t' = next trained
    token), 0 on untrained positions.

    The return is carried across environment spans unchanged: resetting it there (as an implementation
    that treats masked positions as episode boundaries does) would give every agent token before the
    last search a return without the final reward, i.e. no credit for searching.
    """
    keep = as_bool(mask)
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        on = keep[:, t]
        step = rewards[:, t] + gamma * running
        returns[:, t] = torch.where(on, step, zero)
        running = torch.where(on, step, running)
    return returns


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8,
           reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) with mean and variance over the trained tokens of the whole batch; 0
    on untrained positions.

    The variance is the population one (divided by the n trained tokens), as OpenRLHF's advantage
    normalisation computes it; verl's ``masked_whiten`` is Bessel-corrected (divided by n - 1), so its
    whitened values are sqrt((n - 1) / n) times these: a difference below 0.1 % from a thousand trained
    tokens on, but not zero on small test batches.

    ``reduce_sum`` sums a tensor over data-parallel ranks, each holding a share of the batch (the
    training backend's ``all_reduce_sum``), so that the statistics are the whole batch's; ``None``:
    this process holds it all.

    Batch-wide statistics (not per row, not per group) are REINFORCE++'s normalisation: they keep the
    scale of the update fixed while the reward's scale drifts, without the per-prompt std division that
    biases GRPO towards too-easy and too-hard questions.
    """
    keep = as_bool(mask)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    if reduce_sum is None:
        mean = masked_mean(x, keep)
        var = masked_mean((x - mean).square(), keep)
    else:
        sums = reduce_sum(torch.stack([masked_sum(x, keep).double(), keep.sum().double()]))
        count = sums[1].clamp_min(1)
        mean = (sums[0] / count).to(x.dtype)
        var = (reduce_sum(masked_sum((x - mean).square(), keep).double()) / count).to(x.dtype)
    return torch.where(keep, (x - mean) * torch.rsqrt(var + eps), zero)


def _group_inverse(group_index: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense group ids 0..G-1 for arbitrary (non-contiguous) group indices, and G."""
    uniq, inverse = torch.unique(group_index, return_inverse=True)
    return inverse, int(uniq.numel())


def group_normalized_scores(
    scores: torch.Tensor, group_index: torch.Tensor, scale: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Each row's score relative to its question group: (s - mean_g) / (std_g + eps), or s - mean_g
    when ``scale`` is False (Dr. GRPO's and REINFORCE++-baseline's form: dividing by the group's std
    up-weights questions whose samples barely differ).

    ``std_g`` is the sample standard deviation (Bessel-corrected, as ``torch.std``, verl and TRL use).
    Defined edge cases: a group of one row has no baseline to compare against, so its advantage is 0
    (verl instead passes the raw score through); a group whose scores are all equal carries no
    preference either, and gets exactly 0 (not a rounding residue blown up by a near-zero std).

    Returns:
        (B,) the normalised scores.
    """
    dense, n_groups = _group_inverse(group_index)
    out_dtype = scores.dtype if scores.is_floating_point() else torch.get_default_dtype()
    scores = scores.to(torch.float64)  # group statistics in double precision
    counts = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, dense, torch.ones_like(scores))
    sums = torch.zeros_like(counts).index_add_(0, dense, scores)
    mean = (sums / counts)[dense]
    centred = scores - mean
    highs = torch.full_like(counts, -torch.inf).scatter_reduce(0, dense, scores, reduce="amax")
    lows = torch.full_like(counts, torch.inf).scatter_reduce(0, dense, scores, reduce="amin")
    informative = (counts[dense] > 1) & (highs[dense] > lows[dense])
    if scale:
        sq = torch.zeros_like(counts).index_add_(0, dense, centred.square())
        std = torch.sqrt(sq / (counts - 1).clamp_min(1))[dense]
        centred = centred / (std + eps)
    return torch.where(informative, centred, torch.zeros_like(centred)).to(out_dtype)


def grpo_advantages(
    scores: torch.Tensor, group_index: torch.Tensor, mask: torch.Tensor, scale: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO's outcome advantage: :func:`group_normalized_scores` of each row, broadcast over the row's
    trained tokens (every token of a response shares the response's advantage); (B, T), 0 elsewhere."""
    per_row = group_normalized_scores(scores, group_index, scale=scale, eps=eps)
    keep = as_bool(mask)
    return torch.where(keep, per_row[:, None], torch.zeros((), dtype=per_row.dtype))


def place_on_last_token(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A (B, T) tensor holding ``values[b]`` on row b's last trained token and 0 elsewhere (rows without
    a trained token stay 0): where an outcome reward enters a token-level return."""
    keep = as_bool(mask)
    positions = torch.arange(keep.shape[1], device=keep.device).expand_as(keep)
    last = torch.where(keep, positions, torch.full_like(positions, -1)).amax(dim=1)
    out = torch.zeros(keep.shape, dtype=values.dtype, device=values.device)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] = values[rows]
    return out


def filter_groups(scores: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """DAPO's dynamic sampling: a (B,) bool mask keeping the rows whose question group has at least two
    different scores. A group whose samples all scored the same (all right, all wrong, or a single
    sample) has zero group-relative advantage, so it adds no gradient, only weight to the denominators."""
    dense, n_groups = _group_inverse(group_index)
    highs = torch.full((n_groups,), -torch.inf, dtype=scores.dtype, device=scores.device)
    lows = torch.full((n_groups,), torch.inf, dtype=scores.dtype, device=scores.device)
    highs = highs.scatter_reduce(0, dense, scores, reduce="amax")
    lows = lows.scatter_reduce(0, dense, scores, reduce="amin")
    return highs[dense] > lows[dense]


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the score: 0 up to ``max_len - buffer`` tokens, then
    falling linearly to ``-factor`` at ``max_len``, and ``-factor`` beyond. A graded penalty tells a
    response that ran long apart from one that was cut off, instead of scoring every truncation as a
    plain failure."""
    if not 0 < buffer <= max_len:
        raise ValueError(f"overlong buffer must be in (0, max_len={max_len}], got {buffer}")
    excess = lengths.to(torch.get_default_dtype()) - (max_len - buffer)
    return (-excess / buffer * factor).clamp(min=-factor, max=0.0)
