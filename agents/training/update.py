"""One rollout batch's update, as the trainer runs it: the log-probs and values it needs first
(:func:`score_batch`), then ``optim.update_epochs`` passes of mini-batch optimiser steps (:func:`update_batch`).

Rows are ordered by length before a mini-batch is split into micro-batches, so that a micro-batch,
trimmed to its longest row, carries little padding; each micro-batch's loss is divided by counts of the
whole mini-batch (reduced across data-parallel ranks by the backend), so the result does not depend on
the split.
"""
from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import torch

from agents.learners import Algorithm
from agents.rollout.batch import TrainBatch
from agents.training.backend import TrainingBackend
from agents.training.config import OptimConfig

__all__ = ["by_length", "engine_mismatch", "old_logprobs_from_update", "score_batch", "to_device", "update_batch"]


@torch.no_grad()
def score_batch(backend: TrainingBackend, algorithm: Algorithm, optim: OptimConfig, batch: TrainBatch, *,
                reuse_logprobs: bool = False) -> None:
    """Fill the rollout policy's log-probs (unless the update's own pass gives them:
    :func:`old_logprobs_from_update`), the reference's and the critic's values, micro-batch by micro-batch.

    ``reuse_logprobs`` (``rollout.reuse_logprobs``, for a sampler that runs the trained model itself): the
    rollout's own log-probs are the rollout policy's, and the policy runs only where values are needed."""
    backend.eval()
    rows, width = batch.input_ids.shape
    zeros = batch.input_ids.new_zeros((rows, width), dtype=torch.float32)
    old = None if old_logprobs_from_update(optim, algorithm, rows) else zeros.clone()
    reused = old is not None and reuse_logprobs and batch.rollout_logprobs is not None
    if reused:
        old = batch.rollout_logprobs.to(zeros).clone()
    ref = zeros.clone() if algorithm.uses_reference else None
    values = zeros.clone() if algorithm.uses_critic else None
    start = 0
    for mb in backend.micro_batches(batch):
        n, t = mb.input_ids.shape
        if reused:
            if values is not None:
                values[start : start + n, :t] = backend.forward(mb, with_values=True).values
        elif old is not None:
            out = backend.forward(mb, with_values=algorithm.uses_critic)
            old[start : start + n, :t] = out.logprobs
            if values is not None:
                values[start : start + n, :t] = out.values
        if ref is not None:
            ref[start : start + n, :t] = backend.reference_logprobs(mb)
        start += n
    batch.old_logprobs, batch.ref_logprobs, batch.values = old, ref, values


def old_logprobs_from_update(optim: OptimConfig, algorithm: Algorithm, rows: int) -> bool:
    """Whether the update's own forward pass can give the rollout policy's log-probs: one pass of
    one optimiser step over all ``rows`` (the policy has not moved when it runs), and neither a
    critic nor a KL reward that needs them before the advantages."""
    one_step = optim.update_epochs == 1 and not 0 < optim.mini_batch_size < rows
    kl_in_reward = algorithm.uses_reference and algorithm.config.kl_in_reward
    return one_step and not algorithm.uses_critic and not kl_in_reward


