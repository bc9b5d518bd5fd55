"""What a finished (or stopped) training run leaves: :class:`TrainResult`, with the report the command
prints."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agents.training.evaluation import EvalResult, format_table
from agents.training.run_files import RunFiles

__all__ = ["TrainResult"]


@dataclass
class TrainResult:
    """What a finished (or stopped) :meth:`Trainer.train` call leaves.

    Attributes:
        step: completed steps.
        steps: the steps the run was configured for.
        algo: the algorithm's name.
        evaluations: ``{stage: {mode: EvalResult}}`` for the stages ``"start"``, ``"warm start"`` (with a
            warm start) and ``"final"`` (when the run reached its steps); modes are ``greedy`` and
            ``sampled`` (and ``greedy 1-hop`` ... with ``eval.by_hops``).
        output_dir / checkpoint_path / policy_dir: where the run's files, its checkpoint and the trained
            policy (a transformers model folder) went; the logs and curve are in ``output_dir``.
        steps_run / updated_steps / skipped_updates: the training steps this :meth:`Trainer.train` call
            took, how many of them changed the policy (at least one optimiser update applied), and the
            optimiser updates skipped for a non-finite gradient norm.
        stopped: the call was stopped before it was done (Ctrl-C, or a callback's ``control.should_stop``):
            short of its last step, or with its final evaluation cut; ``run.resume`` goes on from the
            checkpoint. ``python -m agents.train`` then exits with status 3.
    """

    step: int
    steps: int
    algo: str
    evaluations: dict[str, dict[str, EvalResult]]
    output_dir: Path
    checkpoint_path: Path
    policy_dir: Path
    steps_run: int = 0
    updated_steps: int = 0
    skipped_updates: int = 0
    stopped: bool = False

    @property
    def finished(self) -> bool:
        """Whether the run reached ``steps``: only then is its policy exported to ``policy_dir``."""
        return self.step >= self.steps

    @property
    def metrics_path(self) -> Path:
        return RunFiles(self.output_dir).metrics

    @property
    def curve_path(self) -> Path:
        return RunFiles(self.output_dir).curve

    def report(self) -> str:
        """The before/after table and where things are, as the command prints them."""
        lines = [f"{self.algo}: {self.step} of {self.steps} steps"]
        if self.steps_run:
            lines.append(f"updated the policy at {self.updated_steps} of the {self.steps_run} steps this invocation took"
                         + (f" ({self.skipped_updates} optimiser updates skipped: non-finite gradient norm)"
                            if self.skipped_updates else ""))
        if self.evaluations:
            lines += ["", format_table(self.evaluations), ""]
            failed = [f"{stage} {mode}" for stage, by_mode in self.evaluations.items() for mode, r in by_mode.items()
                      if r.failed_searches > 0]
            if failed:
                lines += [f"searches failed in the evaluation ({', '.join(failed)}): those EMs count answers given "
                          "without the passages asked for; check the retriever", ""]
        lines += [f"curve:       {self.curve_path}", f"metrics:     {self.metrics_path}",
                  f"checkpoint:  {self.checkpoint_path}"]
        if self.finished:
            lines.append(f"policy:      {self.policy_dir}")
        else:  # the policy is exported at the last step; the checkpoint holds this one
            lines.append(f"policy:      not exported before step {self.steps} (--run.resume true continues the run)")
        if self.stopped:
            lines.append(f"stopped early at step {self.step} of {self.steps}: --run.resume true goes on from the checkpoint")
        return "\n".join(lines)
