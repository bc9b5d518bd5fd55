"""A warm-started policy kept in a file between benchmark runs, so that a benchmark that measures
something after the warm start (rollouts, a GRPO step) need not spend the warm start's minutes again."""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agents.training.backend import TrainingBackend
    from agents.training.config import TrainConfig

__all__ = ["warm_start_key", "warm_started"]


def warm_start_key(config: TrainConfig) -> dict[str, Any]:
    """Every setting a warm start's result depends on: the warm start, the model, the world, the
    environment the demonstrations are played in, the seed and the optimiser's batching."""
    key = {"warm_start": asdict(config.warm_start), "model": asdict(config.model), "data": asdict(config.data),
           "env": asdict(config.env), "seed": config.run.seed, "micro_batch_size": config.optim.micro_batch_size,
           "adam_betas": list(config.optim.adam_betas), "weight_decay": config.optim.weight_decay}
    return json.loads(json.dumps(key))  # plain lists and numbers, as the file gives them back


def warm_started(backend: TrainingBackend, config: TrainConfig, env: Any, cache: str | None) -> None:
    """Warm-start ``backend.policy`` as the trainer does (:func:`agents.training.warm_start.warm_start`,
    then the reference becomes the warm-started policy), or load the weights that an earlier run with
    the same settings (:func:`warm_start_key`) saved in ``cache``, saving them there when it is new.

    Raises:
        ValueError: ``cache`` holds a warm start made with other settings.
    """
    import torch

    from agents.training.warm_start import warm_start

    key = warm_start_key(config)
    policy = backend.policy
    if cache and os.path.exists(cache):
        saved = torch.load(cache, weights_only=True)
        if not isinstance(saved, dict) or saved.get("key") != key:
            raise ValueError(f"{cache} holds a warm start made with other settings: remove it or give another path")
        policy.load_state_dict(saved["policy"])
    else:
        warm_start(backend, config, env)
        if cache:
            torch.save({"key": key, "policy": policy.state_dict()}, cache)
    backend.reset_reference()
