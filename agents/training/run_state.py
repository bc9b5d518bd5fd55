"""What a training run has done so far, declared in one place: :class:`RunState`.

Everything the next step depends on besides the weights and optimiser (which the backend saves in its
own folder) is a field here, so a checkpoint holds exactly these fields and a resumed run goes on with
exactly what the stopped one had: the steps done, where the data order stands, the evaluations kept for
the before/after table, which parts of the run's start are done, a stopped warm start's progress and a
finished one's statistics, and (taken when the state is saved) the global random generators.

The start of a run comes in parts (:data:`START_PARTS`): the ``"start"`` evaluation, the warm start, the
evaluation after it. A checkpoint written during the start lists the parts it holds, so a run stopped
there redoes none of them; past step 0 they are all done.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from agents.training.checkpoint import capture_rng, restore_rng
from agents.training.data import QuestionOrder
from agents.training.evaluation import EvalResult
from agents.training.warm_start import WarmStartProgress

__all__ = ["CHECKPOINT_FORMAT", "RunState", "START_PARTS", "check_format"]

#: The parts of a run's start, in order.
START_PARTS = ("start", "warm start", "warm start evaluation")
#: The layout of the trainer's state in a run's checkpoint (3: :class:`RunState`'s fields, each always there; 4: its
#: evaluations count failed searches).
CHECKPOINT_FORMAT = 4


def check_format(state: Mapping[str, Any]) -> None:
    """``ValueError`` (one line) when a checkpoint's state is not of :data:`CHECKPOINT_FORMAT`."""
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint format {state.get('format')!r} is not {CHECKPOINT_FORMAT}: this version cannot resume it")


@dataclass
class RunState:
    """A run's progress (see the module docstring).

    Attributes:
        order: the seeded order the training questions are taken in, and where it stands.
        step: training steps done.
        evaluations: ``{stage: {mode: EvalResult}}`` of the stages ``"start"``, ``"warm start"`` and
            ``"final"``.
        stage_steps: the step each stage was evaluated at (a resumed run that goes past its ``"final"``
            step is evaluated again at its new last step).
        start_done: the parts of :data:`START_PARTS` done.
        warm_start_progress: where a warm start stopped in its middle stands, to go on from there;
            ``None`` once it finished (or before it began).
        warm_start_stats: a finished warm start's statistics, kept until they are logged with the
            evaluation after it.
    """

    order: QuestionOrder
    step: int = 0
    evaluations: dict[str, dict[str, EvalResult]] = field(default_factory=dict)
    stage_steps: dict[str, int] = field(default_factory=dict)
    start_done: set[str] = field(default_factory=set)
    warm_start_progress: WarmStartProgress | None = None
    warm_start_stats: dict[str, float] | None = None

    def advance(self) -> None:
        """Count one training step done; from the first on, the whole start is behind the run (even one
        whose steps were taken without :meth:`~agents.training.trainer.Trainer.train`)."""
        self.step += 1
        self.start_done = set(START_PARTS)

    def start_left(self) -> list[str]:
        """The parts of the start not done yet, in order."""
        return [part for part in START_PARTS if part not in self.start_done]

    def keep_evaluation(self, stage: str, results: Mapping[str, EvalResult]) -> None:
        """Keep ``stage``'s results for the before/after table, taken at the current step."""
        self.evaluations[stage] = dict(results)
        self.stage_steps[stage] = self.step

    def state_dict(self) -> dict[str, Any]:
        """Plain data and tensors, as a checkpoint stores them; the random generators are taken now."""
        progress = self.warm_start_progress
        return {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "rng": capture_rng(),
            "data": self.order.state_dict(),
            "evaluations": {stage: {mode: dataclasses.asdict(r) for mode, r in by_mode.items()}
                            for stage, by_mode in self.evaluations.items()},
            "stage_steps": dict(self.stage_steps),
            "start_done": [part for part in START_PARTS if part in self.start_done],
            "warm_start_progress": None if progress is None else progress.as_dict(),
            "warm_start_stats": None if self.warm_start_stats is None else dict(self.warm_start_stats),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take the state :meth:`state_dict` wrote, and put the random generators back as they were."""
        check_format(state)
        self.order.load_state_dict(state["data"])
        self.step = int(state["step"])
        self.evaluations = {stage: {mode: EvalResult(**r) for mode, r in by_mode.items()}
                            for stage, by_mode in state["evaluations"].items()}
        self.stage_steps = {stage: int(step) for stage, step in state["stage_steps"].items()}
        self.start_done = set(state["start_done"])
        progress = state["warm_start_progress"]
        self.warm_start_progress = None if progress is None else WarmStartProgress.from_dict(progress)
        stats = state["warm_start_stats"]
        self.warm_start_stats = None if stats is None else dict(stats)
        restore_rng(state["rng"])

    def resume_plan(self, part: str) -> str:
        """What ``--run.resume true`` does after a stop during ``part`` of the start (``"the warm start"``
        or an evaluation), with this state restored: the end of the line the trainer prints."""
        if "warm start" in self.start_done:
            return "goes on from the warm-started policy"
        if part == "the warm start" and self.warm_start_progress is not None:
            return f"goes on from warm-start step {self.warm_start_progress.step}"
        return "starts the warm start again" if part == "the warm start" else "runs it again"
