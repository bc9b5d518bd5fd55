"""What a training backend reads of a run's config: :class:`BackendSettings`.

A backend is built from these settings rather than from the whole :class:`~agents.training.config.TrainConfig`,
so that what it depends on is written down in one place (a change to another group of the run's config
cannot reach it) and a test or a script can build one from just these fields. The run config is read
once, where the registry builds a backend (:meth:`~agents.training.backends.base.TrainingBackend.from_config`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.training.config import OptimConfig, TrainConfig

__all__ = ["BackendSettings"]


@dataclass(frozen=True)
class BackendSettings:
    """The settings of a training backend.

    Attributes:
        optim: the optimiser group: AdamW, learning-rate warm-up, clipping, micro-batches (``optim``).
        options: the backend's own settings, the dataclass it registered (the run config's ``backend`` group).
        temperature: log-probs are taken at the sampling temperature (``rollout.temperature``).
        dtype: the compute precision (``run.dtype``: ``auto``, ``bf16``, ``fp32``).
        steps: the run's training steps, of which a warm-up given as a ratio is a share (``run.steps``).
        device: where the models live (``run.device``).
        collective_timeout_s: how long a rank waits in a collective for the others (``run.collective_timeout_s``).
        warm_starts: the run warm-starts (``warm_start.steps`` or ``copy_steps``), after which the reference
            is reset to the warm-started policy: a checkpoint must then hold it (it cannot be rebuilt).
    """

    optim: OptimConfig
    options: Any
    temperature: float
    dtype: str
    steps: int
    device: str
    collective_timeout_s: float
    warm_starts: bool

    @classmethod
    def of(cls, config: TrainConfig) -> BackendSettings:
        """The settings ``config`` gives a backend."""
        run = config.run
        return cls(optim=config.optim, options=config.backend, temperature=config.rollout.temperature, dtype=run.dtype,
                   steps=run.steps, device=run.device, collective_timeout_s=run.collective_timeout_s,
                   warm_starts=config.warm_start.steps + config.warm_start.copy_steps > 0)
