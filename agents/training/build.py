"""Assemble a run from its config: policy, environments, algorithm, backend and trainer.

    trainer = build_trainer(TrainConfig("grpo", run=RunConfig(steps=50)))
    result = trainer.train()

This is what ``python -m agents.train`` runs; a script that wants another piece (its own callback, a
rollout engine) builds the same trainer and passes it in.
"""
from __future__ import annotations

import random
from typing import Any, Sequence

import numpy as np
import torch

from agents.learners.registry import lookup_algorithm
from agents.policies.loading import load_policy
from agents.training.backend import build_backend
from agents.training.callbacks import Callback
from agents.training.config import TrainConfig
from agents.training.data import split_data
from agents.training.trainer import Trainer
from search_env import BatchSearchQAEnv

__all__ = ["build_trainer", "env_options"]


def build_trainer(config: TrainConfig, *, callbacks: Sequence[Callback] = ()) -> Trainer:
    """The policy, environments, algorithm, backend and trainer of a run, from its config.

    Seeds Python's, NumPy's and torch's generators with ``run.seed`` and sets torch's thread count; with
    ``run.resume`` the trainer continues from the checkpoint in ``run.output_dir``. Raises
    ``ValueError``/``KeyError``/``OSError`` (one line) for bad input.
    """
    torch.set_num_threads(config.run.num_threads)
    random.seed(config.run.seed)
    np.random.seed(config.run.seed)
    torch.manual_seed(config.run.seed)
    (train_examples, train_sources), held_out = split_data(config)
    algorithm = lookup_algorithm(config.algo)(config.algorithm, max_new_tokens=config.env.max_new_tokens)
    policy = load_policy(config.model, value_head=algorithm.value_head, seed=config.run.seed).to(config.run.device)
    backend = build_backend(config, policy, algorithm)
    options = env_options(config, policy.codec)
    env = BatchSearchQAEnv(config.rollout.questions_per_step * config.algorithm.group_size, dataset=train_examples,
                           sources=train_sources, **options)
    eval_env, eval_questions = None, []
    if held_out is not None:
        examples, sources = held_out
        eval_env = BatchSearchQAEnv(min(len(examples), env.num_envs), dataset=examples, sources=sources, **options)
        eval_questions = list(range(len(examples)))
    return Trainer(config, policy, env, algorithm, backend, eval_env=eval_env, eval_questions=eval_questions,
                   callbacks=callbacks)


def env_options(config: TrainConfig, codec: Any) -> dict[str, Any]:
    """The environment settings shared by the training and the held-out environments."""
    env = config.env
    options: dict[str, Any] = {
        "protocol": env.protocol, "tokenizer": codec, "max_new_tokens": env.max_new_tokens,
        "max_context": env.max_context, "max_turns": env.max_turns, "reward": _reward(config),
    }
    if env.top_k is not None:
        options["top_k"] = env.top_k
    if env.evidence_model is not None:
        from rewards.models import AnswerModel

        options["evidence_model"] = AnswerModel.local(None if env.evidence_model == "smollm2" else env.evidence_model)
    return options


def _reward(config: TrainConfig) -> Any:
    """``env.reward_stages`` as a :class:`rewards.schedule.StagedReward`, else the ``env.reward`` preset
    (or ``None``: the protocol's)."""
    if config.env.reward_stages is None:
        return config.env.reward
    from rewards.schedule import StagedReward

    return StagedReward([(start, preset) for start, preset in config.env.reward_stages])
