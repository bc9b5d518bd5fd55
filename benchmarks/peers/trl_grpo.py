"""TRL's ``GRPOTrainer`` training on SearchQA episodes through its ``rollout_func`` hook: the peer of
:mod:`benchmarks.grpo_step_vs_trl`.

This is how a TRL user trains a multi-turn search agent on our environment without our rollout
engine. TRL's hook hands ``rollout_func(prompts, trainer)`` the generation batch (each prompt already
repeated ``num_generations`` times) and expects back, per episode, the prompt ids, the completion ids,
the sampling log-probs and an ``env_mask`` (1 on model tokens, 0 on environment tokens); extra fields
reach the reward functions. :class:`SearchQARollout` plays the episodes with what the hook offers:
per turn, ``generate`` on the unwrapped model (transformers, with the protocol's stop strings, over the
whole context so far: the KV cache does not outlive a ``generate`` call, so every turn prefills the
prompt, the earlier turns and the new results again), then the chunk goes to the same
:class:`search_env.BatchSearchQAEnv` our trainer uses, and the observation's tokens are appended.
The episode's reward comes from the environment and is passed through :func:`episode_reward`.

Settings follow TRL's own choices wherever the hook leaves them to TRL: generation reuses the
trainer's ``generation_config`` (built from ``GRPOConfig``: sampling, temperature, top-p, top-k off)
and its ``unwrap_model_for_generation``; the loss, advantages, optimiser and batching are
``GRPOTrainer``'s. :func:`build_trainer` lists the few ``GRPOConfig`` fields it sets and why.
"""
from __future__ import annotations

import copy
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerFast, PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.models import unwrap_model_for_generation

from search_env import AGENT, BatchSearchQAEnv
from search_env.data.example import QAExample
from search_env.tokenization import TokenCodec

__all__ = ["RolloutRecord", "SearchQARollout", "StepClock", "build_trainer", "episode_reward", "hf_tokenizer"]


def hf_tokenizer(codec: TokenCodec) -> PreTrainedTokenizerFast:
    """The environment's tokenizer as the transformers tokenizer TRL and ``generate`` require (same ids)."""
    tokenizer = codec.tokenizer
    if isinstance(tokenizer, PreTrainedTokenizerFast):
        return tokenizer
    eos = min(codec.eos_ids)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=copy.deepcopy(tokenizer), padding_side="left")
    wrapped.eos_token = tokenizer.id_to_token(eos)
    wrapped.pad_token = tokenizer.id_to_token(codec.pad_id)
    return wrapped


@dataclass
class RolloutRecord:
    """The last rollout's wall time and number of turns (``generate`` calls)."""

    seconds: float = 0.0
    turns: int = 0


