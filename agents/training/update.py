"""One rollout batch's update, as the trainer runs it: the log-probs and values it needs first
(:func:`score_batch`), then ``optim.update_epochs`` passes of mini-batch optimiser steps (:func:`update_batch`).

Rows are ordered by length before a mini-batch is split into micro-batches, so that a micro-batch,
trimmed to its longest row, carries little padding; each micro-batch's loss is divided by counts of the
whole mini-batch (reduced across data-parallel ranks by the backend), so the result does not depend on
the split.

With several data-parallel ranks holding different numbers of rows (DAPO's dynamic sampling drops groups
rank by rank), every rank still runs as many optimiser steps, micro-batch passes and no-grad passes as
the rank with the most: a sharded engine gathers parameters in each forward and reduces gradients in
each backward, collectives every rank must enter. A rank short of rows runs idle passes (one row, a loss
of zero: nothing is added to the gradient) and empty mini-batches.
"""
from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

from agents.learners import Algorithm
from agents.rollout.batch import TrainBatch
from agents.training.backends import TrainingBackend
from agents.training.config import OptimConfig

__all__ = ["agent_turns", "by_length", "engine_mismatch", "old_logprobs_from_update", "score_batch", "to_device", "update_batch"]


@torch.no_grad()
def score_batch(backend: TrainingBackend, algorithm: Algorithm, optim: OptimConfig, batch: TrainBatch, *,
                reuse_logprobs: bool = False) -> None:
    """Fill the rollout policy's log-probs (unless the update's own pass gives them:
    :func:`old_logprobs_from_update`), the reference's and the critic's values, micro-batch by micro-batch.

    ``reuse_logprobs`` (the trainer passes it for an engine whose log-probs are the trainer's own and whose
    options ask for it: ``--engine.reuse_logprobs`` of the ``hf`` engine): the rollout's own log-probs are
    the rollout policy's, and the policy runs only where values are needed."""
    backend.eval()
    rows, width = batch.input_ids.shape
    zeros = batch.input_ids.new_zeros((rows, width), dtype=torch.float32)
    old = None if old_logprobs_from_update(optim, algorithm, rows) else zeros.clone()
    reused = old is not None and reuse_logprobs and batch.rollout_logprobs is not None
    if reused:
        old = batch.rollout_logprobs.to(zeros).clone()
    ref = zeros.clone() if algorithm.uses_reference else None
    values = zeros.clone() if algorithm.uses_critic else None

    def passes(mb: TrainBatch) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """The passes over ``mb`` this batch needs: (old log-probs, values, reference log-probs)."""
        out = None
        if reused:
            if values is not None:
                out = backend.forward(mb, with_values=True)
        elif old is not None:
            out = backend.forward(mb, with_values=algorithm.uses_critic)
        mb_ref = backend.reference_logprobs(mb) if ref is not None else None
        return (None if reused or out is None else out.logprobs), (None if out is None else out.values), mb_ref

    start = 0
    micro = backend.micro_batches(batch)
    idle = _most_over_ranks(backend, len(micro)) - len(micro)  # before any pass: the passes are collectives too
    for mb in micro:
        n, t = mb.input_ids.shape
        mb_old, mb_values, mb_ref = passes(mb)
        for full, part in ((old, mb_old), (values, mb_values), (ref, mb_ref)):
            if part is not None:
                full[start : start + n, :t] = part
        start += n
    for _ in range(idle):
        passes(_idle_batch(batch))
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
    size = optim.mini_batch_size if 0 < optim.mini_batch_size < rows else max(rows, 1)
    minis = _most_over_ranks(backend, math.ceil(rows / size))  # every rank takes as many optimiser steps
    shuffle = torch.Generator().manual_seed(shuffle_seed)
    separate_critic = algorithm.uses_critic and not algorithm.value_head
    totals: dict[str, float] = defaultdict(float)
    steps = applied = trailing_skips = 0
    gaps = _Gaps()  # the engine's mismatch, when the update's pass gives old log-probs
    backend.train()
    for _ in range(optim.update_epochs):
        order = torch.randperm(rows, generator=shuffle) if size < rows else torch.arange(rows)
        for begin in range(0, minis * size, size):
            mini = batch.select(by_length(batch, order[begin : begin + size]))  # empty past this rank's rows
            counts = backend.reduce_counts(algorithm.counts(mini))
            micro = backend.micro_batches(mini)
            idle = _most_over_ranks(backend, len(micro)) - len(micro)
            for mb in micro:
                out = backend.forward(mb, with_entropy=with_entropy, with_values=algorithm.uses_critic)
                if mb.old_logprobs is None:  # the policy has not moved since the rollout (see score_batch)
                    mb = dataclasses.replace(mb, old_logprobs=out.logprobs.detach())
                    gaps.add(mb)
                loss, mb_stats = algorithm.loss(mb, out, counts)
                if separate_critic:
                    critic_loss, critic_stats = algorithm.critic_loss(mb, out.values, counts)
                    loss = loss + critic_loss
                    mb_stats = {**mb_stats, **critic_stats}
                backend.backward(loss)
                for key, value in mb_stats.items():  # additive shares of the mini-batch's statistic
                    totals[key] += value
            for _ in range(idle):
                _idle_update_pass(backend, _idle_batch(batch), with_entropy=with_entropy, with_values=algorithm.uses_critic)
            norm = backend.step()
            totals["grad_norm"] += norm
            steps += 1
            applied += math.isfinite(norm)
            trailing_skips = 0 if math.isfinite(norm) else trailing_skips + 1
    stats = {**{key: value / steps for key, value in totals.items()},
             "updates/applied": float(applied), "updates/skipped": float(steps - applied),
             **gaps.stats()}
    return stats, trailing_skips


