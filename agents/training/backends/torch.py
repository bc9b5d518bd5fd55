"""Plain PyTorch on one device as a training backend (``run.backend: torch``, the default)."""
from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from agents.learners.config import warmup_steps
from agents.policies.policy import HFPolicy, PolicyOutput, ValueModel
from agents.rollout.batch import TrainBatch
from agents.training.backends.base import TrainingBackend, register_backend, split_micro_batches, training_dtype
from agents.training.backends.models import frozen_copy, trainable, trained_models
from agents.training.backends.schedules import optimizer_settings, restore_optimizer_settings, warmup_schedule
from agents.training.backends.settings import BackendSettings
from agents.training.config import TrainConfig

if TYPE_CHECKING:
    from agents.learners import Algorithm

__all__ = ["BACKEND_FILE", "TorchBackend", "TorchOptions"]


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

    A subclass may keep this optimisation over parameters laid out another way; FSDP2's backend
    (:class:`~agents.training.backends.fsdp.FSDPBackend`, over sharded parameters) does, and overrides,
    besides public methods, exactly these hooks:

    * :meth:`_apply`: clip and apply one optimiser's gradients, returning the norm before clipping
      (sharded: the global norm, reduced over the shards);
    * :meth:`_copy_reference`: make the reference the policy as it is now (sharded: shard by shard);
    * :meth:`_held`: the part of a tensor this process holds (sharded: its shard), what the checkpoint's
      digest of rebuilt weights reads;
    * :meth:`_rebuilt_digest`: that digest, memoised in ``_rebuilt_sha256`` (sharded: shards settled first).

    It also reads, and may set after ``__init__``, this state: ``reference`` and ``_with_reference`` (a
    sharded reference is built before the policy is sharded), ``_supervised`` (not ``None`` within
    :meth:`supervised`), :meth:`_precision` (the autocast block) and :meth:`_restore` (a loaded state,
    keeping the optimiser settings; a subclass's :meth:`load` reads its own file and calls it).

    Args:
        policy: the policy to train (already on its device).
        settings: what it reads of the run's config (:class:`~agents.training.backends.settings.BackendSettings`:
            the ``optim`` group, the sampling temperature, the precision, the run's steps).
        critic: a separate value model (PPO without a value head), trained by its own AdamW.
        critic_learning_rate: the critic's learning rate (default: the policy's).
        critic_warmup_steps: training steps of the critic's own linear warm-up.
        with_reference: keep a frozen reference policy for KL terms.
    """

    frozen_base_in_run_dtype = True

    def __init__(
        self,
        policy: HFPolicy,
        settings: BackendSettings,
        *,
        critic: ValueModel | None = None,
        critic_learning_rate: float | None = None,
        critic_warmup_steps: int = 0,
        with_reference: bool = False,
    ) -> None:
        super().__init__()
        self.policy = policy
        self.critic = critic
        self.settings = settings
        optim = settings.optim
        self.dtype = training_dtype(settings.dtype, self.device)
        self.optimizer = self._adamw(policy.parameters(), optim.learning_rate)
        policy_warmup = warmup_steps(optim.warmup_steps, optim.warmup_ratio, settings.steps)
        self.scheduler = warmup_schedule(self.optimizer, policy_warmup)
        self.critic_optimizer = self.critic_scheduler = None
        if critic is not None:
            lr = optim.learning_rate if critic_learning_rate is None else critic_learning_rate
            self.critic_optimizer = self._adamw(critic.parameters(), lr)
            self.critic_scheduler = warmup_schedule(self.critic_optimizer, critic_warmup_steps)
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
        """A separate critic (PPO without a value head) starts as a copy of the policy's model
        (:func:`~agents.training.backends.models.trained_models`)."""
        return cls(policy, BackendSettings.of(config), **trained_models(config, policy, algorithm).options())

    def _adamw(self, params: Any, lr: float) -> torch.optim.AdamW:
        optim = self.settings.optim
        return torch.optim.AdamW(trainable(params), lr=lr, betas=tuple(optim.adam_betas), weight_decay=optim.weight_decay)

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
                temperature=self.settings.temperature, with_entropy=with_entropy, with_values=head_values,
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
        options = {"temperature": self.settings.temperature, "from_column": batch.first_trained_column}
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
        self.reference = frozen_copy(self.policy, self.dtype)

    def micro_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        return split_micro_batches(batch, self.settings.optim.micro_batch_size)

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
        self._supervised = torch.optim.AdamW(trainable(self.policy.parameters()), lr=learning_rate, **adamw)
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
        params = trainable(params)
        limit = self.settings.optim.max_grad_norm if self.settings.optim.max_grad_norm > 0 else math.inf
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

            named = [(f"policy.{n}", self._held(p)) for n, p in self.policy.named_parameters() if not p.requires_grad]
            if self.reference is not None and self._reference_as_built:
                named += [(f"reference.{n}", self._held(p)) for n, p in self.reference.named_parameters()]
            self._rebuilt_sha256 = tensors_sha256(named)
        return self._rebuilt_sha256

    def _held(self, tensor: torch.Tensor) -> torch.Tensor:
        """The part of ``tensor`` this process holds: all of it on one device (a sharded subclass: its shard)."""
        return tensor

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
        self._restore(file, load_checkpoint(file, map_location=self.device))

    def _restore(self, file: Path, state: dict[str, Any]) -> None:
        """:meth:`load_state_dict` of ``state``, read from ``file``, keeping this backend's optimiser settings
        (see :meth:`load`); a mismatch is one ``ValueError`` line naming ``file``."""
        settings = [optimizer_settings(optimizer, scheduler) for optimizer, scheduler in self._optimizers()]
        try:
            self.load_state_dict(state)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ValueError(f"checkpoint {file} does not fit this model: {_first_problem(exc)}") from None
        for (optimizer, scheduler), saved in zip(self._optimizers(), settings):
            restore_optimizer_settings(optimizer, scheduler, saved)

    def _optimizers(self) -> list[tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]]:
        pairs = [(self.optimizer, self.scheduler)]
        if self.critic_optimizer is not None:
            pairs.append((self.critic_optimizer, self.critic_scheduler))
        return pairs


#: The file :class:`TorchBackend` writes into a checkpoint folder.
BACKEND_FILE = "backend.pt"


def _first_problem(exc: BaseException) -> str:
    """The first line of torch's (multi-line) state-dict mismatch message, and how many more there are."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Error(s) in loading state_dict"):
        lines = lines[1:]
    first = " ".join(lines[0].split()) if lines else type(exc).__name__
    if len(first) > 300:
        first = first[:297] + "..."
    return first + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else "")
