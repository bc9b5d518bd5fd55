"""Supervised warm start: behaviour cloning of scripted demonstrations before reinforcement learning.

A policy trained from scratch (the tiny demo model) cannot find the search-and-answer format by chance,
so RL starts from a policy cloned from :mod:`agents.scripted.demonstrations`. The loss is the cross-entropy of
the demonstration's *trained* tokens only (the agent's calls and answer; the prompt and the search
results the environment wrote carry none), averaged over those tokens, exactly the tokens and mask the
learner will later train on.

A long warm start is checkpointed like the training steps: every ``warm_start.save_every`` steps the
trainer writes a checkpoint holding the weights, the warm start's optimiser and a
:class:`WarmStartProgress`, so that a run stopped there (Ctrl-C, a kill) goes on from that step with the
same demonstrations, order and schedule, to the same weights as an uninterrupted warm start.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from agents.policies.policy import HFPolicy
from agents.rollout.batch import TrainBatch, build_batch
from agents.scripted.demonstrations import Demonstrations, gold_in_results, make_demonstrations
from agents.training.backends import TrainingBackend
from agents.training.backends.schedules import warmup_cosine
from agents.training.config import TrainConfig
from agents.training.console_log import bar_drawn, format_duration, say
from agents.training.copy_warmup import copy_warmup
from agents.training.cpu_threads import FollowFreeCores
from search_env import BatchEnv
from search_env.data.example import QAExample

__all__ = ["WarmStartResult", "WarmStartProgress", "trained_token_logprobs", "warm_start", "warm_start_loss"]

#: Share of the steps over which the learning rate warms up linearly (then it decays on a cosine to 0).
WARMUP_FRACTION = 0.05


@dataclass
class WarmStartResult:
    """What a warm start did.

    Attributes:
        losses: the loss of every step (mean cross-entropy per trained token).
        copy_losses: the loss of every copy warm-up step before it (:mod:`agents.training.copy_warmup`; empty: none).
        demonstrations: the demonstrations it cloned.
        seconds: wall time of the optimisation (demonstrations and copy warm-up excluded).
        trained_tokens_per_s: trained (loss-carrying) tokens processed per second.
        threads: the torch threads it ran on: ``warm_start.num_threads``, or the time-weighted mean of the
            free cores it followed (:class:`~agents.training.cpu_threads.FollowFreeCores`).
    """

    losses: list[float]
    demonstrations: Demonstrations
    seconds: float
    trained_tokens_per_s: float
    copy_losses: list[float] = field(default_factory=list)
    threads: float = 1.0

    def as_dict(self) -> dict[str, float]:
        """Scalars for logs: first and last loss, the demonstrations' make-up, speed."""
        demos = self.demonstrations
        return {
            "warm_start/loss_first": self.losses[0] if self.losses else float("nan"),
            "warm_start/loss_last": self.losses[-1] if self.losses else float("nan"),
            "warm_start/steps": float(len(self.losses)),
            "warm_start/demonstrations": float(len(demos.trajectories)),
            "warm_start/demo_second_hop_share": demos.second_hop_share,
            "warm_start/demo_reward": demos.mean_reward,
            "warm_start/seconds": self.seconds,
            "warm_start/trained_tokens_per_s": self.trained_tokens_per_s,
            "warm_start/threads": self.threads,
            "warm_start/copy_loss_last": self.copy_losses[-1] if self.copy_losses else float("nan"),
        }