def _most_over_ranks(backend: TrainingBackend, count: int) -> int:
    """The largest of the data-parallel ranks' ``count`` (``count`` itself on one process); a collective."""
    if backend.world_size == 1:
        return count
    shares = torch.zeros(backend.world_size, dtype=torch.float64)
    shares[backend.rank] = count
    return int(backend.all_reduce_sum(shares).max())


def _idle_batch(batch: TrainBatch) -> TrainBatch:
    """One row for the passes a rank runs only to keep in step with ranks that hold more rows: the first of
    ``batch``, or for an empty batch two tokens, the second one trained (every pass then runs the whole
    model, as a real row's does)."""
    if len(batch):
        return batch.select([0]).trimmed()
    return TrainBatch(batch.input_ids.new_zeros((1, 2)), batch.attention_mask.new_ones((1, 2)),
                      batch.position_ids.new_tensor([[0, 1]]), batch.trained_mask.new_tensor([[0, 1]]),
                      batch.token_rewards.new_zeros((1, 2)), batch.scores.new_zeros(1), batch.group_index.new_zeros(1),
                      ["idle"], [None])


def _idle_update_pass(backend: TrainingBackend, mb: TrainBatch, *, with_entropy: bool, with_values: bool) -> None:
    """The forward and backward passes of a micro-batch with a loss of zero: the gradient is unchanged, and
    every parameter a real micro-batch reaches gets its (zero) share, so the engine's reductions line up."""
    out = backend.forward(mb, with_entropy=with_entropy, with_values=with_values)
    loss = (out.logprobs * 0).sum()
    for extra in (out.entropy, out.values):
        if extra is not None:
            loss = loss + (extra * 0).sum()
    backend.backward(loss)


