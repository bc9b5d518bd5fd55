"""A run's logs: one JSON line per step, TensorBoard scalars, and a learning-curve PNG.

The JSON-lines file is the record every other view is drawn from: the curve is plotted from it (so a
resumed run's curve includes the steps before the resume), and on resume it is cut back to the
checkpoint's step, so steps that ran after the last checkpoint and are run again appear once.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

__all__ = ["RunLogger", "read_metrics", "plot_curve"]

METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "curve.png"
TENSORBOARD_DIR = "tensorboard"


class RunLogger:
    """Writes a run's metrics under ``output_dir``.

    Args:
        output_dir: the run's folder; ``metrics.jsonl``, ``tensorboard/`` and ``curve.png`` go there.
        tensorboard: also write TensorBoard event files (``torch.utils.tensorboard``).
        resume_step: the checkpoint step a resumed run continues from: records of later steps are
            dropped from the JSON lines and TensorBoard's events past it are purged. ``None``: a new run
            (an existing metrics file is replaced).
    """

    def __init__(self, output_dir: str | os.PathLike[str], *, tensorboard: bool = True, resume_step: int | None = None) -> None:
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.output_dir / METRICS_FILE
        self.curve_path = self.output_dir / CURVE_FILE
        kept = [r for r in read_metrics(self.metrics_path) if r["step"] <= resume_step] if resume_step is not None else []
        with open(self.metrics_path, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in kept)
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self._writer = SummaryWriter(str(self.output_dir / TENSORBOARD_DIR), purge_step=purge)

    @property
    def tensorboard_dir(self) -> Path | None:
        """Where the TensorBoard events are, or None when TensorBoard is off."""
        return self.output_dir / TENSORBOARD_DIR if self._writer is not None else None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one record (``{"step": step, **metrics}``); numbers also go to TensorBoard."""
        record = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.metrics_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self._writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._writer.add_scalar(key, value, step)
            self._writer.flush()

    def plot(self) -> Path:
        """Draw the learning curve from the metrics file into ``curve.png`` and return its path."""
        return plot_curve(read_metrics(self.metrics_path), self.curve_path)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file (an empty list when it does not exist)."""
    target = Path(path)
    if not target.exists():
        return []
    with open(target, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def plot_curve(records: list[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Plot training reward and held-out EM (greedy and sampled) against the step into a PNG.

    Reads ``reward`` and ``eval/greedy/em`` / ``eval/sampled/em`` from the records; a series with no
    values is left out.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    _series(top, records, "reward", "train reward (mean)")
    top.set_ylabel("reward")
    for key, label in (("eval/greedy/em", "held-out EM, greedy"), ("eval/sampled/em", "held-out EM, sampled")):
        _series(bottom, records, key, label, marker="o")
    bottom.set_ylabel("exact match")
    bottom.set_xlabel("step")
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
        if axis.lines:
            axis.legend(loc="best")
    fig.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target


def _series(axis: Any, records: list[Mapping[str, Any]], key: str, label: str, **style: Any) -> None:
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    if points:
        steps, values = zip(*points)
        axis.plot(steps, values, label=label, **style)


def _plain(value: Any) -> Any:
    """JSON-able numbers: tensors and NumPy scalars become floats, NaN and infinities become None."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
