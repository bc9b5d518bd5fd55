"""Where the models and optimisers live: the one interface between the trainer and a training engine.

The trainer (:mod:`agents.training.trainer`) never touches a model, an optimiser or a device directly. It
asks its backend for forward passes over micro-batches, hands it each micro-batch's loss, asks it to take a
step, and to save or load itself into a checkpoint folder. That keeps one trainer for every engine:
:class:`TorchBackend` runs plain PyTorch on one device; a data-parallel engine (DeepSpeed ZeRO) implements
the same methods in a file of its own, registers itself with :func:`register_backend`, and is picked by
``run.backend``. A rollout engine that keeps its own copy of the weights (vLLM) registers a post-step hook
(:meth:`TrainingBackend.add_post_step_hook`) to pick up each update, and reads the weights one at a time
through :meth:`TrainingBackend.rollout_weights` (a sharded engine gathers each in turn).

Contract on losses: the trainer divides every micro-batch's loss by counts over the whole mini-batch
(see :class:`agents.learners.BatchCounts`), reduced across data-parallel ranks by
:meth:`TrainingBackend.reduce_counts`, so the gradients of a mini-batch's micro-batches *sum* to its
full-batch gradient. A backend accumulates them as given and must not rescale them (DeepSpeed's engine,
which divides by its accumulation steps, must be told not to).
"""
from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from importlib import import_module
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator

import torch

from agents.learners.config import warmup_steps
from agents.policies.policy import HFPolicy, PolicyOutput, ValueModel
from agents.rollout.batch import TrainBatch
from agents.training.config import TrainConfig
from rewards import UnknownNameError

if TYPE_CHECKING:
    from agents.learners import Algorithm, BatchCounts

__all__ = [
    "BACKENDS", "TorchBackend", "TorchOptions", "TrainingBackend", "backend_options_class", "build_backend", "lookup_backend",
    "register_backend",
]


class TrainingBackend(ABC):
    """Owns the trainable policy (and critic), the frozen reference and the optimisers.

    Attributes:
        policy: the policy being trained; rollouts sample from it (or from an engine synced to it).
    """

    policy: HFPolicy
    #: The dataclass of the backend's own settings (the run config's ``backend`` group).
    options_class: ClassVar[type]

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


BACKENDS: dict[str, type[TrainingBackend]] = {}
"""Backend name (``run.backend``) -> backend class."""

#: The modules that register the built-in backends besides ``torch``, imported when their name is first looked up.
_BUILT_IN = {"deepspeed": "agents.training.deepspeed_backend"}


def lookup_backend(name: str) -> type[TrainingBackend]:
    """The backend class registered as ``name``; ``UnknownNameError`` (one line, the known names) for another."""
    if name not in BACKENDS and name in _BUILT_IN:
        import_module(_BUILT_IN[name])  # registers itself; its engine (DeepSpeed) loads when built
    try:
        return BACKENDS[name]
    except KeyError:
        raise UnknownNameError("run.backend", name, sorted({*BACKENDS, *_BUILT_IN})) from None


def backend_options_class(name: str) -> type:
    """The options dataclass of backend ``name`` (the run config's ``backend`` group)."""
    return lookup_backend(name).options_class


def register_backend(name: str, *, options: type) -> Callable[[type[TrainingBackend]], type[TrainingBackend]]:
    """Class decorator: make a backend reachable as ``run.backend: name``, its settings the dataclass
    ``options`` (the run config's ``backend`` group, ``--backend.FIELD``)."""

    def register(cls: type[TrainingBackend]) -> type[TrainingBackend]:
        cls.options_class = options
        BACKENDS[name] = cls
        return cls

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


@dataclass
class TorchOptions:
    """The ``torch`` backend has no settings of its own (device and precision are ``run.device``, ``run.dtype``)."""


