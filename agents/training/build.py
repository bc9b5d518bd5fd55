"""Assemble a run from its config: policy, environments, algorithm, backend and trainer.

    trainer = build_trainer(TrainConfig("grpo", run=RunConfig(steps=50)))
    result = trainer.train()

This is what ``python -m agents.train`` runs; a script that wants another piece (its own callback, a
rollout engine) builds the same trainer and passes it in. The rollout engine is the one ``rollout.engine``
names (:mod:`agents.rollout.engines`), built by the trainer.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Any, Sequence

import numpy as np
import torch

from agents.learners import AlgorithmConfig
from agents.learners.registry import lookup_algorithm
from agents.policies.loading import load_codec, load_policy
from agents.rollout.engines import lookup_engine
from agents.training.backends import build_backend, lookup_backend, training_dtype
from agents.training.callbacks import Callback
from agents.training.config import TrainConfig
from agents.training.data import RunData, split_data
from agents.training.devices import resolve_device
from agents.training.run_checks import check_prompt_room
from agents.training.trainer import Trainer
from search_env import BatchSearchQAEnv

__all__ = ["algorithm_config", "build_trainer", "env_options", "policy_load_dtype"]


def build_trainer(config: TrainConfig, *, callbacks: Sequence[Callback] = (), data: RunData | None = None) -> Trainer:
    """The policy, environments, algorithm, backend and trainer of a run, from its config.

    The algorithm gets :func:`algorithm_config` (the engine's defaults filled in; ``config`` itself, and
    the ``config.json`` the run writes, keep what was set). Seeds Python's, NumPy's and torch's generators
    with ``run.seed`` and sets torch's thread count; with ``run.resume`` the trainer continues from the
    checkpoint in ``run.output_dir``. ``data``: the
    questions and sources built already (:func:`agents.training.data.build_data`, e.g. once for several
    trainers), which must be what the config's ``data`` and ``eval`` groups ask for; by default they are
    built here. Raises ``ValueError``/``KeyError``/``OSError`` (one line) for bad input, ``data`` made
    for another config included.
    """
    if data is not None:
        data.check(config)
    torch.set_num_threads(config.run.num_threads)
    random.seed(config.run.seed)
    np.random.seed(config.run.seed)
    torch.manual_seed(config.run.seed)
    (train_examples, train_sources), held_out = split_data(config) if data is None else data.for_config(config)
    check_prompt_room(config, load_codec(config.model), [*train_examples, *(held_out[0] if held_out is not None else ())],
                      train_sources)
    algorithm = lookup_algorithm(config.algo)(algorithm_config(config), max_new_tokens=config.env.max_new_tokens)
    policy = load_policy(config.model, value_head=algorithm.value_head, seed=config.run.seed,
                         dtype=policy_load_dtype(config)).to(resolve_device(config.run.device))
    if config.run.gradient_checkpointing:
        policy.set_gradient_checkpointing(True)
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


def policy_load_dtype(config: TrainConfig) -> torch.dtype:
    """The dtype the policy's model is loaded in: fp32 for what is trained (the optimiser's steps must not
    round away; bf16 compute is autocast, or the DeepSpeed engine's), and with LoRA on a backend that keeps
    the frozen base as loaded (:attr:`~agents.training.backends.base.TrainingBackend.frozen_base_in_run_dtype`,
    the ``torch`` backend) the base in the run's precision (``run.dtype``), so a bf16 run holds it in half
    the memory (the adapters stay fp32)."""
    if config.model.lora_rank > 0 and lookup_backend(config.run.backend).frozen_base_in_run_dtype:
        return training_dtype(config.run.dtype, torch.device(resolve_device(config.run.device)))
    return torch.float32


def algorithm_config(config: TrainConfig) -> AlgorithmConfig:
    """The algorithm's config as the run's algorithm gets it: ``config.algorithm`` with an unset
    ``tis_cap`` (``None``) replaced by the rollout engine's default (off when the engine's log-probs are
    the trainer's own, as the HF sampler's are; truncated importance sampling at
    :data:`~agents.rollout.engines.DEFAULT_TIS_CAP` otherwise, as with vLLM). ``algorithm.tis_cap: 0``
    turns it off with any engine. ``config`` is not changed."""
    if config.algorithm.tis_cap is not None:
        return config.algorithm
    return dataclasses.replace(config.algorithm, tis_cap=lookup_engine(config.rollout.engine).default_tis_cap)


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
