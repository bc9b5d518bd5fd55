"""A run's logs, each a trainer callback: one JSON line per record and a learning-curve PNG
(:class:`JsonLinesLogger`, always on), TensorBoard scalars (:class:`TensorBoardLogger`) and Weights &
Biases (:class:`WandbLogger`), the last two as ``run.report_to`` says.

The JSON-lines file is the record every other view is drawn from: the curve is plotted from it (so a
resumed run's curve includes the steps before the resume), and on resume it is cut back to the
checkpoint's step, so steps that ran after the last checkpoint and are run again appear once. That cut
writes the kept records beside the log and renames them over it (:func:`search_env.files.write_atomically`),
so a kill at that moment leaves the old log whole; records are then appended one line at a time, and a
line torn by a kill is dropped at the next resume (:func:`agents.training.resume.drop_torn_tail`).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from agents.training.callbacks import Callback
from agents.training.run_files import RunFiles
from search_env._optional import requires_extra
from search_env.files import write_atomically

if TYPE_CHECKING:
    from agents.training.result import TrainResult
    from agents.training.trainer import Trainer

__all__ = ["JsonLinesLogger", "TensorBoardLogger", "WandbLogger", "draw_curve", "em_keys", "loggers_for", "plot_curve", "read_metrics"]


class JsonLinesLogger(Callback):
    """``metrics.jsonl`` (one record per line) and ``curve.png`` in the run's folder."""

    def on_run_start(self, trainer: Trainer) -> None:
        files: RunFiles = trainer.files
        self.metrics_path, self.curve_path = files.metrics, files.curve
        files.root.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(self.metrics_path) if r["step"] <= trainer.step] if trainer.resumed else []
        # Replaced whole or not at all: a kill while a resume cuts the log back leaves the old log, never a part.
        write_atomically(self.metrics_path, "".join(json.dumps(record) + "\n" for record in kept))

    def on_log(self, trainer: Trainer, step: int, record: Mapping[str, Any]) -> None:
        line = {"step": int(step), **{k: _json_number(v) for k, v in record.items()}}
        with open(self.metrics_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")

    def on_run_end(self, trainer: Trainer, result: TrainResult) -> None:
        plot_curve(read_metrics(self.metrics_path), self.curve_path)


class TensorBoardLogger(Callback):
    """TensorBoard scalars under ``tensorboard/`` (events past a resumed checkpoint's step are purged)."""

    def on_run_start(self, trainer: Trainer) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory = trainer.files.tensorboard
        self._writer = SummaryWriter(str(self.directory), purge_step=trainer.step + 1 if trainer.resumed else None)

    def on_log(self, trainer: Trainer, step: int, record: Mapping[str, Any]) -> None:
        for key, value in _numbers(record).items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def on_run_end(self, trainer: Trainer, result: TrainResult) -> None:
        self._writer.close()


class WandbLogger(Callback):
    """Weights & Biases, offline unless ``WANDB_MODE`` says otherwise (files under ``wandb/``, to sync
    later with ``wandb sync``); the run's config goes with it. Needs the ``wandb`` package."""

    def on_run_start(self, trainer: Trainer) -> None:
        with requires_extra("wandb", "run.report_to: wandb"):
            import wandb
        self.directory = trainer.files.wandb
        self.directory.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(dir=str(self.directory), mode=os.environ.get("WANDB_MODE", "offline"),
                               config=trainer.config.as_dict(), name=trainer.files.root.name, reinit=True)

    def on_log(self, trainer: Trainer, step: int, record: Mapping[str, Any]) -> None:
        self._run.log(_numbers(record), step=step)

    def on_run_end(self, trainer: Trainer, result: TrainResult) -> None:
        self._run.finish()


def loggers_for(report_to: list[str]) -> list[Callback]:
    """The loggers a run writes with: the JSON lines always, then those ``run.report_to`` names."""
    extra = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger}
    return [JsonLinesLogger(), *(extra[name]() for name in report_to)]


def _numbers(record: Mapping[str, Any]) -> dict[str, float]:
    """The record's finite numbers (booleans and text left out)."""
    out = {}
    for key, value in record.items():
        value = _json_number(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
    return out


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file (an empty list when it does not exist)."""
    target = Path(path)
    if not target.exists():
        return []
    with open(target, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def plot_curve(records: list[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Plot training reward and held-out EM against the step into a PNG (:func:`draw_curve`)."""
    import matplotlib.pyplot as plt

    fig = draw_curve(records)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target


def em_keys(records: list[Mapping[str, Any]]) -> list[str]:
    """The held-out EM keys the records hold, whatever the evaluation's modes: ``eval/greedy/em``,
    ``eval/sampled/em``, and with ``eval.by_hops`` ``eval/greedy/1-hop/em`` ...; greedy before sampled,
    then by name."""
    keys = {key for record in records for key in record if key.startswith("eval/") and key.endswith("/em")}
    return sorted(keys, key=lambda key: ("sampled" in key, key))


def draw_curve(records: list[Mapping[str, Any]]) -> Any:
    """The curve's matplotlib figure: training reward (``reward``) on top, below it one line per held-out
    EM key (:func:`em_keys`); a series with no values is left out."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    _series(top, records, "reward", "train reward (mean)")
    top.set_ylabel("reward")
    for key in em_keys(records):
        _series(bottom, records, key, "held-out EM, " + key[len("eval/"):-len("/em")].replace("/", " "), marker="o")
    bottom.set_ylabel("exact match")
    bottom.set_xlabel("step")
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
        if axis.lines:
            axis.legend(loc="best")
    fig.tight_layout()
    return fig


def _series(axis: Any, records: list[Mapping[str, Any]], key: str, label: str, **style: Any) -> None:
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    if points:
        steps, values = zip(*points)
        axis.plot(steps, values, label=label, **style)


def _json_number(value: Any) -> Any:
    """JSON-able numbers: tensors and NumPy scalars become floats, NaN and infinities become None."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