@register_backend("torch", options=TorchOptions)
class TorchBackend(TrainingBackend):
    """Plain PyTorch on one device: AdamW, gradient-norm clipping, linear warm-up then a constant rate.

    Precision (``run.dtype``): in bf16 the forward passes - rollouts, log-probs, updates, a warm start's -
    run under autocast to bf16 over fp32 trained weights (the optimiser's steps stay exact), and the frozen
    reference is held in bf16; log-probs and losses are fp32 either way.

    What is frozen is not checkpointed: the reference as built (the policy the backend was given, which a
    resume builds again from the run's config) and the policy's frozen parameters (a LoRA base) are
    rebuilt, and the checkpoint keeps their SHA-256 so that a resume from other weights (a model folder
    changed since) is refused. A reference reset after a warm start is saved: nothing else holds it.
    With LoRA adapters on the policy (:attr:`HFPolicy.has_adapters`) the reference is the policy with its
    adapters off (:meth:`HFPolicy.adapters_off`): no copy is kept (``reference`` stays ``None``).

    Args:
        policy: the policy to train (already on its device).
        config: the run's config: the ``optim`` group, ``rollout.temperature`` (log-probs are taken at the
            sampling temperature), ``run.steps`` (a warm-up given as a ratio) and ``run.dtype``.
        critic: a separate value model (PPO without a value head), trained by its own AdamW.
        critic_learning_rate: the critic's learning rate (default: the policy's).
        critic_warmup_steps: training steps of the critic's own linear warm-up.
        with_reference: keep a frozen reference policy for KL terms.
    """

    def __init__(
        self,
        policy: HFPolicy,
        config: TrainConfig,
        *,
        critic: ValueModel | None = None,
        critic_learning_rate: float | None = None,
        critic_warmup_steps: int = 0,
        with_reference: bool = False,
    ) -> None:
        super().__init__()
        self.policy = policy
        self.critic = critic
        self.config = config
        optim = config.optim
        self.dtype = training_dtype(config.run.dtype, self.device)
        self.optimizer = self._adamw(policy.parameters(), optim.learning_rate)
        policy_warmup = warmup_steps(optim.warmup_steps, optim.warmup_ratio, config.run.steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _linear_warmup(policy_warmup))
        self.critic_optimizer = self.critic_scheduler = None
        if critic is not None:
            lr = optim.learning_rate if critic_learning_rate is None else critic_learning_rate
            self.critic_optimizer = self._adamw(critic.parameters(), lr)
            self.critic_scheduler = torch.optim.lr_scheduler.LambdaLR(self.critic_optimizer, _linear_warmup(critic_warmup_steps))
        self.reference: HFPolicy | None = None
        self._supervised: torch.optim.Optimizer | None = None
        self._supervised_schedule: torch.optim.lr_scheduler.LambdaLR | None = None
        self._supervised_resume: dict[str, Any] | None = None  # a checkpointed warm start's optimiser, for the next block
        self._with_reference = with_reference
        self._rebuilt_sha256: str | None = None  # of the weights a checkpoint leaves out (computed once)
        self._reference_as_built = True  # the reference is the policy as built (a resume rebuilds it)
        if with_reference and not policy.has_adapters:
            self._copy_reference()

    @classmethod
    def from_config(cls, config: TrainConfig, policy: HFPolicy, algorithm: Algorithm) -> TorchBackend:
        """A separate critic (PPO without a value head) starts as a copy of the policy's model."""
        critic, options = None, {}
        if algorithm.uses_critic and not algorithm.value_head:
            critic = ValueModel(copy.deepcopy(policy.model)).to(config.run.device)
            algo = config.algorithm
            options = {"critic_learning_rate": algo.critic_lr,
                       "critic_warmup_steps": warmup_steps(algo.critic_warmup_steps, algo.critic_warmup_ratio, config.run.steps)}
        return cls(policy, config, critic=critic, with_reference=algorithm.uses_reference, **options)

    def _adamw(self, params: Any, lr: float) -> torch.optim.AdamW:
        optim = self.config.optim
        return torch.optim.AdamW(_trainable(params), lr=lr, betas=tuple(optim.adam_betas), weight_decay=optim.weight_decay)

    def _precision(self) -> Any:
        """Autocast to bf16 for the block when ``run.dtype`` asks for it (nothing in fp32)."""
        if self.dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device

    @contextmanager
    def generation(self) -> Iterator[None]:
        """Rollouts and evaluations decode in the run's precision (autocast to bf16 when it is bf16)."""
        with self._precision():
            yield

    # -- forward passes --------------------------------------------------------------------------
    def forward(self, batch: TrainBatch, *, with_entropy: bool = False, with_values: bool = False) -> PolicyOutput:
        head_values = with_values and self.critic is None
        with self._precision():
            out = self.policy.forward(
                batch.input_ids, batch.attention_mask, batch.position_ids,
                temperature=self.config.rollout.temperature, with_entropy=with_entropy, with_values=head_values,
                from_column=batch.first_trained_column,
            )
            if with_values and self.critic is not None:
                out = replace(out, values=self.critic.values(batch.input_ids, batch.attention_mask, batch.position_ids))
        return out

    @torch.no_grad()
    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        if not self._with_reference:
            raise RuntimeError("this backend keeps no reference policy (with_reference=False)")
        args = (batch.input_ids, batch.attention_mask, batch.position_ids)
        options = {"temperature": self.config.rollout.temperature, "from_column": batch.first_trained_column}
        if self.reference is not None:
            with self._precision():
                return self.reference.forward(*args, **options).logprobs
        training = self.policy.training  # the reference runs without dropout, as a frozen copy would
        self.policy.eval()
        try:
            with self._precision(), self.policy.adapters_off():
                return self.policy.forward(*args, **options).logprobs
        finally:
            self.policy.train(training)

    def reset_reference(self) -> None:
        if not self._with_reference:
            return
        if self.policy.has_adapters:
            raise RuntimeError("the reference of a policy with LoRA adapters is its base model (adapters off); "
                               "it cannot become the adapted policy")
        self._copy_reference()
        self._reference_as_built = False
        self._rebuilt_sha256 = None

    def _copy_reference(self) -> None:
        """The reference becomes a frozen copy of the policy as it is now (in bf16 when training in bf16:
        it is only ever run under autocast)."""
        self.reference = copy.deepcopy(self.policy)
        if self.dtype != torch.float32:
            self.reference.to(self.dtype)
        self.reference.eval()
        for param in self.reference.parameters():
            param.requires_grad_(False)

    def micro_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        size = self.config.optim.micro_batch_size
        return batch.micro_batches(size if size > 0 else max(len(batch), 1))

    # -- optimisation ----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        if self._supervised is not None:
            norm = self._apply(self.policy.parameters(), self._supervised)
            self._supervised_schedule.step()
        else:
            norm = self._apply(self.policy.parameters(), self.optimizer)
            if self.critic is not None:
                self._apply(self.critic.parameters(), self.critic_optimizer)
        self._run_post_step_hooks()
        return norm

    def finish_step(self) -> None:
        self.scheduler.step()
        if self.critic_scheduler is not None:
            self.critic_scheduler.step()

    @contextmanager
    def supervised(self, learning_rate: float, schedule: Callable[[int], float] | None = None,
                   **adamw: Any) -> Iterator[None]:
        self._supervised = torch.optim.AdamW(_trainable(self.policy.parameters()), lr=learning_rate, **adamw)
        self._supervised_schedule = torch.optim.lr_scheduler.LambdaLR(self._supervised, schedule or (lambda _: 1.0))
        if self._supervised_resume is not None:  # a warm start checkpointed half-way goes on with its moments and schedule
            self._supervised.load_state_dict(self._supervised_resume["optimizer"])
            self._supervised_schedule.load_state_dict(self._supervised_resume["schedule"])
            self._supervised_resume = None
        try:
            with self._precision():  # the warm start's forward passes, in the run's precision
                yield
        finally:
            self._supervised.zero_grad(set_to_none=True)  # no warm-start gradient may leak into the first RL update
            self._supervised = self._supervised_schedule = None

    def _apply(self, params: Any, optimizer: torch.optim.Optimizer) -> float:
        params = _trainable(params)
        limit = self.config.optim.max_grad_norm if self.config.optim.max_grad_norm > 0 else math.inf
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
        """Weights, optimiser and schedule states (what :meth:`save` writes): the policy's trained weights
        and buffers, not its frozen parameters, and the reference only when it is not the one the
        backend was built with (both rebuilt on resume: see the class docstring), with the SHA-256 of
        what is left out."""
        frozen = self._frozen_names()
        state: dict[str, Any] = {
            "policy": {k: v for k, v in self.policy.state_dict().items() if k not in frozen},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rebuilt_sha256": self._rebuilt_digest(),
        }
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
            state["critic_scheduler"] = self.critic_scheduler.state_dict()
        if self.reference is not None and not self._reference_as_built:
            state["reference"] = self.reference.state_dict()
        if self._supervised is not None:  # a checkpoint written during a warm start
            state["supervised"] = {"optimizer": self._supervised.state_dict(), "schedule": self._supervised_schedule.state_dict()}
        elif self._supervised_resume is not None:  # loaded from one and not gone on with yet: kept for the next
            state["supervised"] = self._supervised_resume
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s states; the weights it leaves out must be rebuilt the same
        (``ValueError`` otherwise: a model folder changed since, or a backend built another way)."""
        frozen = self._frozen_names()
        missing, unexpected = self.policy.load_state_dict(state["policy"], strict=False)
        if unexpected or set(missing) - frozen:
            names = [*unexpected, *sorted(set(missing) - frozen)]
            raise ValueError(f"the policy's weights do not match: {len(names)} unexpected or missing, first {names[0]!r}")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
            self.critic_scheduler.load_state_dict(state["critic_scheduler"])
        if "reference" in state:  # reset after a warm start (or written before references were rebuilt)
            if self.reference is None:
                raise ValueError("the checkpoint holds a reference policy and this backend keeps none")
            self.reference.load_state_dict(state["reference"])
            self._reference_as_built, self._rebuilt_sha256 = False, None
        if "rebuilt_sha256" in state and state["rebuilt_sha256"] != self._rebuilt_digest():
            raise ValueError("the weights it leaves out to rebuild (the frozen parameters, the reference as built from "
                             "model.name) differ from the run's: the model changed since it was written")
        self._supervised_resume = state.get("supervised")

    def _frozen_names(self) -> set[str]:
        """The policy's frozen parameters, by state-dict key (tied ones under each of their names)."""
        return {name for name, p in self.policy.named_parameters(remove_duplicate=False) if not p.requires_grad}

    def _rebuilt_digest(self) -> str:
        """The SHA-256 of what a checkpoint leaves out: the policy's frozen parameters and the reference
        as built (computed once: neither changes until :meth:`reset_reference`)."""
        if self._rebuilt_sha256 is None:
            from agents.training.checkpoint import tensors_sha256

            named = [(f"policy.{n}", p) for n, p in self.policy.named_parameters() if not p.requires_grad]
            if self.reference is not None and self._reference_as_built:
                named += [(f"reference.{n}", p) for n, p in self.reference.named_parameters()]
            self._rebuilt_sha256 = tensors_sha256(named)
        return self._rebuilt_sha256

    def save(self, directory: Path) -> None:
        from agents.training.checkpoint import save_checkpoint

        save_checkpoint(Path(directory) / BACKEND_FILE, self.state_dict())

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote (the file's digest checked first). The optimisers' settings -
        learning rates, betas, weight decay - stay this backend's, from its config, and the current rates
        follow from them and the restored schedule position: with the run's own config they are the saved
        ones, and a setting deliberately changed on resume takes effect. A checkpoint of another model is
        one ``ValueError`` line naming the file and the first mismatch."""
        from agents.training.checkpoint import load_checkpoint

        file = Path(directory) / BACKEND_FILE
        state = load_checkpoint(file, map_location=self.device)
        settings = [_optimizer_settings(optimizer, scheduler) for optimizer, scheduler in self._optimizers()]
        try:
            self.load_state_dict(state)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ValueError(f"checkpoint {file} does not fit this model: {_first_problem(exc)}") from None
        for (optimizer, scheduler), saved in zip(self._optimizers(), settings):
            _restore_optimizer_settings(optimizer, scheduler, saved)

    def _optimizers(self) -> list[tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]]:
        pairs = [(self.optimizer, self.scheduler)]
        if self.critic_optimizer is not None:
            pairs.append((self.critic_optimizer, self.critic_scheduler))
        return pairs


#: The file :class:`TorchBackend` writes into a checkpoint folder.
BACKEND_FILE = "backend.pt"


def _optimizer_settings(optimizer: torch.optim.Optimizer, scheduler: Any) -> tuple[list[dict[str, Any]], list[float]]:
    """An optimiser's settings per parameter group (all but its parameters and rates) and its schedule's base rates."""
    groups = [{k: v for k, v in group.items() if k not in ("params", "lr", "initial_lr")} for group in optimizer.param_groups]
    return groups, list(scheduler.base_lrs)


def _restore_optimizer_settings(optimizer: torch.optim.Optimizer, scheduler: Any,
                                saved: tuple[list[dict[str, Any]], list[float]]) -> None:
    """Put back settings taken by :func:`_optimizer_settings` over a loaded state, and set each group's rate
    as the schedule computes it at its restored position (the loaded rate when nothing changed)."""
    groups, base_lrs = saved
    scheduler.base_lrs = list(base_lrs)
    for group, settings, base, factor in zip(optimizer.param_groups, groups, base_lrs, scheduler.lr_lambdas):
        group.update(settings)
        group["initial_lr"] = base
        group["lr"] = base * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def _first_problem(exc: BaseException) -> str:
    """The first line of torch's (multi-line) state-dict mismatch message, and how many more there are."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Error(s) in loading state_dict"):
        lines = lines[1:]
    first = " ".join(lines[0].split()) if lines else type(exc).__name__
    if len(first) > 300:
        first = first[:297] + "..."
    return first + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else "")


def _trainable(params: Any) -> list[torch.nn.Parameter]:
    """The parameters an optimiser updates: those that require grad (a LoRA base's are frozen)."""
    return [p for p in params if p.requires_grad]


def _linear_warmup(steps: int) -> Callable[[int], float]:
    """A learning-rate factor rising linearly over ``steps`` (then 1)."""
    return lambda done: 1.0 if steps <= 0 else min(1.0, (done + 1) / steps)
