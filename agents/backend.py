"""Where the models and optimisers live: the one interface between the trainer and a training engine.

The trainer (:mod:`agents.trainer`) never touches a model, an optimiser or a device directly. It asks
its backend for forward passes over micro-batches, hands it each micro-batch's loss, and asks it to
take a step. That keeps one trainer for every engine: :class:`TorchBackend` runs plain PyTorch on one
device; a DeepSpeed ZeRO backend (sharded optimiser state, its own gradient accumulation) or a backend
whose rollouts run on vLLM implements the same methods and plugs into the same trainer.

Contract on losses: the trainer divides every micro-batch's loss by counts over the whole mini-batch
(see :class:`agents.learners.BatchCounts`), so the gradients of a mini-batch's micro-batches *sum* to
its full-batch gradient. A backend accumulates them as given and must not rescale them (DeepSpeed's
engine, which divides by its accumulation steps, must be told not to).
"""
from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any

import torch

from agents.batch import TrainBatch
from agents.config import TrainConfig
from agents.policy import HFPolicy, PolicyOutput, ValueModel

__all__ = ["TrainingBackend", "TorchBackend"]


class TrainingBackend(ABC):
    """Owns the trainable policy (and critic), the frozen reference and the optimisers.

    Attributes:
        policy: the policy being trained; rollouts sample from it (or from an engine synced to it).
    """

    policy: HFPolicy

    @abstractmethod
    def forward(self, batch: TrainBatch, *, with_entropy: bool = False, with_values: bool = False) -> PolicyOutput:
        """Token-aligned log-probs (at the sampling temperature), optionally entropy and critic values,
        of the policy on ``batch``; differentiable when called under grad. Log-probs and entropy need only
        be right from ``batch.first_trained_column`` on (the learner reads them on trained tokens only)."""

    @abstractmethod
    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """Token-aligned log-probs of the frozen reference policy on ``batch`` (no grad; right from
        ``batch.first_trained_column`` on)."""

    @abstractmethod
    def reset_reference(self) -> None:
        """Make the reference a frozen copy of the policy as it is now (after a warm start)."""

    @abstractmethod
    def micro_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        """Split a mini-batch into the micro-batches that fit one forward/backward pass: consecutive
        slices of its rows, in order (the trainer writes per-row results back by position)."""

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of one micro-batch's loss (already scaled by global counts)."""

    @abstractmethod
    def step(self) -> float:
        """Clip, apply and clear the accumulated gradients; return the policy's gradient norm before
        clipping (a non-finite norm skips the update)."""

    @abstractmethod
    def train(self) -> None:
        """Put the trained models in training mode (for updates)."""

    @abstractmethod
    def eval(self) -> None:
        """Put the trained models in evaluation mode (rollouts and log-probs of the rollout policy)."""

    @property
    @abstractmethod
    def learning_rate(self) -> float:
        """The policy optimiser's current learning rate."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training exactly: weights, optimiser and schedule states."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class TorchBackend(TrainingBackend):
    """Plain PyTorch on one device: AdamW, gradient-norm clipping, linear warm-up then a constant rate.

    Args:
        policy: the policy to train (already on its device).
        config: ``learning_rate``, ``weight_decay``, ``adam_betas``, ``max_grad_norm`` (<= 0: no
            clipping), ``warmup_steps`` (optimiser steps), ``micro_batch_size`` (<= 0: no split) and
            ``temperature`` (log-probs are taken at the sampling temperature).
        critic: a separate value model (PPO without a value head), trained by its own AdamW.
        critic_learning_rate: the critic's learning rate (default: the policy's).
        with_reference: keep a frozen copy of the policy for KL terms.
    """

    def __init__(
        self,
        policy: HFPolicy,
        config: TrainConfig,
        *,
        critic: ValueModel | None = None,
        critic_learning_rate: float | None = None,
        with_reference: bool = False,
    ) -> None:
        self.policy = policy
        self.critic = critic
        self.config = config
        self.optimizer = self._adamw(policy.parameters(), config.learning_rate)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._warmup)
        self.critic_optimizer = None
        if critic is not None:
            lr = config.learning_rate if critic_learning_rate is None else critic_learning_rate
            self.critic_optimizer = self._adamw(critic.parameters(), lr)
        self.reference: HFPolicy | None = None
        if with_reference:
            self.reset_reference()

    def _adamw(self, params: Any, lr: float) -> torch.optim.AdamW:
        c = self.config
        return torch.optim.AdamW(params, lr=lr, betas=tuple(c.adam_betas), weight_decay=c.weight_decay)

    def _warmup(self, optimizer_steps: int) -> float:
        warmup = self.config.warmup_steps
        return 1.0 if warmup <= 0 else min(1.0, (optimizer_steps + 1) / warmup)

    # -- forward passes --------------------------------------------------------------------------
    def forward(self, batch: TrainBatch, *, with_entropy: bool = False, with_values: bool = False) -> PolicyOutput:
        head_values = with_values and self.critic is None
        out = self.policy.forward(
            batch.input_ids, batch.attention_mask, batch.position_ids,
            temperature=self.config.temperature, with_entropy=with_entropy, with_values=head_values,
            from_column=batch.first_trained_column,
        )
        if with_values and self.critic is not None:
            out = replace(out, values=self.critic.values(batch.input_ids, batch.attention_mask, batch.position_ids))
        return out

    @torch.no_grad()
    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        if self.reference is None:
            raise RuntimeError("this backend keeps no reference policy (with_reference=False)")
        return self.reference.forward(
            batch.input_ids, batch.attention_mask, batch.position_ids, temperature=self.config.temperature,
            from_column=batch.first_trained_column,
        ).logprobs

    def reset_reference(self) -> None:
        self.reference = copy.deepcopy(self.policy)
        self.reference.eval()
        for param in self.reference.parameters():
            param.requires_grad_(False)

    def micro_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        size = self.config.micro_batch_size
        return batch.micro_batches(size if size > 0 else max(len(batch), 1))

    # -- optimisation ----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        norm = self._apply(self.policy.parameters(), self.optimizer)
        self.scheduler.step()
        if self.critic is not None:
            self._apply(self.critic.parameters(), self.critic_optimizer)
        return norm

    def _apply(self, params: Any, optimizer: torch.optim.Optimizer) -> float:
        params = [p for p in params if p.requires_grad]
        limit = self.config.max_grad_norm if self.config.max_grad_norm > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, limit))
        if math.isfinite(norm):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm

    def train(self) -> None:
        self.policy.train()
        if self.critic is not None:
            self.critic.train()

    def eval(self) -> None:
        self.policy.eval()
        if self.critic is not None:
            self.critic.eval()

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        if self.reference is not None:
            self.reference.load_state_dict(state["reference"])
