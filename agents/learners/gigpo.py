"""GiGPO, Group-in-Group Policy Optimization (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM
Agent Training", arXiv:2505.10978; verl-agent): GRPO's episode-level group advantage plus a step-level
advantage that gives each search turn its own credit.

Inside a question's group of episodes, the turns that start from the same state (the *anchor state*) form
a step group; each turn's discounted return is normalised within its step group, and every trained token of
the turn gets ``A = A_episode + step_weight · A_step``. Two episodes whose first searches returned the same
passages but which then answered differently are compared at the turn where they parted, which an outcome
advantage shared by the whole episode cannot do.

How a trajectory is cut into turns: a turn is a maximal run of agent-produced tokens after the prompt
(``Trajectory.producers``); the environment tokens between two runs (search results, error messages) are
the observation the next turn starts from.

Where this follows GiGPO and where it differs:

* Episode advantage: GiGPO's (the group's mean-std normalised score; ``scale_rewards=False`` gives its
  mean-only variant), computed as GRPO's here, degenerate groups included (a singleton or an all-equal
  group gets 0).
* Step return: GiGPO's discounted return from the turn, with ``step_gamma`` per turn (verl-agent: 0.95).
  The reward of a search episode is its outcome only, so turn k of K gets ``step_gamma^(K-1-k) x score``
  (the score as the algorithm shaped it: overlong penalty, KL in the reward).
* Anchor state: GiGPO groups steps whose current observation is identical, whatever the step's index. A
  search agent's state is its whole context, not the last result, so here the anchor is the turn's index
  with every observation seen since the prompt (``anchor="observations"``: same results in the same order,
  whatever the queries' wording), or the exact token context before the turn (``anchor="context"``:
  identical histories, agent text included; groups form only where sampling repeated itself). The first
  turn of every episode of a group shares the empty anchor, as GiGPO's initial states do.
* Step normalisation: as the episode's (std or not with ``scale_rewards``); a step group of one turn, or
  whose returns are all equal, adds 0, where verl-agent passes a singleton's return through unnormalised.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Hashable, NamedTuple

import numpy as np
import torch

from agents.learners.advantages import group_normalized_scores
from agents.learners.core import as_bool
from agents.learners.grpo import GRPO, GRPOConfig
from agents.learners.registry import register_advantage, register_algorithm

if TYPE_CHECKING:
    from agents.rollout.batch import TrainBatch
    from search_env.trajectory import Trajectory

__all__ = ["ANCHORS", "GiGPO", "GiGPOConfig", "Turn", "gigpo_advantages", "turn_spans", "turns"]

ANCHORS = ("observations", "context")
"""What makes two turns' starting states the same (see the module docstring)."""


@dataclass
class GiGPOConfig(GRPOConfig):
    """GiGPO's settings: GRPO's (the episode advantage, its DAPO options) plus the step level's.

    Attributes:
        step_weight: ω, the step advantage's weight in ``A_episode + ω · A_step`` (verl-agent:
            ``step_advantage_w`` 1.0); 0 gives GRPO's advantages.
        step_gamma: discount per turn of the step return (verl-agent's ``gamma`` 0.95): with an outcome-only
            reward a turn earns step_gamma^(turns left after it) x the score, so from one anchor the turn
            that reaches the same score in fewer searches earns more.
        anchor: ``"observations"`` (the turn index and the observations seen so far) or ``"context"`` (the
            exact token context before the turn).
    """

    step_weight: float = 1.0  # verl-agent GiGPO: algorithm.gigpo.step_advantage_w
    step_gamma: float = 0.95  # verl-agent GiGPO: algorithm.gamma
    anchor: str = "observations"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.step_weight < 0:
            raise ValueError(f"step_weight must be >= 0, got {self.step_weight}")
        if not 0.0 <= self.step_gamma <= 1.0:
            raise ValueError(f"step_gamma must be in [0, 1], got {self.step_gamma}")
        if self.anchor not in ANCHORS:
            raise ValueError(f"unknown anchor {self.anchor!r}; known: {', '.join(ANCHORS)}")


class Turn(NamedTuple):
    """One agent turn of a batch row: columns ``[start, end)``, its index among the row's ``count`` turns,
    and its anchor key (equal keys of one question group form a step group)."""

    row: int
    start: int
    end: int
    index: int
    count: int
    anchor: Hashable