@dataclass
class WarmStartProgress:
    """Where a warm start stands after ``step`` of its steps: what its checkpoints hold besides the
    weights and the optimiser, so that it goes on exactly from there.

    Attributes:
        step: warm-start steps done (the copy warm-up, when there is one, is done too).
        order: the shuffled demonstration indices not drawn yet.
        generator: the state of the generator that shuffles them.
        losses: the loss of every step done.
        copy_losses: the copy warm-up's losses.
        trained_tokens: trained tokens of the steps done.
        seconds: wall time of the steps done.
    """

    step: int
    order: list[int]
    generator: torch.Tensor
    losses: list[float]
    copy_losses: list[float]
    trained_tokens: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        """Plain data and a tensor, as a checkpoint stores it (:meth:`from_dict` reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> WarmStartProgress:
        return cls(**state)


def warm_start_loss(logprobs: torch.Tensor, trained_mask: torch.Tensor, total_trained: float) -> torch.Tensor:
    """Negative log-likelihood of the trained tokens, summed and divided by ``total_trained``, the trained
    tokens of the whole batch (so micro-batch losses add up to the batch's per-token mean)."""
    return -(logprobs * trained_mask).sum() / total_trained


def warm_start(
    backend: TrainingBackend,
    config: TrainConfig,
    env: Any,
    examples: Sequence[QAExample] | None = None,
    *,
    progress: WarmStartProgress | None = None,
    save: Callable[[WarmStartProgress], None] | None = None,
) -> WarmStartResult:
    """Clone ``warm_start.examples`` demonstrations into ``backend.policy`` with ``warm_start.steps``
    optimiser steps of the backend (:meth:`~agents.training.backends.base.TrainingBackend.supervised`: a fresh
    AdamW of its own, the backend's gradient clipping and non-finite-gradient guard).

    Demonstrations are played in ``env`` (a :class:`~search_env.SearchQAEnv`, or a single environment made
    by a :class:`~search_env.BatchEnv`) on ``examples`` (default: the
    environment's dataset); a multi-hop one takes its second hop with probability
    ``warm_start.second_hop_rate``. First, when ``warm_start.copy_steps`` > 0, the copy warm-up
    (:func:`agents.training.copy_warmup.copy_warmup`) on strings of the demonstrations' own ids
    (end-of-sequence and padding left out). Each step takes ``warm_start.batch_size`` demonstrations
    (seeded reshuffles, epoch by epoch), ordered by length and split into micro-batches of
    ``optim.micro_batch_size`` rows, each trimmed to its longest row (the same gradient with less
    padding); the learning rate ``warm_start.learning_rate`` warms up over the first steps and decays on a
    cosine. Shows a progress bar as ``run.progress`` says. Runs on ``warm_start.num_threads`` torch threads,
    or when unset on the cores other work leaves free, looked at again as it runs
    (:class:`~agents.training.cpu_threads.FollowFreeCores`); the process's count is restored after.

    ``save``, when given, is called every ``warm_start.save_every`` steps (not after the last one) with
    the warm start's :class:`WarmStartProgress`, to write a checkpoint; ``progress`` (one such, restored
    with the backend's state of that moment) goes on from there: the copy warm-up is not run again.
    """
    options = config.warm_start
    if options.steps < 1:
        raise ValueError(f"warm_start.steps must be >= 1 for a warm start, got {options.steps}")
    threads = torch.get_num_threads()
    follower = FollowFreeCores() if options.num_threads is None else None
    if follower is None:
        torch.set_num_threads(options.num_threads)
    try:
        result = _warm_start(backend, config, env, examples, progress, save, follower)
    finally:
        torch.set_num_threads(threads)
    result.threads = follower.mean_threads() if follower is not None else float(options.num_threads)
    return result


def _warm_start(backend: TrainingBackend, config: TrainConfig, env: Any, examples: Sequence[QAExample] | None,
                progress: WarmStartProgress | None, save: Callable[[WarmStartProgress], None] | None,
                follower: FollowFreeCores | None) -> WarmStartResult:
    options = config.warm_start
    policy, seed = backend.policy, config.run.seed
    single = env.make_env() if isinstance(env, BatchEnv) else env
    demos = make_demonstrations(
        single, single.examples if examples is None else examples, options.examples,
        second_hop_rate=options.second_hop_rate, seed=seed,
    )
    if options.answerable_only:
        demos = demos.kept(lambda trajectory: gold_in_results(trajectory, policy.codec.decode))
    trajectories = demos.trajectories
    copy_losses: list[float] = [] if progress is None else list(progress.copy_losses)
    if options.copy_steps > 0 and progress is None:
        left_out = {*policy.codec.eos_ids, policy.codec.pad_id}
        pool = {i for t in trajectories for i in t.token_ids} - left_out
        copy_losses = copy_warmup(backend, pool, options.copy_steps, lr=options.learning_rate, seed=seed)
    device = backend.device
    warmup = max(1, round(WARMUP_FRACTION * options.steps))
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    losses: list[float] = []
    trained_tokens, done, seconds_before = 0, 0, 0.0
    if progress is not None:
        generator.set_state(progress.generator)
        order, losses, trained_tokens = list(progress.order), list(progress.losses), progress.trained_tokens
        done, seconds_before = progress.step, progress.seconds
    was_training = policy.training
    policy.eval()
    score = _scorer(policy, build_batch(trajectories[:2], ["a", "b"], policy.codec.pad_id), device)
    policy.train()
    started = time.perf_counter()
    adamw = {"betas": tuple(config.optim.adam_betas), "weight_decay": config.optim.weight_decay}
    try:
        with backend.supervised(options.learning_rate, lambda s: warmup_cosine(s, warmup, options.steps), **adamw):
            for step in _steps(config, done, backend.rank):
                if follower is not None:
                    follower.follow()
                while len(order) < options.batch_size:
                    order += torch.randperm(len(trajectories), generator=generator).tolist()
                rows, order = order[: options.batch_size], order[options.batch_size :]
                # Ordered by length, so that each micro-batch is trimmed to its own longest row (same gradient).
                picked = sorted((trajectories[i] for i in rows), key=lambda t: len(t.token_ids))
                batch = build_batch(picked, [t.example_id for t in picked], policy.codec.pad_id)
                total = float(batch.trained_mask.sum())
                if total == 0:
                    raise ValueError("the demonstrations hold no trained tokens")
                loss_value = 0.0
                for mb in batch.micro_batches(max(config.optim.micro_batch_size, 1)):
                    mb_trained = mb.trained_mask.to(device)
                    logprobs = score(mb.input_ids.to(device), mb.attention_mask.to(device), mb.position_ids.to(device), mb_trained)
                    loss = warm_start_loss(logprobs, mb_trained, total)
                    backend.backward(loss)
                    loss_value += loss.item()
                backend.step()
                losses.append(loss_value)
                trained_tokens += int(total)
                finished = step + 1
                if save is not None and options.save_every > 0 and finished % options.save_every == 0 and finished < options.steps:
                    save(WarmStartProgress(finished, list(order), generator.get_state(), list(losses), list(copy_losses),
                                           trained_tokens, seconds_before + time.perf_counter() - started))
    finally:
        policy.train(was_training)
    seconds = seconds_before + time.perf_counter() - started
    return WarmStartResult(losses, demos, seconds, trained_tokens / max(seconds, 1e-9), copy_losses)


Scorer = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def trained_token_logprobs(policy: HFPolicy, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           position_ids: torch.Tensor, trained_mask: torch.Tensor) -> torch.Tensor:
    """Token-aligned log-probs (temperature 1) at the trained positions, 0 elsewhere, with the LM head
    applied only where a trained token is predicted.

    The head and its softmax over the vocabulary cost as much as the whole body of a tiny model and are
    needed at a few positions of a demonstration (its calls and answer, not the results); this assumes
    the model's logits are its output embedding applied to the last hidden state (Llama, Qwen2, SmolLM2).
    """
    hidden = policy.model.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                     use_cache=False).last_hidden_state
    want = trained_mask[:, 1:].bool()
    logits = policy.model.get_output_embeddings()(hidden[:, :-1][want])[:, : policy.vocab_size].float()
    picked = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:][want][:, None]).squeeze(-1)
    out = torch.zeros(input_ids.shape, dtype=picked.dtype, device=picked.device)
    out[:, 1:][want] = picked
    return out


