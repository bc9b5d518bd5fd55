"""The one interface between the trainer and a training engine, and the registry of engines.

The trainer (:mod:`agents.training.trainer`) never touches a model, an optimiser or a device directly. It
asks its backend for forward passes over micro-batches, hands it each micro-batch's loss, asks it to take a
step, and to save or load itself into a checkpoint folder. That keeps one trainer for every engine:
:class:`~agents.training.backends.torch.TorchBackend` runs plain PyTorch on one device; a data-parallel
engine (DeepSpeed ZeRO, PyTorch's FSDP2) implements the same methods in a file of its own, registers itself
with :func:`register_backend`, and is picked by ``run.backend``. A rollout engine that keeps its own copy of
the weights (vLLM) registers a post-step hook (:meth:`TrainingBackend.add_post_step_hook`) to pick up each
update, and reads the weights one at a time through :meth:`TrainingBackend.rollout_weights` (a sharded
engine gathers each in turn).

Contract on losses: the trainer divides every micro-batch's loss by counts over the whole mini-batch
(see :class:`agents.learners.BatchCounts`), reduced across data-parallel ranks by
:meth:`TrainingBackend.reduce_counts`, so the gradients of a mini-batch's micro-batches *sum* to its
full-batch gradient, over micro-batches and over ranks. A backend accumulates them as given and must not
rescale them (DeepSpeed's engine, which divides by its accumulation steps, must be told not to; an engine
that averages gradients over ranks must make that mean a sum).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator

import torch

from agents.policies.policy import HFPolicy, PolicyOutput
from agents.rollout.batch import TrainBatch
from agents.training.config import TrainConfig
from rewards.name_registry import Registry

if TYPE_CHECKING:
    from agents.learners import Algorithm, BatchCounts

__all__ = [
    "BACKENDS", "TrainingBackend", "backend_options_class", "build_backend", "lookup_backend", "register_backend",
    "split_micro_batches", "training_dtype",
]


class TrainingBackend(ABC):
    """Owns the trainable policy (and critic), the frozen reference and the optimisers.

    Attributes:
        policy: the policy being trained; rollouts sample from it (or from an engine synced to it).
    """

    policy: HFPolicy
    #: The dataclass of the backend's own settings (the run config's ``backend`` group).
    options_class: ClassVar[type]
    #: A LoRA policy's frozen base is loaded in the run's precision (``run.dtype``; half the memory in bf16)
    #: rather than in fp32, because the backend keeps it as loaded and runs it under autocast. What is
    #: trained is loaded in fp32 either way (an optimiser's steps must not round away).
    frozen_base_in_run_dtype: ClassVar[bool] = False

    def __init__(self) -> None:
        self._post_step_hooks: list[Callable[[], None]] = []

    @classmethod
    @abstractmethod
    def from_config(cls, config: TrainConfig, policy: HFPolicy, algorithm: Algorithm) -> TrainingBackend:
        """The backend a run's config asks for, around ``policy`` (with a critic and a reference policy
        when ``algorithm`` needs them)."""

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """The device batches go to before :meth:`forward`."""

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
        """Make the reference a frozen copy of the policy as it is now (after a warm start), if the
        backend keeps one. A policy with LoRA adapters, whose reference is its own base (adapters off),
        cannot: ``RuntimeError``."""

    @abstractmethod
    def micro_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        """Split a mini-batch into the micro-batches that fit one forward/backward pass: consecutive
        slices of its rows, in order (the trainer writes per-row results back by position)."""

    def reduce_counts(self, counts: BatchCounts) -> BatchCounts:
        """``counts`` summed over data-parallel ranks (each rank holds its share of the batch); on one
        process they are the counts themselves."""
        return counts

    # -- data parallelism: one process unless a backend runs several ranks -------------------------
    @property
    def rank(self) -> int:
        """This process's data-parallel rank (0 on one process): rank 0 evaluates, logs and writes the
        trainer's files."""
        return 0

    @property
    def world_size(self) -> int:
        """Data-parallel ranks; each rolls out ``rollout.questions_per_step / world_size`` questions."""
        return 1

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over ranks (batch-wide statistics: whitening, logged means); itself on one process."""
        return tensor

    def barrier(self) -> None:
        """Wait until every rank gets here (no-op on one process)."""

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (itself on one process)."""
        return obj

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (``[obj]`` on one process)."""
        return [obj]

    @contextmanager
    def generation(self) -> Iterator[None]:
        """Within the block the policy's weights are whole for decoding with ``backend.policy`` (a sharded
        engine gathers them; a collective every rank enters); nothing to do on one process."""
        yield

    @contextmanager
    def scoring(self) -> Iterator[None]:
        """Within the block forward passes of ``backend.policy`` score given sequences in the precision that
        :meth:`generation` decodes in, with no more of a sharded policy whole than a forward pass of training
        holds: a sharded engine gathers each module's weights for its own pass (a collective every rank runs,
        on the same sequences). The sync check scores its probe so after every weight sync. Default:
        :meth:`generation` itself (nothing to gather on one process)."""
        with self.generation():
            yield

    @abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of one micro-batch's loss (already scaled by global counts)."""

    @abstractmethod
    def step(self) -> float:
        """Clip, apply and clear the accumulated gradients, then run the post-step hooks; return the
        policy's gradient norm before clipping (a non-finite norm skips the update)."""

    @abstractmethod
    def finish_step(self) -> None:
        """The training step's updates are done: advance the learning-rate schedules, which count
        training steps as the seed systems do (not the optimiser steps each one takes)."""

    @abstractmethod
    @contextmanager
    def supervised(self, learning_rate: float, schedule: Callable[[int], float] | None = None,
                   **adamw: Any) -> Iterator[None]:
        """Within the block, :meth:`step` updates the policy alone with a fresh AdamW at ``learning_rate``
        x ``schedule(optimiser step)`` (constant without one; ``adamw``: its other options), for a
        warm start; the run's own optimisers are untouched and apply again after it. A checkpoint written
        within the block (:meth:`save`) holds the block's optimiser and schedule; after loading it, the next
        block goes on with them (a warm start resumed half-way)."""

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
    def save(self, directory: Path) -> None:
        """Write everything needed to continue training exactly (weights, optimiser and schedule states)
        into ``directory``, which exists and is empty; a sharded engine writes one file per rank."""

    @abstractmethod
    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote into ``directory``."""

    def rollout_weights(self, *, adapters: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's weights, each whole, by the names :meth:`HFPolicy.named_weights
        <agents.policies.policy.HFPolicy.named_weights>` gives (the transformers model's state-dict names, what
        a rollout engine's loader reads; ``adapters=True``: a LoRA policy's adapters alone), one at a time,
        so that an engine that keeps its own copy (:class:`~agents.rollout.vllm_engine.VLLMEngine`) can load
        them as they come. A sharded engine gathers each in turn: on several ranks a collective that every
        rank runs to the end. A tensor may share memory with the trained parameter (copy it to keep it past
        the next optimiser step)."""
        for name, tensor in self.policy.named_weights(adapters=adapters):
            yield name, tensor.detach()

    def add_post_step_hook(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` after every optimiser step (e.g. to sync a rollout engine's weights)."""
        self._post_step_hooks.append(hook)

    def _run_post_step_hooks(self) -> None:
        for hook in self._post_step_hooks:
            hook()


BACKENDS: Registry[type[TrainingBackend]] = Registry("run.backend", built_in={
    "torch": "agents.training.backends.torch", "deepspeed": "agents.training.backends.deepspeed",
    "fsdp": "agents.training.backends.fsdp"})
"""Backend name (``run.backend``) -> backend class. The built-in backends' modules are imported when their
name is first looked up (an engine itself - DeepSpeed - loads only when its backend is built)."""


def lookup_backend(name: str) -> type[TrainingBackend]:
    """The backend class registered as ``name``; ``UnknownNameError`` (one line, the known names) for another."""
    return BACKENDS.lookup(name)


def backend_options_class(name: str) -> type:
    """The options dataclass of backend ``name`` (the run config's ``backend`` group)."""
    return lookup_backend(name).options_class


def register_backend(name: str, *, options: type,
                     replace: bool = False) -> Callable[[type[TrainingBackend]], type[TrainingBackend]]:
    """Class decorator: make a backend reachable as ``run.backend: name``, its settings the dataclass
    ``options`` (the run config's ``backend`` group, ``--backend.FIELD``). A name taken by another class is
    a ``ValueError`` unless ``replace=True``."""

    def register(cls: type[TrainingBackend]) -> type[TrainingBackend]:
        cls.options_class = options
        return BACKENDS.add(name, cls, replace=replace)

    return register


def build_backend(config: TrainConfig, policy: HFPolicy, algorithm: Algorithm) -> TrainingBackend:
    """The backend ``config.run.backend`` names, built around ``policy``."""
    return lookup_backend(config.run.backend).from_config(config, policy, algorithm)


def training_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The compute precision ``run.dtype`` (``auto``, ``bf16``, ``fp32``) names on ``device``: ``auto`` is
    bf16 on a GPU that supports it and fp32 elsewhere (a CPU's bf16 is slower than its fp32)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    return {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]


def split_micro_batches(batch: TrainBatch, micro_batch_size: int) -> list[TrainBatch]:
    """:meth:`TrainingBackend.micro_batches` of every built-in backend: consecutive slices of
    ``optim.micro_batch_size`` rows (``0``: the whole mini-batch in one pass, at least one row)."""
    return batch.micro_batches(micro_batch_size if micro_batch_size > 0 else max(len(batch), 1))
