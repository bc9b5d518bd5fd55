"""Assemble a run from its config: policy, environments, algorithm, backend and trainer.

    trainer = build_trainer(TrainConfig("grpo", run=RunConfig(steps=50)))
    result = trainer.train()

This is what ``python -m agents.train`` runs; a script that wants another piece (its own callback, a
rollout engine) builds the same trainer and passes it in.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Sequence

import numpy as np
import torch

from agents.learners.registry import lookup_algorithm
from agents.policies.loading import load_policy
from agents.training.backends import build_backend, training_dtype
from agents.training.callbacks import Callback
from agents.training.config import TrainConfig
from agents.training.data import RunData, split_data
from agents.training.trainer import Trainer
from search_env import BatchSearchQAEnv

__all__ = ["build_trainer", "engine_defaults", "env_options", "policy_load_dtype", "rollout_engine"]


def build_trainer(config: TrainConfig, *, callbacks: Sequence[Callback] = (), data: RunData | None = None) -> Trainer:
    """The policy, environments, algorithm, backend and trainer of a run, from its config.

    Seeds Python's, NumPy's and torch's generators with ``run.seed`` and sets torch's thread count; with
    ``run.resume`` the trainer continues from the checkpoint in ``run.output_dir``. ``data``: the
    questions and sources built already (:func:`agents.training.data.build_data`, e.g. once for several
    trainers), which must be what the config's ``data`` and ``eval`` groups ask for; by default they are
    built here. Raises ``ValueError``/``KeyError``/``OSError`` (one line) for bad input, ``data`` made
    for another config included.
    """
    if data is not None:
        data.check(config)
    engine_defaults(config)
    torch.set_num_threads(config.run.num_threads)
    random.seed(config.run.seed)
    np.random.seed(config.run.seed)
    torch.manual_seed(config.run.seed)
    (train_examples, train_sources), held_out = split_data(config) if data is None else data.for_config(config)
    algorithm = lookup_algorithm(config.algo)(config.algorithm, max_new_tokens=config.env.max_new_tokens)
    policy = load_policy(config.model, value_head=algorithm.value_head, seed=config.run.seed,
                         dtype=policy_load_dtype(config)).to(config.run.device)
    if config.run.gradient_checkpointing:
        policy.set_gradient_checkpointing(True)
    backend = build_backend(config, policy, algorithm)
    agent_factory = rollout_engine(config, policy, backend)
    options = env_options(config, policy.codec)
    env = BatchSearchQAEnv(config.rollout.questions_per_step * config.algorithm.group_size, dataset=train_examples,
                           sources=train_sources, **options)
    eval_env, eval_questions = None, []
    if held_out is not None:
        examples, sources = held_out
        eval_env = BatchSearchQAEnv(min(len(examples), env.num_envs), dataset=examples, sources=sources, **options)
        eval_questions = list(range(len(examples)))
    return Trainer(config, policy, env, algorithm, backend, eval_env=eval_env, eval_questions=eval_questions,
                   agent_factory=agent_factory, callbacks=callbacks)


def policy_load_dtype(config: TrainConfig) -> torch.dtype:
    """The dtype the policy's model is loaded in: fp32 for what is trained (the optimiser's steps must not
    round away; bf16 compute is autocast, or the DeepSpeed engine's), and with LoRA on the ``torch``
    backend the frozen base in the run's precision (``run.dtype``), so a bf16 run holds it in half the
    memory (the adapters stay fp32)."""
    if config.model.lora_rank > 0 and config.run.backend == "torch":
        return training_dtype(config.run.dtype, torch.device(config.run.device))
    return torch.float32


def engine_defaults(config: TrainConfig) -> None:
    """Fill the settings the rollout engine decides when the user left them unset (``None``): with
    ``rollout.engine: vllm`` the engine's log-probs are not the trainer's, so ``algorithm.tis_cap``
    becomes 2.0 (truncated importance sampling on); with ``hf`` it stays off. ``algorithm.tis_cap: 0``
    turns it off with any engine."""
    if config.algorithm.tis_cap is None and config.rollout.engine == "vllm":
        config.algorithm.tis_cap = VLLM_TIS_CAP


#: ``algorithm.tis_cap`` when ``rollout.engine`` is ``vllm`` and the run does not set it.
VLLM_TIS_CAP = 2.0


def rollout_engine(config: TrainConfig, policy: Any, backend: Any) -> Callable[[bool, int], Any] | None:
    """The trainer's agent factory for ``rollout.engine``: ``None`` for ``hf`` (the trainer's own
    :class:`~agents.rollout.hf_sampler.HFSampler`); for ``vllm`` a
    :class:`~agents.rollout.vllm_engine.VLLMEngine` over ``policy`` (with ``model.lora_rank``, its base
    with the adapters served as vLLM's LoRA adapters), reloaded after the backend's optimiser steps from
    ``backend.rollout_weights``, whose agents sample at the run's temperature and top-p. It is built
    within ``backend.generation()``, where a sharded policy's weights are whole to be written out."""
    rollout = config.rollout
    if rollout.engine == "hf":
        return None
    from agents.rollout.vllm_engine import VLLMEngine

    with backend.generation():
        engine = VLLMEngine(policy, memory_fraction=config.engine.memory_fraction, max_model_len=config.env.max_context,
                            sleep=config.engine.sleep, seed=config.run.seed)
    engine.attach(backend)

    def factory(greedy: bool, seed: int) -> Any:
        return engine.agent(temperature=rollout.temperature, top_p=rollout.top_p, greedy=greedy, seed=seed)

    factory.engine = engine  # type: ignore[attr-defined]
    return factory


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