def turn_spans(trajectory: Trajectory) -> list[tuple[int, int]]:
    """``[start, end)`` of each maximal run of agent-produced tokens after the prompt, in order."""
    agent = trajectory.agent_mask.copy()
    agent[: trajectory.prompt_length] = False
    edges = np.diff(np.concatenate([[0], agent.astype(np.int8), [0]]))
    return [(int(s), int(e)) for s, e in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1))]


def turns(batch: TrainBatch, anchor: str) -> list[Turn]:
    """Every agent turn of every row of ``batch`` with its anchor key (``anchor`` as in :class:`GiGPOConfig`);
    the key includes the row's question group, so step groups never cross questions.

    Raises:
        ValueError: the batch does not carry one trajectory per row (turns are read from them).
    """
    if anchor not in ANCHORS:
        raise ValueError(f"unknown anchor {anchor!r}; known: {', '.join(ANCHORS)}")
    if len(batch.trajectories) != len(batch):
        raise ValueError(f"GiGPO reads turns from the trajectories: {len(batch)} rows but {len(batch.trajectories)} trajectories")
    out = []
    for row, trajectory in enumerate(batch.trajectories):
        spans = turn_spans(trajectory)
        ids = trajectory.token_ids
        group = int(batch.group_index[row])
        for k, (start, end) in enumerate(spans):
            if anchor == "context":
                key: Hashable = tuple(ids[:start])
            else:  # the observations between the earlier turns, in order
                key = tuple(tuple(ids[spans[j][1]:spans[j + 1][0]]) for j in range(k))
            out.append(Turn(row, start, end, k, len(spans), (group, k, key)))
    return out


@register_advantage("gigpo")
def gigpo_advantages(batch: TrainBatch, scores: torch.Tensor, config: GiGPOConfig) -> torch.Tensor:
    """GiGPO's (B, T) advantages: the row's group-normalised score on every trained token, plus
    ``step_weight`` x the turn's step-group-normalised discounted return on the turn's trained tokens."""
    keep = as_bool(batch.trained_mask)
    episode = group_normalized_scores(scores, batch.group_index, scale=config.scale_rewards).to(torch.float64)
    advantages = episode[:, None].expand(keep.shape).clone()
    steps = turns(batch, config.anchor)
    if steps and config.step_weight:
        keys: dict[Hashable, int] = {}
        groups = torch.tensor([keys.setdefault(t.anchor, len(keys)) for t in steps], dtype=torch.long)
        returns = torch.tensor([config.step_gamma ** (t.count - 1 - t.index) * float(scores[t.row]) for t in steps],
                               dtype=torch.float64)
        step = group_normalized_scores(returns, groups, scale=config.scale_rewards)
        for turn, value in zip(steps, step.tolist()):
            advantages[turn.row, turn.start:turn.end] += config.step_weight * value
    out_dtype = scores.dtype if scores.is_floating_point() else torch.get_default_dtype()
    return torch.where(keep, advantages, torch.zeros((), dtype=advantages.dtype)).to(out_dtype)


@register_algorithm
class GiGPO(GRPO):
    """Group-in-Group Policy Optimization: GRPO plus turn-level credit from step groups of identical anchor
    states inside a question's group (see the module docstring)."""

    name = "gigpo"
    config_class = GiGPOConfig
    config: GiGPOConfig
    advantage_estimator = "gigpo"

    def compute_advantages(self, batch: TrainBatch) -> dict[str, float]:
        """GRPO's, with the ``gigpo`` estimator; also logs the share of later turns (after the first, whose
        anchor every episode of a group shares) whose step group holds another turn
        (``gigpo/shared_turn_frac``: how often the step level had something to compare)."""
        stats = super().compute_advantages(batch)
        steps = turns(batch, self.config.anchor)
        sizes: dict[Hashable, int] = {}
        for t in steps:
            sizes[t.anchor] = sizes.get(t.anchor, 0) + 1
        later = [t for t in steps if t.index > 0]
        stats["gigpo/shared_turn_frac"] = sum(sizes[t.anchor] > 1 for t in later) / len(later) if later else 0.0
        return stats
