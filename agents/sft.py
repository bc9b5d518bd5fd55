"""Supervised warm start: behaviour cloning of scripted demonstrations before reinforcement learning.

A policy trained from scratch (the tiny demo model) cannot find the search-and-answer format by chance,
so RL starts from a policy cloned from :mod:`agents.demonstrations`. The loss is the cross-entropy of
the demonstration's *trained* tokens only (the agent's calls and answer; the prompt and the search
results the environment wrote carry none), averaged over those tokens, exactly the tokens and mask the
learner will later train on.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from agents.config import TrainConfig
from agents.copy_warmup import copy_warmup
from agents.demonstrations import Demonstrations, make_demonstrations
from agents.batch import TrainBatch
from agents.policy import HFPolicy
from agents.rollout import build_batch
from search_env.data.example import QAExample

__all__ = ["SFTResult", "warm_start", "sft_loss", "trained_token_logprobs"]

#: Share of the steps over which the learning rate warms up linearly (then it decays on a cosine to 0).
WARMUP_FRACTION = 0.05


@dataclass
class SFTResult:
    """What a warm start did.

    Attributes:
        losses: the loss of every step (mean cross-entropy per trained token).
        copy_losses: the loss of every copy warm-up step before it (:mod:`agents.copy_warmup`; empty: none).
        demonstrations: the demonstrations it cloned.
        seconds: wall time of the optimisation (demonstrations and copy warm-up excluded).
        trained_tokens_per_s: trained (loss-carrying) tokens processed per second.
    """

    losses: list[float]
    demonstrations: Demonstrations
    seconds: float
    trained_tokens_per_s: float
    copy_losses: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, float]:
        """Scalars for logs: first and last loss, the demonstrations' make-up, speed."""
        demos = self.demonstrations
        return {
            "sft/loss_first": self.losses[0] if self.losses else float("nan"),
            "sft/loss_last": self.losses[-1] if self.losses else float("nan"),
            "sft/steps": float(len(self.losses)),
            "sft/demonstrations": float(len(demos.trajectories)),
            "sft/demo_second_hop_share": demos.second_hop_share,
            "sft/demo_reward": demos.mean_reward,
            "sft/seconds": self.seconds,
            "sft/trained_tokens_per_s": self.trained_tokens_per_s,
            "sft/copy_loss_last": self.copy_losses[-1] if self.copy_losses else float("nan"),
        }


def sft_loss(logprobs: torch.Tensor, trained_mask: torch.Tensor, total_trained: float) -> torch.Tensor:
    """Negative log-likelihood of the trained tokens, summed and divided by ``total_trained``, the trained
    tokens of the whole batch (so micro-batch losses add up to the batch's per-token mean)."""
    return -(logprobs * trained_mask).sum() / total_trained


def warm_start(
    policy: HFPolicy,
    config: TrainConfig,
    env: Any,
    examples: Sequence[QAExample] | None = None,
    *,
    batch_size: int = 32,
) -> SFTResult:
    """Clone ``config.sft_examples`` demonstrations into ``policy`` with ``config.sft_steps`` AdamW steps.

    Demonstrations are played in ``env`` (a :class:`~search_env.SearchQAEnv` or a
    :class:`~search_env.BatchSearchQAEnv`, whose first environment is used) on ``examples`` (default: the
    environment's dataset); a multi-hop one takes its second hop with probability
    ``config.sft_second_hop_rate``. First, when ``config.sft_copy_steps`` > 0, the copy warm-up
    (:func:`agents.copy_warmup.copy_warmup`, at ``config.sft_lr``) on strings of the demonstrations' own
    ids (end-of-sequence and padding left out). Each step takes ``batch_size`` demonstrations (seeded reshuffles,
    epoch by epoch), ordered by length and split into micro-batches of ``config.micro_batch_size`` rows,
    each trimmed to its longest row (the demo's 1-hop demonstrations are half as long as its 2-hop ones: 8
    rows a micro-batch instead of 32 took a step from 135 to 91 ms); the learning rate ``config.sft_lr``
    warms up over the first steps and decays on a cosine; gradients are clipped at
    ``config.max_grad_norm``. Shows a progress bar as ``config.progress`` says.
    """
    if config.sft_steps < 1:
        raise ValueError(f"sft_steps must be >= 1 for a warm start, got {config.sft_steps}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    single = env.envs[0] if hasattr(env, "envs") else env
    demos = make_demonstrations(
        single, single.examples if examples is None else examples, config.sft_examples,
        second_hop_rate=config.sft_second_hop_rate, seed=config.seed,
    )
    trajectories = demos.trajectories
    copy_losses: list[float] = []
    if config.sft_copy_steps > 0:
        left_out = {*policy.codec.eos_ids, policy.codec.pad_id}
        pool = {i for t in trajectories for i in t.token_ids} - left_out
        copy_losses = copy_warmup(policy.model, pool, config.sft_copy_steps, lr=config.sft_lr, seed=config.seed,
                                  max_grad_norm=config.max_grad_norm)
    device = next(policy.parameters()).device
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.sft_lr, betas=tuple(config.adam_betas),
                                  weight_decay=config.weight_decay)
    warmup = max(1, round(WARMUP_FRACTION * config.sft_steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, warmup, config.sft_steps))
    generator = torch.Generator().manual_seed(config.seed)
    order: list[int] = []
    losses: list[float] = []
    trained_tokens = 0
    was_training = policy.training
    policy.eval()
    score = _scorer(policy, build_batch(trajectories[:2], ["a", "b"], policy.codec.pad_id), device)
    policy.train()
    started = time.perf_counter()
    try:
        for _ in _steps(config):
            while len(order) < batch_size:
                order += torch.randperm(len(trajectories), generator=generator).tolist()
            rows, order = order[:batch_size], order[batch_size:]
            # Ordered by length, so that each micro-batch is trimmed to its own longest row (same gradient).
            picked = sorted((trajectories[i] for i in rows), key=lambda t: len(t.token_ids))
            batch = build_batch(picked, [t.example_id for t in picked], policy.codec.pad_id)
            total = float(batch.trained_mask.sum())
            if total == 0:
                raise ValueError("the demonstrations hold no trained tokens")
            optimizer.zero_grad(set_to_none=True)
            loss_value = 0.0
            for mb in batch.micro_batches(max(config.micro_batch_size, 1)):
                mb_trained = mb.trained_mask.to(device)
                logprobs = score(mb.input_ids.to(device), mb.attention_mask.to(device), mb.position_ids.to(device), mb_trained)
                loss = sft_loss(logprobs, mb_trained, total)
                loss.backward()
                loss_value += loss.item()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm)
            optimizer.step()
            schedule.step()
            losses.append(loss_value)
            trained_tokens += int(total)
    finally:
        optimizer.zero_grad(set_to_none=True)  # no warm-start gradient may leak into the first RL update
        policy.train(was_training)
    seconds = time.perf_counter() - started
    return SFTResult(losses, demos, seconds, trained_tokens / max(seconds, 1e-9), copy_losses)


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
    model whose logits are the output embedding of the last hidden state), else the policy's forward."""

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


def _lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up to 1 over ``warmup`` steps, then a cosine decay to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1.0 + math.cos(math.pi * min((step - warmup) / max(total - warmup, 1), 1.0)))


def _steps(config: TrainConfig):
    from tqdm.auto import tqdm

    show = sys.stderr.isatty() if config.progress is None else config.progress
    return tqdm(range(config.sft_steps), desc="warm start", unit="step", disable=not show, dynamic_ncols=True)
