"""One training step's rollout: the step's questions rolled out, and further rounds while the algorithm
keeps too few groups (dynamic sampling); the trainer's ``_rollout_batch``, also run a step ahead on a
background thread (:mod:`agents.training.async_rollout`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from agents.rollout.batch import TrainBatch, build_batch
from agents.rollout.collect import RolloutTimings, collect_rollouts
from search_env.trajectory import Trajectory

if TYPE_CHECKING:
    from agents.training.trainer import Trainer

__all__ = ["rollout_batch"]


def rollout_batch(trainer: Trainer, step: int) -> tuple[list[Trajectory], TrainBatch, RolloutTimings, int]:
    """Roll out ``questions_per_step`` questions and keep the rows the algorithm keeps; while fewer than
    ``questions_per_step`` groups are kept, roll out further questions, up to the algorithm's
    ``rollout_rounds`` (GRPO's ``dynamic_sampling_rounds``), and train on the first groups kept. With
    several ranks, a round runs on every rank while any rank is short of its share, and ranks may keep
    different numbers of rows (:func:`~agents.training.update.update_batch` keeps their passes in step).

    A round's seed is the same on every rank, and each rank's agent starts at its share's place in the
    round's global batch (question index x ``group_size`` + sample), so every episode is sampled as one
    process samples it: N ranks roll out one process's episodes. What they keep after a refill is not
    one process's: each rank keeps the first groups of its own share, where one process keeps the
    first groups of the whole batch (the same only when no round refills).
    Seeds are those of ``step`` (a rollout ahead is for the step after the trainer's).
    Returns every episode rolled out, the batch, the summed timings and the rounds taken."""
    world, rank = trainer.backend.world_size, trainer.backend.rank
    wanted = trainer.config.rollout.questions_per_step // world  # this rank's share (whole question groups)
    group_size = trainer.config.algorithm.group_size
    pad = trainer.policy.codec.pad_id
    trajectories: list[Trajectory] = []
    kept: list[TrainBatch] = []
    groups: list[str] = []  # the kept groups' ids, in order
    sampled: dict[int, list[float]] = {}  # id(trajectory) -> the engine's log-probs of its ids
    timings = RolloutTimings()
    for round_ in range(trainer.algorithm.rollout_rounds):
        # The first round keeps the seed a step's rollout always had: runs without refills are unchanged.
        seed = trainer._seed("rollout", at=step) if round_ == 0 else trainer._seed("rollout", round_, at=step)
        questions = trainer.order.take(wanted * world)  # the same on every rank, which keeps its share
        questions = questions[rank * wanted : (rank + 1) * wanted]
        with trainer._decoding():
            agent = trainer.engine.agent(greedy=False, seed=seed, first_row=rank * wanted * group_size)
            trainer._check_sync()
            rollout = collect_rollouts(agent, trainer.rollout_env(), questions, group_size=group_size)
        trajectories += rollout.trajectories
        timings.add(rollout.timings)
        batch = trainer.algorithm.filter_batch(build_batch(rollout.trajectories, rollout.group_ids, pad,
                                                        rollout.sampled_logprobs))
        if rollout.sampled_logprobs is not None:
            sampled.update(zip(map(id, rollout.trajectories), rollout.sampled_logprobs))
        kept.append(batch)
        groups += [g for g in dict.fromkeys(batch.group_ids) if g not in groups]
        # Every rank takes the same rounds (the data order, and a sharded policy's gathers, stay in step):
        # another round while any rank is short of its groups.
        if float(trainer.backend.all_reduce_sum(torch.tensor(float(len(groups) < wanted)))) == 0:
            break
    if len(kept) == 1 or not groups:  # one rollout's questions are at most ``wanted`` groups
        return trajectories, kept[0], timings, len(kept)
    chosen = set(groups[:wanted])
    rows = [(t, g) for b in kept for t, g in zip(b.trajectories, b.group_ids) if g in chosen]
    logprobs = [sampled[id(t)] for t, _ in rows] if all(id(t) in sampled for t, _ in rows) else None
    batch = build_batch([t for t, _ in rows], [g for _, g in rows], pad, logprobs)
    return trajectories, batch, timings, len(kept)
