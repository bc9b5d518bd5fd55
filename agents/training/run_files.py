"""The names of the files a training run keeps in its output folder (``run.output_dir``), in one place.

The trainer, its loggers, the resume guard, the checkpoint code and the start-up checks all read or
write these files; naming each once here means a renamed file cannot leave one of them looking in the
old place (a resume that no longer finds the log it must cut back, a ``run.overwrite`` that leaves a
stale file behind). :class:`RunFiles` gives their paths inside one run's folder.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CHECKPOINTS_DIR", "CHECKPOINT_FILE", "CONFIG_FILE", "CURVE_FILE", "LOCK_FILE", "METRICS_FILE", "POLICY_DIR", "REPLACED_BY_NEW_RUN",
    "RESUME_LOG", "RUN_MARKERS", "RunFiles", "SAMPLES_FILE", "TENSORBOARD_DIR", "WANDB_DIR", "WARM_START_POLICY_DIR",
]

METRICS_FILE = "metrics.jsonl"  #: one JSON record per logged step or evaluation stage
CURVE_FILE = "curve.png"  #: the learning curve, drawn from the metrics when a run ends
CONFIG_FILE = "config.json"  #: the settings the run has now (rewritten when a resume changes some)
CHECKPOINT_FILE = "checkpoint.pt"  #: the run's latest checkpoint (the trainer's state)
CHECKPOINTS_DIR = "checkpoints"  #: beside it, the backend's folder of the step it names
POLICY_DIR = "policy"  #: the trained policy, as a transformers model folder, once the run reached its steps
WARM_START_POLICY_DIR = "warm_start_policy"  #: the policy right after the warm start (``warm_start.export``)
SAMPLES_FILE = "samples.jsonl"  #: a few episodes as text every ``run.sample_every`` steps
RESUME_LOG = "resume_log.jsonl"  #: one line per resume that changed settings: the step and the changes
TENSORBOARD_DIR = "tensorboard"  #: TensorBoard's event files (``run.report_to: tensorboard``)
WANDB_DIR = "wandb"  #: Weights & Biases' offline run (``run.report_to: wandb``)

#: Files whose presence says a folder holds a run.
RUN_MARKERS = (METRICS_FILE, CHECKPOINT_FILE)
LOCK_FILE = "run.lock"  #: locked (``flock``) by the process that runs in the folder, for the run's life

#: What ``run.overwrite`` removes of an earlier run before a new one starts: every file an earlier run
#: leaves, so that the folder holds the new run only, even when the new run dies before it rewrites
#: them. An old ``policy/`` would pass for the new run's result, an old ``checkpoints/step-N/`` or
#: ``checkpoint.pt`` would let a later ``run.resume`` continue the old run, TensorBoard's events would
#: mix two runs' curves. The lock file stays: the new run holds it.
REPLACED_BY_NEW_RUN = (CHECKPOINT_FILE, CHECKPOINTS_DIR, METRICS_FILE, SAMPLES_FILE, CURVE_FILE, CONFIG_FILE, POLICY_DIR,
                       WARM_START_POLICY_DIR, RESUME_LOG, TENSORBOARD_DIR, WANDB_DIR)


@dataclass(frozen=True)
class RunFiles:
    """The paths of one run's files, inside ``root`` (its ``run.output_dir``)."""

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def curve(self) -> Path:
        return self.root / CURVE_FILE

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def checkpoint(self) -> Path:
        return self.root / CHECKPOINT_FILE

    @property
    def policy(self) -> Path:
        return self.root / POLICY_DIR

    @property
    def warm_start_policy(self) -> Path:
        return self.root / WARM_START_POLICY_DIR

    @property
    def samples(self) -> Path:
        return self.root / SAMPLES_FILE

    @property
    def resume_log(self) -> Path:
        return self.root / RESUME_LOG

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD_DIR

    @property
    def wandb(self) -> Path:
        return self.root / WANDB_DIR

    @property
    def lock(self) -> Path:
        return self.root / LOCK_FILE
