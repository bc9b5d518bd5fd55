"""Tiny runs shared by the trainer's tests: a config that trains in seconds on the tiny model, a runner
that closes the environments, the metrics log's records, a batch to compare log-probs on, and a user's
algorithm with a setting a resume may change."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from agents.learners import GRPO, GRPOConfig
from agents.training.config import RESUME_FREE, TrainConfig

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


def probe_batch(vocab: int, rows: int = 3, width: int = 12, seed: int = 0):
    """A :class:`~agents.rollout.batch.TrainBatch` of random ids below ``vocab`` (the last row right-padded,
    trained from column 4), to compare log-probs of policies on."""
    import torch

    from agents.rollout.batch import TrainBatch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, width), generator=generator)
    mask = torch.ones_like(ids)
    mask[-1, width - 3:] = 0
    trained = mask.clone()
    trained[:, :4] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return TrainBatch(input_ids=ids, attention_mask=mask, position_ids=positions, trained_mask=trained,
                      token_rewards=torch.zeros(rows, width), scores=torch.zeros(rows), group_index=torch.arange(rows),
                      group_ids=[str(i) for i in range(rows)], trajectories=[])


def records(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@dataclass
class ProbedGRPOConfig(GRPOConfig):
    probe_every: int = field(default=0, metadata=RESUME_FREE)


class ProbedGRPO(GRPO):
    """GRPO with a setting of its own that a resume may change (declared free at its field); register it
    in a test with ``monkeypatch.setitem(ALGORITHMS, ProbedGRPO.name, ProbedGRPO)``."""

    name = "test-probed-grpo"
    config_class = ProbedGRPOConfig
