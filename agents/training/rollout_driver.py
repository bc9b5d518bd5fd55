"""The rollout half of a training step, with one owner: :class:`RolloutDriver` holds the rollout engine, the
check of its weight syncs (:mod:`agents.rollout.sync_check`), the asynchronous pipeline
(``rollout.max_staleness``, :mod:`agents.training.async_rollout`), the run's seeds and the environment worker
(``rollout.env_worker``). The trainer owns one and asks it, through public methods, for each step's episodes,
for the engine made ready before an evaluation, and for the seeds of its other random streams.

A step's rollout (:meth:`RolloutDriver.roll_out`): the step's questions rolled out, and further rounds while
the algorithm keeps too few groups (dynamic sampling); also run a step ahead on a background thread.
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Mapping

import numpy as np
import torch

from agents.learners import Algorithm
from agents.policies.policy import HFPolicy
from agents.rollout.batch import TrainBatch, build_batch
from agents.rollout.collect import RolloutTimings, collect_rollouts
from agents.rollout.engine_weights import EngineWithWeights, check_engine_with_weights
from agents.rollout.engines import EngineSetup, RolloutEngine, lookup_engine
from agents.rollout.sync_check import SyncCheck, default_tolerance, env_probe, policy_logprobs
from agents.training.async_rollout import AsyncRollouts, RolloutParts, WeightsSnapshot, attach_engine
from agents.training.backends import TrainingBackend
from agents.training.backends.base import training_dtype
from agents.training.config import TrainConfig
from agents.training.console_log import say
from agents.training.health import TrainingFailed
from agents.training.run_state import RunState
from search_env import BatchSearchQAEnv
from search_env.trajectory import Trajectory
from search_env.worker import EnvWorker

__all__ = ["STREAMS", "RolloutDriver"]

#: Names of the random streams derived from (seed, step); fixed so that runs stay reproducible.
STREAMS = {"rollout": 0, "shuffle": 1, "eval": 2}


class RolloutDriver:
    """Plays a run's training episodes (see the module docstring).

    Args:
        config / policy / env / algorithm / backend: the trainer's (``backend`` owns ``policy``).
        state: the run's state, read for the current step and the questions' order (the trainer's, loaded
            in place from a checkpoint).
        engine: what samples the episodes; default: the engine ``rollout.engine`` names, over ``policy``, at
            the config's temperature and top-p. It is attached to ``backend`` here.

    Raises:
        ValueError: one line: the engine claims its own weights but lacks a member of
            :class:`~agents.rollout.engine_weights.EngineWithWeights`, or ``rollout.max_staleness`` asks for
            what the engine or the ranks cannot give (:func:`~agents.training.async_rollout.attach_engine`).
    """

    def __init__(self, config: TrainConfig, policy: HFPolicy, env: BatchSearchQAEnv, algorithm: Algorithm,
                 backend: TrainingBackend, state: RunState, *, engine: RolloutEngine | None = None) -> None:
        self.config, self.policy, self.env, self.algorithm, self.backend, self.state = config, policy, env, algorithm, backend, state
        #: What samples the episodes (:class:`~agents.rollout.engines.RolloutEngine`).
        self.engine: RolloutEngine = engine if engine is not None else self._build_engine()
        check_engine_with_weights(self.engine)
        #: Checks each weight sync of an engine with its own copy of the weights (``rollout.sync_check``), or None.
        self.sync_check = self._build_sync_check()
        #: The rollouts of the next steps, generated while a step updates (``rollout.max_staleness``), or None.
        self.pipeline: AsyncRollouts | None = attach_engine(
            self.engine, backend, max_staleness=config.rollout.max_staleness, steps=config.run.steps,
            roll_out=self.roll_out, ready=self.ready,
            reference=lambda: None if self.sync_check is None else self.probe_logprobs(self.sync_check.probe))
        #: With rollouts ahead on several ranks, a gloo group of the ranks for the rollouts' own collectives (made
        #: here, at the same point on every rank): a rollout on its thread then never takes a collective of the
        #: trainer's group, which the update on the main thread uses at the same time.
        self._rollout_group = (torch.distributed.new_group(backend="gloo")
                               if self.pipeline is not None and backend.world_size > 1 else None)
        self._worker: EnvWorker | None = None
        self._engine_closed = False

    # -- seeds and the environment ------------------------------------------------------------------
    def seed(self, stream: str, *more: int, at: int | None = None) -> int:
        """A seed for ``stream`` (a name of :data:`STREAMS`) at the current step (or step ``at``; and ``more``,
        e.g. a rollout round), from the run's seed (independent of other streams). The rank is no input:
        every rank derives the same seeds. A rollout's episodes are keyed by their place in the global batch
        besides (:meth:`roll_out`), but the ``"shuffle"`` seed permutes each rank's own rows, so with several
        mini-batches per pass (``optim.mini_batch_size`` below a step's rows) N ranks' mini-batches hold other
        rows than one process's, and their steps differ; with one mini-batch per pass nothing is shuffled."""
        step = self.state.step if at is None else at
        return int(np.random.SeedSequence([self.config.run.seed, STREAMS[stream], step, *more]).generate_state(1)[0])

    def rollout_env(self) -> BatchSearchQAEnv | EnvWorker:
        """What training rollouts step: ``env`` itself, or with ``rollout.env_worker`` a worker process
        serving it (:class:`~search_env.worker.EnvWorker`), forked at the first rollout."""
        if not self.config.rollout.env_worker:
            return self.env
        if self._worker is None:
            self._worker = EnvWorker(self.env)
        return self._worker

    @property
    def worker(self) -> EnvWorker | None:
        """The environment worker while one runs (``rollout.env_worker``, from the first rollout until :meth:`close`)."""
        return self._worker

    # -- a step's episodes ----------------------------------------------------------------------------
    def take(self, step: int) -> tuple[RolloutParts, dict[str, float]]:
        """The episodes of ``step`` (every one, the batch, the timings, the rounds) and the pipeline's metrics:
        rolled out now by the current weights, or with ``rollout.max_staleness`` taken from the pipeline
        (which launches the next steps' rollouts)."""
        if self.pipeline is None:
            self.rollout_env().set_reward_step(step)
            return self.roll_out(step), {}
        ahead, metrics = self.pipeline.take(step)
        return (ahead.trajectories, ahead.batch, ahead.timings, ahead.rounds), metrics

    def roll_out(self, step: int) -> RolloutParts:
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
        world, rank = self.backend.world_size, self.backend.rank
        wanted = self.config.rollout.questions_per_step // world  # this rank's share (whole question groups)
        group_size = self.config.algorithm.group_size
        pad = self.policy.codec.pad_id
        trajectories: list[Trajectory] = []
        kept: list[TrainBatch] = []
        groups: list[str] = []  # the kept groups' ids, in order
        sampled: dict[int, list[float]] = {}  # id(trajectory) -> the engine's log-probs of its ids
        timings = RolloutTimings()
        for round_ in range(self.algorithm.rollout_rounds):
            # The first round keeps the seed a step's rollout always had: runs without refills are unchanged.
            seed = self.seed("rollout", at=step) if round_ == 0 else self.seed("rollout", round_, at=step)
            questions = self.state.order.take(wanted * world)  # the same on every rank, which keeps its share
            questions = questions[rank * wanted : (rank + 1) * wanted]
            with self.decoding():
                agent = self.engine.agent(greedy=False, seed=seed, first_row=rank * wanted * group_size)
                self.check_sync(step)
                rollout = collect_rollouts(agent, self.rollout_env(), questions, group_size=group_size)
            trajectories += rollout.trajectories
            timings.add(rollout.timings)
            batch = self.algorithm.filter_batch(build_batch(rollout.trajectories, rollout.group_ids, pad,
                                                            rollout.sampled_logprobs))
            if rollout.sampled_logprobs is not None:
                sampled.update(zip(map(id, rollout.trajectories), rollout.sampled_logprobs))
            kept.append(batch)
            groups += [g for g in dict.fromkeys(batch.group_ids) if g not in groups]
            # Every rank takes the same rounds (the data order, and a sharded policy's gathers, stay in step):
            # another round while any rank is short of its groups.
            if not self._any_rank(len(groups) < wanted):
                break
        if len(kept) == 1 or not groups:  # one rollout's questions are at most ``wanted`` groups
            return trajectories, kept[0], timings, len(kept)
        chosen = set(groups[:wanted])
        rows = [(t, g) for b in kept for t, g in zip(b.trajectories, b.group_ids) if g in chosen]
        logprobs = [sampled[id(t)] for t, _ in rows] if all(id(t) in sampled for t, _ in rows) else None
        batch = build_batch([t for t, _ in rows], [g for _, g in rows], pad, logprobs)
        return trajectories, batch, timings, len(kept)

    def _any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (on the rollouts' own group when they run ahead)."""
        count = torch.tensor(float(flag))
        if self._rollout_group is None:
            return float(self.backend.all_reduce_sum(count)) > 0
        torch.distributed.all_reduce(count, group=self._rollout_group)
        return float(count) > 0

    @property
    def reuses_logprobs(self) -> bool:
        """The update may take the rollout's log-probs as the rollout policy's (the engine's are the trainer's
        own and it allows it: one forward pass fewer)."""
        return self.engine.logprobs_are_trainers and self.engine.reuse_logprobs

    # -- the engine's weights -------------------------------------------------------------------------
    def ready(self, step: int, snapshot: WeightsSnapshot | None = None) -> None:
        """The engine ready for step ``step``'s rollout ahead: the reward's step set, its weights synced (when
        stale, on the main thread between updates; or from ``snapshot``, earlier weights, on the rollout's
        thread) and the sync checked (against the trainer's log-probs kept with the snapshot)."""
        self.rollout_env().set_reward_step(step)
        if snapshot is not None:
            self.engine.sync(weights=snapshot)
        self.engine.wake_up()
        if self.sync_check is not None:
            self.sync_check.follow(self.engine, reference=None if snapshot is None else snapshot.reference, step=step)

    def check_sync(self, step: int | None = None) -> None:
        """Check the engine's weights if it synced since the last check (:class:`SyncCheck`), for the rollout
        of ``step`` (``None``: for none, as before an evaluation)."""
        if self.sync_check is not None:
            self.sync_check.follow(self.engine, step=step)

    def sync_metrics(self, step: int) -> dict[str, float]:
        """The sync check's metrics not yet taken for the rollouts of steps up to ``step`` (``rollout/sync_gap``),
        or none. With several ranks, each holding its own engine, also this rank's own gap
        (``rollout/sync_gap_rank{N}``): the step's log keeps every rank's, so a rank whose engine went unchecked
        shows."""
        metrics = self.sync_check.take_metrics(step) if self.sync_check is not None else {}
        if metrics and self.backend.world_size > 1:
            metrics[f"rollout/sync_gap_rank{self.backend.rank}"] = metrics["rollout/sync_gap"]
        return metrics

    def decoding(self) -> AbstractContextManager[Any]:
        """The backend's :meth:`~agents.training.backends.base.TrainingBackend.generation` block when the engine
        decodes with the trained policy itself; none for an engine with its own copy of the weights, which
        takes them parameter by parameter when they are stale (gathering a ZeRO-3 policy whole for it
        would undo that)."""
        return self.backend.generation() if self.engine.decodes_trained_policy else nullcontext()

    def ready_for_evaluation(self) -> None:
        """Before an evaluation: the rollouts in flight ended, then every rank's engine on the current weights
        (a collective under ZeRO-3) and its sync checked. As those are the weights the next launch takes
        anyway (or a snapshot carries its own), evaluating never changes what training samples."""
        if self.pipeline is not None:
            self.pipeline.settle()
        self.engine.wake_up()
        self.check_sync()

    def probe_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """The trained policy's log-probs of ``sequences`` as the backend computes them for rollouts (eval
        mode, its precision), within its ``scoring()``: a sharded policy is gathered module by module as the
        forward passes need it, never whole (every rank scores the same sequences, as every rank checks its
        own engine's sync)."""
        self.backend.eval()
        with self.backend.scoring():
            return policy_logprobs(self.policy, sequences)

    # -- checkpoints and the end ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds of the rollouts: with ``rollout.max_staleness``, the next steps' episodes
        (finished first) as ``rollout_ahead`` and the sync gaps measured for them, not yet logged, as
        ``sync_gaps_ahead``; with several ranks every rank's own, as ``rollout_ahead_ranks`` and
        ``sync_gaps_ahead_ranks`` (lists by rank, gathered on every rank: rank 0 alone writes the checkpoint);
        nothing otherwise."""
        if self.pipeline is None:
            return {}
        ahead = self.pipeline.state_dict()  # settles first: every gap of the rollouts ahead is measured
        gaps = self.sync_check.state_dict() if self.sync_check is not None else []
        if self.backend.world_size == 1:
            return {"rollout_ahead": ahead, "sync_gaps_ahead": gaps}
        return {"rollout_ahead_ranks": self.backend.all_gather_object(ahead),
                "sync_gaps_ahead_ranks": self.backend.all_gather_object(gaps)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take the rollouts ahead that :meth:`state_dict` wrote (a checkpoint without them leaves none; with
        several ranks, this rank's own). A checkpoint whose rollouts ahead were split over another number of
        ranks is refused in one line: they hold other rows."""
        if self.pipeline is None:
            return
        world = self.backend.world_size
        ranks = state.get("rollout_ahead_ranks")
        saved = len(ranks) if ranks is not None else (1 if state.get("rollout_ahead") else world)
        if saved != world:
            raise ValueError(f"the checkpoint's rollouts ahead were made on {saved} rank(s), this run has {world}: "
                             f"resume on {saved}")
        self.pipeline.load_state_dict(state.get("rollout_ahead") if ranks is None else ranks[self.backend.rank])
        gaps = state.get("sync_gaps_ahead") if ranks is None else state.get("sync_gaps_ahead_ranks", [[]] * world)[self.backend.rank]
        if self.sync_check is not None:
            self.sync_check.load_state_dict(gaps or [])

    def close(self) -> None:
        """Wait for a rollout in flight and stop the environment worker, if one runs (a later rollout starts
        another)."""
        if self.pipeline is not None:
            self.pipeline.close()
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def close_engine(self) -> None:
        """Close the engine (servers it launched are stopped), once."""
        if not self._engine_closed:
            self._engine_closed = True
            self.engine.close()

    # -- building -------------------------------------------------------------------------------------
    def _build_engine(self) -> RolloutEngine:
        """The engine ``rollout.engine`` names, with the ``engine`` group's options, over the policy (built
        within the backend's ``generation()`` where it copies the weights: whole there)."""
        config = self.config
        setup = EngineSetup(self.policy, temperature=config.rollout.temperature, top_p=config.rollout.top_p,
                            max_context=config.env.max_context, seed=config.run.seed, whole_weights=self.backend.generation)
        return lookup_engine(config.rollout.engine).build(config.engine, setup)

    def _build_sync_check(self) -> SyncCheck | None:
        """The check of ``rollout.sync_check`` for an engine that keeps its own weights
        (:class:`~agents.rollout.engine_weights.EngineWithWeights`; ``None`` for one that decodes the trained
        policy itself, whose gap is 0 by construction, for one with no weights to train, or ``off``). Its
        probe comes from the training questions' prompts, seeded by the run's seed."""
        rollout, engine = self.config.rollout, self.engine
        if rollout.sync_check == "off" or not isinstance(engine, EngineWithWeights):
            return None
        trainer_dtype = str(training_dtype(self.config.run.dtype, self.backend.device))
        tolerance = rollout.sync_tolerance or default_tolerance(engine.dtype, trainer_dtype)
        name = rollout.engine if type(engine) is lookup_engine(rollout.engine).engine else type(engine).__name__
        return SyncCheck(env_probe(self.env, seed=self.config.run.seed), self.probe_logprobs, engine_name=name,
                         mode=rollout.sync_check, tolerance=tolerance, error=TrainingFailed, say=say)