def update_batch(backend: TrainingBackend, algorithm: Algorithm, optim: OptimConfig, batch: TrainBatch, *,
                 shuffle_seed: int, with_entropy: bool) -> tuple[dict[str, float], int]:
    """``optim.update_epochs`` passes of mini-batch optimiser steps (shuffled by ``shuffle_seed``).

    Returns the mean of each statistic over optimiser steps, with ``updates/applied`` and
    ``updates/skipped`` (the steps the backend applied and those it skipped for a non-finite gradient
    norm), and the number of skips after the last applied step (for the run's
    :class:`~agents.training.health.UpdateWatch`)."""
    rows = len(batch)
    size = optim.mini_batch_size if 0 < optim.mini_batch_size < rows else rows
    shuffle = torch.Generator().manual_seed(shuffle_seed)
    separate_critic = algorithm.uses_critic and not algorithm.value_head
    totals: dict[str, float] = defaultdict(float)
    steps = applied = trailing_skips = 0
    gap_total, gap_count, gap_max = 0.0, 0, 0.0  # the engine's mismatch, when the update's pass gives old log-probs
    backend.train()
    for _ in range(optim.update_epochs):
        order = torch.randperm(rows, generator=shuffle) if size < rows else torch.arange(rows)
        for begin in range(0, rows, size):
            mini = batch.select(by_length(batch, order[begin : begin + size]))
            counts = backend.reduce_counts(algorithm.counts(mini))
            for mb in backend.micro_batches(mini):
                out = backend.forward(mb, with_entropy=with_entropy, with_values=algorithm.uses_critic)
                if mb.old_logprobs is None:  # the policy has not moved since the rollout (see score_batch)
                    mb = dataclasses.replace(mb, old_logprobs=out.logprobs.detach())
                    total, count, largest = _gap(mb)
                    gap_total, gap_count, gap_max = gap_total + total, gap_count + count, max(gap_max, largest)
                loss, mb_stats = algorithm.loss(mb, out, counts)
                if separate_critic:
                    critic_loss, critic_stats = algorithm.critic_loss(mb, out.values, counts)
                    loss = loss + critic_loss
                    mb_stats = {**mb_stats, **critic_stats}
                backend.backward(loss)
                for key, value in mb_stats.items():  # additive shares of the mini-batch's statistic
                    totals[key] += value
            norm = backend.step()
            totals["grad_norm"] += norm
            steps += 1
            applied += math.isfinite(norm)
            trailing_skips = 0 if math.isfinite(norm) else trailing_skips + 1
    stats = {**{key: value / steps for key, value in totals.items()},
             "updates/applied": float(applied), "updates/skipped": float(steps - applied),
             **_gap_stats(gap_total, gap_count, gap_max)}
    return stats, trailing_skips


def engine_mismatch(batch: TrainBatch) -> dict[str, float]:
    """How far the rollout engine's log-probs of the sampled tokens are from the trainer's for the same
    policy (mean and max absolute difference over trained tokens): near 0 when they agree, as with the HF
    sampler; a skipped or failed weight sync of a separate engine shows up here. Empty when either side
    is missing (no engine log-probs, or the trainer's come later, from the update's own pass, which
    :func:`update_batch` measures instead)."""
    return _gap_stats(*_gap(batch))


def _gap(batch: TrainBatch) -> tuple[float, int, float]:
    """(sum, count, max) of |rollout log-prob - old log-prob| over the batch's trained tokens ((0, 0, 0)
    when either is missing)."""
    if batch.rollout_logprobs is None or batch.old_logprobs is None:
        return 0.0, 0, 0.0
    keep = batch.trained_mask.bool()
    if not keep.any():
        return 0.0, 0, 0.0
    gap = (batch.rollout_logprobs.to(batch.old_logprobs) - batch.old_logprobs)[keep].abs()
    return float(gap.sum()), int(gap.numel()), float(gap.max())


def _gap_stats(total: float, count: int, largest: float) -> dict[str, float]:
    return {"rollout/logprob_gap_mean": total / count, "rollout/logprob_gap_max": largest} if count else {}


def by_length(batch: TrainBatch, rows: torch.Tensor) -> torch.Tensor:
    """``rows`` ordered by their number of tokens (ties keep their order)."""
    lengths = batch.attention_mask[rows].sum(dim=1).cpu()
    return rows[torch.argsort(lengths, stable=True)]


def to_device(batch: TrainBatch, device: torch.device) -> TrainBatch:
    """The batch with its tensors on ``device`` (the same object's fields when they are there already)."""
    changes = {f.name: getattr(batch, f.name).to(device) for f in dataclasses.fields(batch)
               if isinstance(getattr(batch, f.name), torch.Tensor) and getattr(batch, f.name).device != device}
    return dataclasses.replace(batch, **changes) if changes else batch
