"""TRL's ``GRPOTrainer`` as the peer of :mod:`benchmarks.grpo_step_vs_trl`: the trainer built with the public
TRL adapter (:class:`search_env.integrations.trl.SearchQARollout` as its ``rollout_func``,
:func:`~search_env.integrations.trl.environment_reward` as its reward) and a callback that times its steps.

This is how a TRL user trains a multi-turn search agent on our environment without our rollout engine
(the adapter's docstring says how an episode is played). Settings follow TRL's own choices wherever the
hook leaves them to TRL: generation reuses the trainer's ``generation_config`` (built from
``GRPOConfig``: sampling, temperature, top-p, top-k off) and its ``unwrap_model_for_generation``; the
loss, advantages, optimiser and batching are ``GRPOTrainer``'s. :func:`build_trainer` lists the few
``GRPOConfig`` fields it sets and why.
"""
from __future__ import annotations

import tempfile
import time
from typing import Any

from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerFast, PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from search_env.integrations.trl import SearchQARollout, environment_reward

__all__ = ["StepClock", "build_trainer"]


class StepClock(TrainerCallback):
    """Times each optimiser step of TRL's loop and calls ``between(step)`` after it, so a peer's step runs
    between two of TRL's (runs alternated); a step's window starts when ``between`` returns, so it holds
    everything TRL does per step (data loading, rollout, scoring, update, logging)."""

    def __init__(self, between: Any) -> None:
        self.between = between
        self.step_seconds: list[float] = []
        self._start = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001 - TrainerCallback's signature
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        self.step_seconds.append(time.perf_counter() - self._start)
        self.between(len(self.step_seconds))
        self._start = time.perf_counter()


def build_trainer(model: str | PreTrainedModel, tokenizer: PreTrainedTokenizerFast, rollout: SearchQARollout,
                  questions: list[str], *, steps: int, group_size: int, micro_batch_size: int, learning_rate: float,
                  temperature: float, top_p: float, beta: float, max_new_tokens: int, seed: int,
                  callbacks: list[TrainerCallback], output_dir: str | None = None) -> GRPOTrainer:
    """``GRPOTrainer`` over ``questions`` (``len(questions) / steps`` distinct questions per step, in order).

    ``model`` is a model folder or a loaded model; with KL on (``beta > 0``) TRL loads its reference
    model from the policy's folder, so pass a folder then.

    ``GRPOConfig`` fields set, and why (everything else is TRL's default: ``loss_type="dapo"``, i.e. a
    token mean over the whole generation batch; ``scale_rewards="group"``; ``epsilon=0.2``;
    ``num_iterations=1``, so old log-probs are the update's own detached ones and no extra forward pass
    runs; ``max_grad_norm=1``; AdamW):

    - ``use_cpu``, ``bf16=False``: fp32 on the CPU, as ours runs (TRL's default is bf16).
    - ``gradient_checkpointing=False`` (TRL's default is on): ours keeps activations, so checkpointing
      would charge TRL a second forward pass per micro-batch that ours does not run.
    - ``report_to="none"``, ``save_strategy="no"``, ``disable_tqdm``, a temporary ``output_dir``: no hub,
      no trackers, no checkpoint writes, no progress bar (ours writes none of these in a step either).
    - ``per_device_train_batch_size`` = the micro-batch, ``gradient_accumulation_steps`` = episodes per
      step / micro-batch: one optimiser step per generation batch, the same split as ours.
    - ``num_generations``, ``max_completion_length``, ``temperature``, ``top_p``, ``learning_rate``,
      ``beta``, ``seed``: the benchmark's shared settings.
    - ``shuffle_dataset=False``: questions are taken in order, so both sides train on the same ones.
    """
    per_step = len(questions) // steps
    episodes = per_step * group_size
    if episodes % micro_batch_size:
        raise ValueError(f"episodes per step ({episodes}) must be a multiple of the micro-batch ({micro_batch_size})")
    args = GRPOConfig(
        output_dir=output_dir or tempfile.mkdtemp(prefix="trl-grpo-"),
        use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none", save_strategy="no", disable_tqdm=True,
        per_device_train_batch_size=micro_batch_size, gradient_accumulation_steps=episodes // micro_batch_size,
        num_generations=group_size, max_completion_length=max_new_tokens, temperature=temperature, top_p=top_p,
        learning_rate=learning_rate, beta=beta, seed=seed, max_steps=steps, shuffle_dataset=False,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=[environment_reward], args=args, processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": questions}), rollout_func=rollout, callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)  # keeps the benchmark's output to its table
    return trainer
