"""Asynchronous, off-policy rollouts (``rollout.max_staleness 1``): the next step's episodes are generated
while this step updates.

The pipeline, one step ahead (as verl's one-step-off trainer and NeMo RL's async GRPO keep it): at the start
of step t the episodes of step t are taken (waiting for them if they are still being generated), the engine
takes the weights of the t steps done, and the rollout of step t+1 starts on a background thread; the main
thread then updates on step t's episodes. So step t's episodes were sampled by the weights after t-1 steps,
exactly one version behind (step 0's by the initial weights, none behind), whatever the timing: which
weights sample which step is fixed by the step alone, and runs stay reproducible.

Weight syncs happen only where the engine is idle, on the main thread, between the optimiser steps: the
engine is attached to the backend through :class:`DeferredSteps`, which holds back the backend's post-step
hooks (the engine's "weights are stale" mark) until :meth:`AsyncRollouts.settle`, called once the rollout in
flight has ended. A sync therefore never races a generation, the background rollout never syncs, and the
sync check (``rollout.sync_check``) scores the engine right after each sync against the weights it was sent.
An evaluation waits for the rollout in flight before it syncs the current weights; as those are the weights
the next launch takes anyway, evaluating never changes what training samples.

Each step's rollout records the version (the steps done) of the weights that sampled it
(:attr:`StepRollout.version`); the step logs its staleness, the time the update waited for the rollout
(``time/update_waited``), the time the engine sat idle before the launch of the next rollout, waiting for
the update and the sync (``time/rollout_waited``), and the sync's time (``time/weight_sync``).

Checkpoints: a rollout in flight is finished and saved in the checkpoint (:meth:`AsyncRollouts.state_dict`).
It was sampled by weights a resumed run no longer has (they were replaced by the update of the step the
checkpoint ends), so it could not be regenerated; with it, a run stopped and resumed takes the steps of a
run straight through.

Failures: an error of the background rollout (a dead server: one line naming the replica) is raised on the
main thread when the step takes its episodes or the pipeline settles; :meth:`AsyncRollouts.close` waits for
the rollout in flight (requests have timeouts; a closed engine fails them at once), so no thread outlives
the trainer. The thread is a daemon besides, so a process that exits otherwise does not wait for it.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, fields
from typing import Any, Callable

import torch

from agents.rollout.batch import TrainBatch
from agents.rollout.collect import RolloutTimings
from search_env.trajectory import Span, ToolCall, Trajectory

__all__ = ["AsyncRollouts", "DeferredSteps", "StepRollout", "attach_engine"]

#: What rolling out one step gives (the trainer's ``_rollout_batch``): every episode, the batch, timings, rounds.
RolloutParts = tuple[list[Trajectory], TrainBatch, RolloutTimings, int]


@dataclass
class StepRollout:
    """The episodes of one training step.

    Attributes:
        step: the training step they are for.
        version: the weights that sampled them: those after ``version`` training steps (``step - version``
            versions behind the weights the step updates).
        trajectories: every episode rolled out (all rounds).
        batch: the rows the algorithm kept.
        timings: where the rollout's time went.
        rounds: rollout rounds taken (dynamic sampling refills).
        finished_at: ``time.perf_counter()`` when the rollout ended (``None`` once loaded from a checkpoint:
            a resumed run's clock is another).
    """

    step: int
    version: int
    trajectories: list[Trajectory]
    batch: TrainBatch
    timings: RolloutTimings
    rounds: int
    finished_at: float | None = None

    def state_dict(self) -> dict[str, Any]:
        """Plain data and tensors (a checkpoint is loaded with ``weights_only``): the episodes as JSON text,
        the batch's tensors as they are and its rows as indices into the episodes."""
        where = {id(t): i for i, t in enumerate(self.trajectories)}
        batch = self.batch
        return {
            "step": self.step, "version": self.version, "rounds": self.rounds,
            "timings": [getattr(self.timings, f.name) for f in fields(RolloutTimings)],
            "trajectories": json.dumps([t.to_dict() for t in self.trajectories]),
            "batch_rows": [where[id(t)] for t in batch.trajectories],
            "batch_group_ids": list(batch.group_ids),
            "batch_tensors": {f.name: getattr(batch, f.name) for f in fields(TrainBatch)
                              if isinstance(getattr(batch, f.name), torch.Tensor)},
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> StepRollout:
        trajectories = [_trajectory(data) for data in json.loads(state["trajectories"])]
        batch = TrainBatch(**state["batch_tensors"], group_ids=list(state["batch_group_ids"]),
                           trajectories=[trajectories[i] for i in state["batch_rows"]])
        return cls(int(state["step"]), int(state["version"]), trajectories, batch,
                   RolloutTimings(*state["timings"]), int(state["rounds"]))


def _trajectory(data: dict[str, Any]) -> Trajectory:
    """The :class:`Trajectory` of :meth:`Trajectory.to_dict`'s ``data``."""
    return Trajectory(**{**data, "producers": bytearray(data["producers"]), "trained": bytearray(data["trained"]),
                         "spans": [Span(**span) for span in data["spans"]],
                         "tool_calls": [ToolCall(**call) for call in data["tool_calls"]]})


class DeferredSteps:
    """The backend as the engine sees it (``engine.attach(DeferredSteps(backend))``): everything is the
    backend's, except that the post-step hooks the engine adds run at :meth:`release`, not at each optimiser
    step, so that the engine marks its weights stale only where it may sync them."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._hooks: list[Callable[[], None]] = []
        self._stepped = False
        backend.add_post_step_hook(self._after_step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def add_post_step_hook(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)

    def _after_step(self) -> None:
        self._stepped = True

    def release(self) -> None:
        """Run the held-back hooks once if the backend stepped since the last release."""
        if self._stepped:
            self._stepped = False
            for hook in self._hooks:
                hook()


class AsyncRollouts:
    """The one-step-ahead pipeline of the module docstring.

    Args:
        roll_out: the rollout of a step (the trainer's ``_rollout_batch``); run on the background thread
            for the steps ahead, with the engine's weights already synced.
        ready: readies the engine for the rollout of a step on the main thread (the reward's step set, the
            weights synced when stale, the sync checked).
        steps: the run's steps; no rollout is started past the last.
    """

    def __init__(self, roll_out: Callable[[int], RolloutParts], ready: Callable[[int], None], deferred: DeferredSteps,
                 steps: int) -> None:
        self._roll_out, self._ready, self._deferred, self._steps = roll_out, ready, deferred, steps
        self._thread: threading.Thread | None = None
        self._pending: StepRollout | None = None  # finished and not yet taken
        self._error: BaseException | None = None

    @property
    def in_flight(self) -> bool:
        """A rollout runs on the background thread."""
        return self._thread is not None

    def take(self, step: int) -> tuple[StepRollout, dict[str, float]]:
        """The episodes of ``step`` (waiting for the rollout started ahead, or rolled out now by the current
        weights, those of ``step`` steps, when none was), and the pipeline's metrics of the step; then the
        rollout of step + 1 is started in the background by these weights (unless ``step`` is the run's
        last). Call it with the weights of ``step`` training steps."""
        sync_s, started = 0.0, time.perf_counter()
        self._join()
        waited = time.perf_counter() - started
        rollout, self._pending = self._pending, None
        if rollout is not None and rollout.step != step:
            raise RuntimeError(f"the rollout ahead is for step {rollout.step}, not step {step}")
        if rollout is None:  # the first step, or a resumed run without a rollout ahead: on-policy, now
            sync_s = self._prepare(step)
            rollout = self._finish(step, step, *self._roll_out(step))
        behind = float(step - rollout.version)  # every row of a step's rollout has the same version
        metrics = {"rollout/staleness_mean": behind, "rollout/staleness_max": behind, "time/update_waited": waited}
        if step + 1 < self._steps:
            sync_s = self._prepare(step + 1)
            if rollout.finished_at is not None:
                metrics["time/rollout_waited"] = time.perf_counter() - rollout.finished_at
            self._start(step + 1, step)
        metrics["time/weight_sync"] = sync_s
        return rollout, metrics

    def settle(self) -> None:
        """Wait for the rollout in flight (keeping its episodes for their step) and let the engine see the
        optimiser steps since: it syncs at its next rollout or evaluation."""
        self._join()
        self._deferred.release()

    def state_dict(self) -> dict[str, Any] | None:
        """The rollout ahead, finished first (see the module docstring), or ``None``."""
        self.settle()
        return None if self._pending is None else self._pending.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self._pending = None if state is None else StepRollout.from_state_dict(state)

    def close(self) -> None:
        """Wait for the rollout in flight to end (its episodes and errors dropped): no thread outlives the trainer."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        self._error = None

    # -- pieces -----------------------------------------------------------------------------------------
    def _prepare(self, step: int) -> float:
        """The engine readied for ``step``'s rollout (the optimiser steps since the last sync released
        first); returns the time it took (the weight sync, mostly)."""
        started = time.perf_counter()
        self._deferred.release()
        self._ready(step)
        return time.perf_counter() - started

    def _finish(self, step: int, version: int, trajectories: list[Trajectory], batch: TrainBatch,
                timings: RolloutTimings, rounds: int) -> StepRollout:
        return StepRollout(step, version, trajectories, batch, timings, rounds, time.perf_counter())

    def _start(self, step: int, version: int) -> None:
        def run() -> None:
            try:
                self._pending = self._finish(step, version, *self._roll_out(step))
            except BaseException as exc:  # raised on the main thread by _join
                self._error = exc

        self._thread = threading.Thread(target=run, name=f"rollout-step-{step}", daemon=True)
        self._thread.start()

    def _join(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def attach_engine(engine: Any, backend: Any, *, max_staleness: int, steps: int, roll_out: Callable[[int], RolloutParts],
                  ready: Callable[[int], None]) -> AsyncRollouts | None:
    """Attach ``engine`` to ``backend`` (it follows the optimiser steps from here on): directly for
    ``max_staleness`` 0, which changes nothing; for 1, through :class:`DeferredSteps`, returning the
    pipeline (``roll_out``, ``ready``, ``steps``: see :class:`AsyncRollouts`).

    Raises:
        ValueError: ``max_staleness`` 1 with an engine that decodes the trained policy itself (its weights
            change under the rollout) or with several data-parallel ranks (their rollouts and updates take
            collectives in step, which a rollout ahead would interleave).
    """
    if not max_staleness:
        engine.attach(backend)
        return None
    if engine.decodes_trained_policy:
        raise ValueError(f"rollout.max_staleness {max_staleness} needs an engine with its own copy of the weights "
                         f"(vllm-server, vllm): {type(engine).__name__} decodes the policy being trained")
    if backend.world_size > 1:
        raise ValueError(f"rollout.max_staleness {max_staleness} runs on one process; got {backend.world_size} ranks")
    deferred = DeferredSteps(backend)
    engine.attach(deferred)
    return AsyncRollouts(roll_out, ready, deferred, steps)