class SearchQARollout:
    """A ``rollout_func`` for ``GRPOTrainer`` that plays SearchQA episodes turn by turn.

    Args:
        env: the batch environment (``num_envs`` = prompts x group size, one episode per row).
        examples: the questions, looked up by their text (TRL passes only the ``prompt`` column).
        tokenizer: the transformers tokenizer (stop strings are matched through it).
        stop_strings: where a turn's generation stops (the protocol's ``stop_strings``).
    """

    def __init__(self, env: BatchSearchQAEnv, examples: Sequence[QAExample], tokenizer: PreTrainedTokenizerFast,
                 stop_strings: Sequence[str]) -> None:
        self.env = env
        self.by_question: dict[str, QAExample] = {}
        for example in examples:
            if self.by_question.setdefault(example.question, example).golden_answers != example.golden_answers:
                raise ValueError(f"two examples ask {example.question!r} with different answers; TRL passes only the text")
        self.tokenizer = tokenizer
        self.codec = env.codec
        self.stop_bytes = [s.encode() for s in stop_strings]
        self.stop_strings = list(stop_strings)
        self.budget = env.max_new_tokens
        self.last = RolloutRecord()

    def __call__(self, prompts: list[str], trainer: GRPOTrainer) -> dict[str, list]:
        start = time.perf_counter()
        n = len(prompts)
        if n != self.env.num_envs:
            raise ValueError(f"the environment runs {self.env.num_envs} episodes, TRL asked for {n}")
        observations, _ = self.env.reset(options=[{"example": self.by_question[p]} for p in prompts])
        contexts = [list(obs["token_ids"]) for obs in observations]
        prompt_ids = [list(c) for c in contexts]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        used = [0] * n
        active = list(range(n))
        config = copy.deepcopy(trainer.generation_config)
        config.stop_strings = self.stop_strings
        config.output_scores = True
        config.return_dict_in_generate = True
        turns = 0
        while active:
            config.max_new_tokens = max(self.budget - used[i] for i in active)
            chunks, chunk_logps = self._generate(trainer, config, [contexts[i] for i in active])
            turns += 1
            actions: list[list[int] | None] = [None] * n
            for i, chunk in zip(active, chunks):
                actions[i] = chunk
            observations, _, terminated, truncated, infos = self.env.step(actions)
            still = []
            for i, chunk_lp in zip(active, chunk_logps):
                obs = observations[i]
                # The observation echoes the consumed agent tokens, with any environment tokens among them.
                agent_lps = iter(chunk_lp)
                logprobs[i] += [next(agent_lps) if who == AGENT else 0.0 for who in obs["producers"]]
                contexts[i] += obs["token_ids"]
                used[i] += infos[i]["consumed"]
                if not (terminated[i] or truncated[i]):
                    still.append(i)
            active = still
        trajectories = [env.trajectory for env in self.env.envs]
        completion_ids = [t.token_ids[t.prompt_length:] for t in trajectories]
        env_mask = [list(t.trained[t.prompt_length:]) for t in trajectories]
        for ids, mask, lps in zip(completion_ids, env_mask, logprobs):
            if not len(ids) == len(mask) == len(lps):
                raise RuntimeError("rollout bookkeeping broke: completion, mask and log-probs differ in length")
        self.last = RolloutRecord(seconds=time.perf_counter() - start, turns=turns)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs,
                "env_mask": env_mask, "episode_reward": [float(t.reward) for t in trajectories]}

    def _generate(self, trainer: GRPOTrainer, config: Any, contexts: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
        """One turn for the given contexts: left-padded ``generate`` over each whole context; returns each
        row's chunk (cut after its first stop string or EOS) and the chunk's sampling log-probs."""
        pad = self.tokenizer.pad_token_id
        width = max(len(c) for c in contexts)
        input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
        attention_mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        with (
            unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator, generation_kwargs=trainer.generation_kwargs) as model,
            torch.no_grad(),
        ):
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
                                 tokenizer=self.tokenizer)
        new = out.sequences[:, width:]
        scores = torch.stack(out.scores, dim=1).log_softmax(dim=-1)  # processed scores: the sampling distribution
        sampled = scores.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        chunks, chunk_logps = [], []
        for row, lps in zip(new.tolist(), sampled.tolist()):
            end = self._chunk_end(row)
            chunks.append(row[:end])
            chunk_logps.append(lps[:end])
        return chunks, chunk_logps

    def _chunk_end(self, row: list[int]) -> int:
        """Length of a generated row up to and including its first EOS or the token completing a stop string
        (``generate`` pads the rest of a finished row)."""
        text = bytearray()
        token_bytes, eos = self.codec.token_bytes, self.codec.eos_ids
        for k, token in enumerate(row):
            if token in eos:
                return k + 1
            before = len(text)
            text += token_bytes[token]
            if any(text.find(stop, max(0, before - len(stop) + 1)) != -1 for stop in self.stop_bytes):
                return k + 1
        return len(row)


def episode_reward(prompts: list, completions: list, episode_reward: list[float], **_: Any) -> list[float]:
    """TRL reward function: the environment's episode reward, forwarded by the rollout."""
    return list(episode_reward)


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
        model=model, reward_funcs=[episode_reward], args=args, processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": questions}), rollout_func=rollout, callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)  # keeps the benchmark's output to its table
    return trainer
