"""The learner's batch: padded token tensors built from trajectories, with the trajectories beside them.

Every per-token tensor is aligned with ``input_ids``: entry ``[b, t]`` belongs to token ``t`` of row ``b``
(its log-prob given the tokens before it, whether it is trained on, the reward it carries). Rows are
right-padded. The rollout fills the token fields; the trainer fills log-probs, values and advantages.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Sequence

import numpy as np
import torch

from agents.policies.policy import position_ids_from_mask
from search_env.trajectory import AGENT, Trajectory

__all__ = ["TrainBatch", "build_batch"]

_ROW_TENSORS = (
    "input_ids", "attention_mask", "position_ids", "trained_mask", "token_rewards", "scores", "group_index",
    "rollout_logprobs", "old_logprobs", "ref_logprobs", "values", "advantages", "returns",
)


@dataclass
class TrainBatch:
    """Padded episodes for one update (see the module docstring).

    Attributes:
        input_ids: (B, T) prompt and response ids, right-padded.
        attention_mask: (B, T) 1 on real tokens, 0 on padding.
        position_ids: (B, T) positions counting real tokens only.
        trained_mask: (B, T) 1 where the learner computes its loss (agent tokens it trains on).
        token_rewards: (B, T) the episode reward on the row's last trained token, 0 elsewhere.
        scores: (B,) the episode reward.
        group_index: (B,) index of the row's question group, for group baselines.
        group_ids: the per-question id of each row (groups are never taken from batch positions).
        trajectories: the episode records the rows were built from.
        rollout_logprobs: (B, T) the log-prob the rollout engine gave each id it sampled (0 elsewhere), or
            ``None`` when the engine reports none; compared with the trainer's to measure their mismatch.
        old_logprobs / ref_logprobs / values / advantages / returns: (B, T), filled by the trainer.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    trained_mask: torch.Tensor
    token_rewards: torch.Tensor
    scores: torch.Tensor
    group_index: torch.Tensor
    group_ids: list[str]
    trajectories: list[Trajectory]
    rollout_logprobs: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def first_trained_column(self) -> int:
        """The first column any row trains on (the width when none does): log-probs before it are never used."""
        columns = self.trained_mask.bool().any(dim=0).nonzero()
        return int(columns[0]) if len(columns) else int(self.trained_mask.shape[1])

    def select(self, rows: Sequence[int] | torch.Tensor) -> TrainBatch:
        """The batch restricted to ``rows`` (in that order); padding columns are kept."""
        index = torch.as_tensor(rows, dtype=torch.long)
        picked = [int(i) for i in index.tolist()]
        changes = {name: getattr(self, name)[index] for name in _ROW_TENSORS if getattr(self, name) is not None}
        changes["group_ids"] = [self.group_ids[i] for i in picked]
        changes["trajectories"] = [self.trajectories[i] for i in picked]
        return replace(self, **changes)

    def micro_batches(self, size: int) -> list[TrainBatch]:
        """Consecutive slices of at most ``size`` rows, each trimmed to its own longest row."""
        if size < 1:
            raise ValueError(f"micro-batch size must be >= 1, got {size}")
        out = []
        for start in range(0, len(self), size):
            part = self.select(range(start, min(start + size, len(self))))
            out.append(part.trimmed())
        return out

    def trimmed(self) -> TrainBatch:
        """The batch without trailing columns that are padding in every row (less compute, same result)."""
        length = int(self.attention_mask.sum(dim=1).max().item()) if len(self) else 0
        if length == self.input_ids.shape[1]:
            return self
        changes = {
            f.name: getattr(self, f.name)[:, :length]
            for f in fields(self)
            if f.name in _ROW_TENSORS and getattr(self, f.name) is not None and getattr(self, f.name).dim() == 2
        }
        return replace(self, **changes)


def build_batch(trajectories: Sequence[Trajectory], group_ids: Sequence[str], pad_id: int,
                sampled_logprobs: Sequence[Sequence[float]] | None = None) -> TrainBatch:
    """The right-padded learner batch of ``trajectories`` (old/ref log-probs, values, advantages left empty).

    ``sampled_logprobs`` (a :class:`~agents.rollout.collect.Rollout`'s, token-aligned with each
    trajectory's ids) become ``rollout_logprobs``.

    Rows hold each trajectory's ids as they are; ``trained_mask`` is ``trajectory.trained`` (checked to lie
    on agent tokens only), the episode reward sits on the last trained token, and ``group_index`` numbers
    the distinct ``group_ids`` in order of first appearance.
    """
    if len(trajectories) != len(group_ids):
        raise ValueError(f"{len(trajectories)} trajectories but {len(group_ids)} group ids")
    if not trajectories:
        raise ValueError("no trajectories to batch")
    width = max(len(t.token_ids) for t in trajectories)
    n = len(trajectories)
    input_ids = np.full((n, width), pad_id, dtype=np.int64)
    attention = np.zeros((n, width), dtype=np.int64)
    trained = np.zeros((n, width), dtype=np.float32)
    rewards = np.zeros((n, width), dtype=np.float32)
    for b, traj in enumerate(trajectories):
        length = len(traj.token_ids)
        mask = np.frombuffer(bytes(traj.trained), dtype=np.uint8)
        if len(mask) != length or len(traj.producers) != length:
            raise ValueError(f"trajectory {b}: {length} ids but {len(mask)} trained flags and {len(traj.producers)} producers")
        if np.any(mask & (np.frombuffer(bytes(traj.producers), dtype=np.uint8) != AGENT)):
            raise ValueError(f"trajectory {b}: a trained token was not produced by the agent")
        input_ids[b, :length] = traj.token_ids
        attention[b, :length] = 1
        trained[b, :length] = mask
        last = np.flatnonzero(mask)
        if len(last):
            rewards[b, last[-1]] = traj.reward
    rollout_logprobs = None
    if sampled_logprobs is not None:
        if len(sampled_logprobs) != n:
            raise ValueError(f"{n} trajectories but {len(sampled_logprobs)} rows of sampled log-probs")
        rollout_logprobs = torch.zeros((n, width), dtype=torch.float32)
        for b, row in enumerate(sampled_logprobs):
            if len(row) != len(trajectories[b].token_ids):
                raise ValueError(f"trajectory {b}: {len(trajectories[b].token_ids)} ids but {len(row)} sampled log-probs")
            rollout_logprobs[b, : len(row)] = torch.tensor(row, dtype=torch.float32)
    index: dict[str, int] = {}
    groups = [index.setdefault(g, len(index)) for g in group_ids]
    mask_t = torch.from_numpy(attention)
    return TrainBatch(
        input_ids=torch.from_numpy(input_ids), attention_mask=mask_t, position_ids=position_ids_from_mask(mask_t),
        trained_mask=torch.from_numpy(trained),
        token_rewards=torch.from_numpy(rewards), scores=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        group_index=torch.tensor(groups, dtype=torch.long), group_ids=list(group_ids), trajectories=list(trajectories),
        rollout_logprobs=rollout_logprobs,
    )
