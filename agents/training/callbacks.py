"""Callbacks: code that runs at fixed points of :meth:`agents.training.trainer.Trainer.train`, as
Stable-Baselines3's and TRL's callbacks do. The run's loggers are callbacks too
(:mod:`agents.training.loggers`), so a user's own logger, early stop or probe plugs in the same way::

    class PrintReward(Callback):
        def on_update(self, trainer, metrics):
            print(trainer.step, metrics["reward"])

    build_trainer(config, callbacks=[PrintReward()]).train()

Every hook receives the trainer (its ``step``, ``config``, ``policy``, ``backend`` ...) and does nothing
by default; a callback may set ``trainer.stop_requested = True`` to end the run after the current step
(checkpointed, as Ctrl-C does).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from agents.training.evaluation import EvalResult
    from agents.training.result import TrainResult
    from agents.training.trainer import Trainer
    from search_env.trajectory import Trajectory

__all__ = ["Callback"]


class Callback:
    """Base of the trainer's callbacks; override the hooks you need."""

    def on_run_start(self, trainer: Trainer) -> None:
        """Before anything runs (``trainer.resumed`` says whether a checkpoint was loaded)."""

    def on_rollout(self, trainer: Trainer, trajectories: Sequence[Trajectory]) -> None:
        """After a training step's rollout, with every episode it played (before the update)."""

    def on_update(self, trainer: Trainer, metrics: Mapping[str, Any]) -> None:
        """After a training step's update; ``trainer.step`` is the number of steps done, ``metrics``
        the step's (rewards, losses, timings)."""

    def on_evaluation_start(self, trainer: Trainer, stage: str | None) -> None:
        """Before a held-out evaluation (``stage`` as in :meth:`on_evaluation`)."""

    def on_evaluation(self, trainer: Trainer, stage: str | None, results: Mapping[str, EvalResult]) -> None:
        """After a held-out evaluation: ``stage`` is ``"start"``, ``"warm start"`` or ``"final"`` for the
        before/after table, ``None`` for one every ``eval.every`` steps; ``results`` by mode (and hop count)."""

    def on_log(self, trainer: Trainer, step: int, record: Mapping[str, Any]) -> None:
        """A record for the logs (the step's metrics, or an evaluation stage's), at ``step``."""

    def on_checkpoint(self, trainer: Trainer, path: Path) -> None:
        """After a checkpoint was written to ``path``."""

    def on_run_end(self, trainer: Trainer, result: TrainResult) -> None:
        """After the run stopped (finished, or stopped early and checkpointed)."""
