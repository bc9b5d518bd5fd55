"""A few training episodes as text, every ``run.sample_every`` steps, in ``samples.jsonl`` of the run's
folder, so that a researcher reads what the policy writes (metrics say how well, not what).

One JSON object per episode: the step, the question and its gold answers, the episode's text after the
prompt (the agent's turns and the results or errors it saw, cut in the middle when long), the answer
the reward read, the reward and its components, why the episode ended, and its searches (query and
error, if any). On resume the file is cut back to the checkpoint's step, as ``metrics.jsonl`` is, and replaced atomically.
"""
from __future__ import annotations

import json
import numbers
from typing import TYPE_CHECKING, Any, Sequence

from agents.training.callbacks import Callback
from agents.training.evaluation import predicted_answer
from search_env.files import write_atomically

if TYPE_CHECKING:
    from agents.training.trainer import Trainer
    from search_env.trajectory import Trajectory

__all__ = ["EPISODES_PER_SAMPLE", "MAX_TEXT_CHARS", "SampleLogger", "episode_record"]

#: Episodes written per sampled step: the first episode of each of the step's first questions.
EPISODES_PER_SAMPLE = 2
#: Longer episode texts keep their first three quarters and their last quarter of this many characters.
MAX_TEXT_CHARS = 4000


def _cut(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    if len(text) <= limit:
        return text
    head, tail = limit * 3 // 4, limit // 4
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"


def _component_as_json(value: Any) -> Any:
    """A JSON-able reward component: numbers, text, booleans and None as they are, anything else as text."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Real):
        return float(value)
    return repr(value)


def episode_record(step: int, trajectory: Trajectory) -> dict[str, Any]:
    """The ``samples.jsonl`` record of one episode at ``step`` (see the module docstring)."""
    return {
        "step": step,
        "question": trajectory.question,
        "golden_answers": list(trajectory.golden_answers),
        "text": _cut(trajectory.response_text),
        "answer": predicted_answer(trajectory),
        "reward": float(trajectory.reward),
        "reward_components": {k: _component_as_json(v) for k, v in trajectory.reward_components.items()},
        "end_reason": trajectory.end_reason,
        "searches": [{"query": call.content, **({"error": call.error} if call.error else {})}
                     for call in trajectory.tool_calls],
    }


class SampleLogger(Callback):
    """Writes :data:`EPISODES_PER_SAMPLE` episodes of every ``run.sample_every``-th step's rollout."""

    every = 0  #: ``run.sample_every``, read when a run starts (steps taken outside :meth:`Trainer.train` write none)

    def on_run_start(self, trainer: Trainer) -> None:
        self.every = trainer.config.run.sample_every
        self.path = trainer.files.samples
        if not self.path.exists():
            return  # written at the first sampled step
        if not trainer.resumed and trainer.step == 0:  # a fresh run: an earlier run's samples go
            self.path.unlink()
            return
        kept = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line)["step"] <= trainer.step]
        write_atomically(self.path, "".join(line + "\n" for line in kept))  # the old file whole until replaced

    def on_rollout(self, trainer: Trainer, trajectories: Sequence[Trajectory]) -> None:
        step = trainer.step + 1  # the step this rollout belongs to (counted once its update is done)
        if self.every <= 0 or step % self.every:
            return
        chosen: dict[str, Trajectory] = {}
        for trajectory in trajectories:  # the first episode of each question, in rollout order
            chosen.setdefault(trajectory.example_id, trajectory)
        with open(self.path, "a", encoding="utf-8") as handle:
            for trajectory in list(chosen.values())[:EPISODES_PER_SAMPLE]:
                handle.write(json.dumps(episode_record(step, trajectory)) + "\n")
