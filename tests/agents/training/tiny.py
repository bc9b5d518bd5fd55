"""Tiny runs shared by the trainer's tests: a config that trains in seconds on the tiny model, a runner
that closes the environments, and the metrics log's records."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from agents.training.config import TrainConfig

#: 2 questions x 2 samples of at most 16 tokens, two optimiser steps per update pass and two passes, KL
#: and entropy terms on so that every update moves the weights.
TINY = {
    "run.steps": 2, "rollout.questions_per_step": 2, "algorithm.group_size": 2, "env.max_new_tokens": 16,
    "data.world_size": 30, "eval.questions": 2, "optim.micro_batch_size": 3, "optim.mini_batch_size": 2,
    "optim.update_epochs": 2, "optim.learning_rate": 1e-3, "algorithm.kl_coef": 0.01, "algorithm.entropy_coef": 0.01,
    "run.report_to": [], "run.progress": False,
}


def small_config(algo: str, output_dir: str | Path, changes: Mapping[str, Any] | None = None) -> TrainConfig:
    """The tiny run of ``algo`` writing to ``output_dir``, with ``{"group.field": value}`` ``changes``."""
    return TrainConfig(algo).updated({**TINY, "run.output_dir": str(output_dir), **(changes or {})})


def run(config: TrainConfig, **build_options: Any):
    """Build and train ``config``; returns the trainer and its result (environments closed)."""
    from agents.training.build import build_trainer

    trainer = build_trainer(config, **build_options)
    try:
        result = trainer.train()
    finally:
        trainer.close_environments()
    return trainer, result


def records(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]