def engine_mismatch(batch: TrainBatch) -> dict[str, float]:
    """How far the rollout engine's log-probs of the sampled tokens are from the trainer's for the same
    policy (mean and max absolute difference over trained tokens): near 0 when they agree, as with the HF
    sampler; a skipped or failed weight sync of a separate engine, or rollouts sampled by older weights
    (``rollout.max_staleness``), show up here. Also per search turn (``rollout/logprob_gap_turn{k}_mean``
    and ``_max``; :func:`agent_turns`), as a gap that grows with the turn points at the context (the
    engine's kernels over long contexts, its prefix cache) rather than at the weights. Empty when either
    side is missing (no engine log-probs, or the trainer's come later, from the update's own pass, which
    :func:`update_batch` measures instead)."""
    gaps = _Gaps()
    gaps.add(batch)
    return gaps.stats()


def agent_turns(batch: TrainBatch) -> torch.Tensor | None:
    """(B, T) the search turn of each agent token of the batch's rows: 1 for the agent's tokens up to the
    first environment observation after the prompt, 2 for those after it, ...; 0 on prompt, observation
    and padding tokens. Taken from each row's trajectory (who produced each token), ``None`` when a row
    has none (a hand-built batch)."""
    rows, width = batch.input_ids.shape
    if len(batch.trajectories) != rows or any(t is None for t in batch.trajectories):
        return None
    turns = np.zeros((rows, width), dtype=np.int64)
    for i, trajectory in enumerate(batch.trajectories):
        agent = trajectory.agent_mask[:width].astype(np.int64)
        starts = np.diff(agent, prepend=0) == 1  # an agent token after an environment one opens a turn
        turns[i, : len(agent)] = np.cumsum(starts) * agent
    return torch.from_numpy(turns).to(batch.input_ids.device)


@dataclass
class _Gaps:
    """Sums, counts and maxima of |rollout log-prob - old log-prob| over trained tokens, overall and per
    search turn, added up over (micro-)batches."""

    total: float = 0.0
    count: int = 0
    largest: float = 0.0
    turns: dict[int, list[float]] = field(default_factory=dict)  # turn -> [sum, count, max]

    def add(self, batch: TrainBatch) -> None:
        if batch.rollout_logprobs is None or batch.old_logprobs is None:
            return
        keep = batch.trained_mask.bool()
        if not keep.any():
            return
        gap = (batch.rollout_logprobs.to(batch.old_logprobs) - batch.old_logprobs).abs()
        self.total += float(gap[keep].sum())
        self.count += int(keep.sum())
        self.largest = max(self.largest, float(gap[keep].max()))
        turns = agent_turns(batch)
        if turns is None:
            return
        for turn in torch.unique(turns[keep]).tolist():
            cells = gap[keep & (turns == turn)]
            entry = self.turns.setdefault(int(turn), [0.0, 0, 0.0])
            entry[0] += float(cells.sum())
            entry[1] += int(cells.numel())
            entry[2] = max(entry[2], float(cells.max()))

    def stats(self) -> dict[str, float]:
        if not self.count:
            return {}
        out = {"rollout/logprob_gap_mean": self.total / self.count, "rollout/logprob_gap_max": self.largest}
        for turn, (total, count, largest) in sorted(self.turns.items()):
            out[f"rollout/logprob_gap_turn{turn}_mean"] = total / count
            out[f"rollout/logprob_gap_turn{turn}_max"] = largest
        return out


def by_length(batch: TrainBatch, rows: torch.Tensor) -> torch.Tensor:
    """``rows`` ordered by their number of tokens (ties keep their order)."""
    lengths = batch.attention_mask[rows].sum(dim=1).cpu()
    return rows[torch.argsort(lengths, stable=True)]


def to_device(batch: TrainBatch, device: torch.device) -> TrainBatch:
    """The batch with its tensors on ``device`` (the same object's fields when they are there already)."""
    changes = {f.name: getattr(batch, f.name).to(device) for f in dataclasses.fields(batch)
               if isinstance(getattr(batch, f.name), torch.Tensor) and getattr(batch, f.name).device != device}
    return dataclasses.replace(batch, **changes) if changes else batch
