"""Callbacks: code that runs at fixed points of :meth:`agents.training.trainer.Trainer.train`, as
Stable-Baselines3's and TRL's callbacks do. The run's loggers are callbacks too
(:mod:`agents.training.loggers`), so a user's own logger, early stop or probe plugs in the same way::

    class PrintReward(Callback):
        def on_update(self, trainer, metrics):
            print(trainer.step, metrics["reward"])

    build_trainer(config, callbacks=[PrintReward()]).train()

Every hook receives the trainer (its ``step``, ``config``, ``policy``, ``backend`` ...) and does nothing
by default. A callback steers the run through ``trainer.control`` (a :class:`TrainerControl`, as TRL's
``TrainerControl``): it sets ``should_evaluate`` for a held-out evaluation after the step,
``should_save`` for a checkpoint after it, or ``should_stop`` to end the run after it (checkpointed, as
Ctrl-C does)::

    class EvaluateWhenRewardJumps(Callback):
        def on_update(self, trainer, metrics):
            if metrics["reward"] > 0.8:
                trainer.control.should_evaluate = True

The trainer reads ``should_evaluate`` and ``should_save`` once per step, after ``on_update``, and clears
them: set up to then, they act after that step; set later (in ``on_log``, ``on_evaluation`` or
``on_checkpoint``), after the next. ``should_stop`` is read before each step and stays set. With several
data-parallel ranks the callbacks run on rank 0 and every rank follows its flags. An evaluation asked
for draws from its own seeded stream, so it never changes what training does.
"""
from __future__ import annotations

import dataclasses
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

if TYPE_CHECKING:
    from agents.training.backends import TrainingBackend
    from agents.training.evaluation import EvalResult
    from agents.training.result import TrainResult
    from agents.training.trainer import Trainer
    from search_env.trajectory import Trajectory

__all__ = ["Callback", "TrainerControl", "stop_on_interrupt"]


@dataclass
class TrainerControl:
    """What the callbacks ask of the training loop (see the module docstring).

    Attributes:
        should_evaluate: run a held-out evaluation after this step (logged with the step's metrics and
            passed to :meth:`Callback.on_evaluation` with stage ``None``), besides the ``eval.every``
            ones; at the run's last step the ``"final"`` evaluation is that evaluation.
        should_save: write a checkpoint after this step, besides the ``run.save_every`` ones.
        should_stop: end the run after this step, with a checkpoint that ``run.resume`` continues.
    """

    should_evaluate: bool = False
    should_save: bool = False
    should_stop: bool = False

    def shared(self, backend: TrainingBackend) -> TrainerControl:
        """Itself, the same on every rank of ``backend``: with several, a flag set on any (rank 0's
        callbacks, a Ctrl-C) is set on all, so that every rank evaluates, checkpoints and stops at the
        same step."""
        if backend.world_size > 1:
            import torch

            flags = torch.tensor([float(self.should_evaluate), float(self.should_save), float(self.should_stop)])
            self.should_evaluate, self.should_save, self.should_stop = (v > 0 for v in backend.all_reduce_sum(flags).tolist())
        return self

    def take_step_flags(self) -> TrainerControl:
        """The flags as they are now; ``should_evaluate`` and ``should_save``, which ask for one step
        each, are cleared."""
        asked = dataclasses.replace(self)
        self.should_evaluate = self.should_save = False
        return asked


@contextmanager
def stop_on_interrupt(control: TrainerControl) -> Iterator[None]:
    """Within the block, a first Ctrl-C sets ``control.should_stop`` (the run finishes its step,
    checkpoints and returns); a second one aborts. Off the main thread, where no signal handler can be
    set, Ctrl-C is left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def handle(signum: int, frame: Any) -> None:
        control.should_stop = True
        signal.signal(signal.SIGINT, previous)
        print("\nstopping after this step (Ctrl-C again to abort)", file=sys.stderr)

    signal.signal(signal.SIGINT, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Callback:
    """Base of the trainer's callbacks; override the hooks you need."""

    def on_run_start(self, trainer: Trainer) -> None:
        """Before anything runs (``trainer.resumed`` says whether a checkpoint was loaded)."""

    def on_rollout(self, trainer: Trainer, trajectories: Sequence[Trajectory]) -> None:
        """After a training step's rollout, with every episode it played (before the update)."""

    def on_update(self, trainer: Trainer, metrics: Mapping[str, Any]) -> None:
        """After a training step's update; ``trainer.step`` is the number of steps done, ``metrics``
        the step's (rewards, losses, timings). The place to set ``trainer.control``'s flags."""

    def on_evaluation_start(self, trainer: Trainer, stage: str | None) -> None:
        """Before a held-out evaluation (``stage`` as in :meth:`on_evaluation`)."""

    def on_evaluation(self, trainer: Trainer, stage: str | None, results: Mapping[str, EvalResult]) -> None:
        """After a held-out evaluation: ``stage`` is ``"start"``, ``"warm start"`` or ``"final"`` for the
        before/after table, ``None`` for one every ``eval.every`` steps or asked for through
        ``trainer.control.should_evaluate``; ``results`` by mode (and hop count)."""

    def on_log(self, trainer: Trainer, step: int, record: Mapping[str, Any]) -> None:
        """A record for the logs (the step's metrics, or an evaluation stage's), at ``step``."""

    def on_checkpoint(self, trainer: Trainer, path: Path) -> None:
        """After a checkpoint was written to ``path``."""

    def on_run_end(self, trainer: Trainer, result: TrainResult) -> None:
        """After the run stopped (finished, or stopped early and checkpointed)."""