def _scorer(policy: HFPolicy, probe: TrainBatch, device: torch.device) -> Scorer:
    """:func:`trained_token_logprobs` when it agrees with the policy's own forward pass on ``probe`` (a
    model whose logits are the output embedding of the last hidden state), else the policy's forward. A
    model sharded by FSDP (the ``fsdp`` backend) takes the forward: its weights are gathered, and its
    gradients reduced, by the hooks of the whole model's forward, which the shortcut does not call."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(policy.model, FSDPModule):
        return lambda ids, mask, positions, trained: policy(ids, mask, positions).logprobs

    def full(ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
        return policy(ids, mask, positions).logprobs

    def fast(ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
        return trained_token_logprobs(policy, ids, mask, positions, trained)

    args = [probe.input_ids.to(device), probe.attention_mask.to(device), probe.position_ids.to(device),
            probe.trained_mask.to(device)]
    with torch.no_grad():
        reference, quick = full(*args), fast(*args)
    on = args[3].bool()
    return fast if torch.allclose(reference[on], quick[on], atol=1e-4) else full


#: Off a terminal, a plain progress line every this share of the warm start's steps.
PLAIN_LINE_SHARE = 0.1


def _steps(config: TrainConfig, done: int, rank: int) -> Iterator[int]:
    """The steps left, ``done`` to ``warm_start.steps``: under a bar at a terminal (``run.progress``), or,
    off one, with a plain line on stderr every tenth of the steps (loss, elapsed, time left), so that a
    log shows a long warm start moving. Other ranks than 0 show nothing."""
    total = config.warm_start.steps
    if rank != 0:
        yield from range(done, total)
        return
    if bar_drawn(config.run.progress):
        from tqdm.auto import tqdm

        yield from tqdm(range(done, total), desc="warm start", unit="step", initial=done, total=total, dynamic_ncols=True)
        return
    every = max(1, round(PLAIN_LINE_SHARE * total))
    started = time.perf_counter()
    for step in range(done, total):
        yield step
        finished = step + 1
        if finished % every == 0 or finished == total:
            elapsed = time.perf_counter() - started
            left = elapsed / (finished - done) * (total - finished)
            say(f"warm start: step {finished}/{total} ({finished / total:.0%}), {format_duration(elapsed)} elapsed, "
                f"~{format_duration(left)} left")
