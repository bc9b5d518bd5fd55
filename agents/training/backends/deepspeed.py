"""DeepSpeed ZeRO-2/3 as a training backend (``run.backend: deepspeed``), for data-parallel training.

Launch one process per device::

    torchrun --nproc_per_node 2 -m agents.train --run.backend deepspeed --backend.zero_stage 3 ...
    deepspeed --num_gpus 2 --module agents.train --run.backend deepspeed ...

On several machines (the same command on each; ``MASTER`` is the first machine's address)::

    torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint MASTER:29500 --rdzv_id run1 \
        -m agents.train --run.backend deepspeed ...
    deepspeed --hostfile hostfile --master_addr MASTER --module agents.train --run.backend deepspeed ...
    # hostfile: one line per machine, "host1 slots=8"

Every rank searches: a retrieval server (``python -m search_env.server``) runs once, on any machine the
ranks reach, and each rank's environment points its ``RemoteSource`` at it. On a CPU the ranks talk
over gloo and train in fp32.

The maths of a step stay those of one process:

* every rank rolls out its own share of ``rollout.questions_per_step`` (whole question groups; the trainer
  splits the questions, see :attr:`TrainingBackend.world_size`), and the update's denominators are the
  counts of the whole batch over all ranks (:meth:`DeepSpeedBackend.reduce_counts`), as are the batch-wide
  statistics of the learners (REINFORCE++'s and PPO's whitening read :meth:`all_reduce_sum`);
* each micro-batch's loss is already divided by those global counts, so the engine must neither divide it
  by its accumulation steps (``backward(..., scale_wrt_gas=False)``, and ``managed_gradient_accumulation``
  off: :meth:`step` is the accumulation boundary) nor average it over ranks: the loss is multiplied by the
  world size, which the engine's data-parallel mean divides back out, so the gradient is the sum over
  ranks of the shares - the full batch's gradient;
* DAPO's dynamic sampling drops each rank's own all-equal groups, so ranks may hold different numbers of
  rows (none, even): every rank still runs as many optimiser steps and micro-batch passes as the rank with
  the most, the missing ones idle passes of zero loss (:mod:`agents.training.update`), because the
  engine's gathers and reductions are collectives; the trainer's refill rounds run on every rank while
  any is short of groups;
* the learning-rate schedule counts training steps (:meth:`finish_step`), as :class:`TorchBackend`'s does.

The DeepSpeed config is derived from the run's (:func:`deepspeed_setup.deepspeed_config`): micro batch, clipping, ZeRO
stage, precision (bf16 on a GPU that has it, fp32 on a CPU); ``backend.config`` names a JSON file
whose keys override the derived ones (nested groups merged key by key). No ``"auto"`` may remain.

Under ZeRO-3 the parameters are sharded: :meth:`generation` gathers them whole for the HF sampler's
decoding (with the engine's per-module hooks lifted meanwhile, so that decoding, whose length differs
from rank to rank, runs no collective) and shards them again after. The frozen reference is sharded too
(a ZeRO-3 engine without optimiser); under ZeRO-2 it is a whole copy (stage 0). Without mixed precision
(fp32 on a CPU) the engine's master weights are the parameter partition itself, not a copy of it
(:func:`deepspeed_setup.share_master_weights`): a rank holds its parameters (ZeRO-2: whole; ZeRO-3: its shard) and its
shard of the AdamW moments, nothing more.

PPO's separate critic (``algorithm.critic: separate``) is a second engine at the same ZeRO stage, with its
own AdamW, learning rate and warm-up (``algorithm.critic_lr``, ``critic_warmup_*``), as
:class:`TorchBackend`'s critic; it only runs forward and backward passes (nothing gathers it). The
learner's one loss reaches it through a leaf copy of its values, whose gradient :meth:`backward` passes on
to the critic's engine, so that each engine's backward covers its own graph and reduces its own gradients.

A warm start (``warm_start.steps``, ``copy_steps``) runs whole on every rank, on the same demonstrations
(see :meth:`DeepSpeedBackend.supervised`): its gradient is the batch's on every rank, so all ranks end
it with the weights one process gets, and a step whose loss differs between ranks is refused.

Checkpoints go through the engine's own ``save_checkpoint``/``load_checkpoint`` (one file per rank for
the sharded states) into the backend's folder, with the schedule's position in its client state; a
separate critic's engine saves under its own tag (``critic/``), with its schedule.

With LoRA adapters (``model.lora_rank``) only the adapters are in the optimiser, the reference is the
policy's own base with its adapters off (no copy, no second engine), and the engine's checkpoints leave
the frozen base out (it is loaded again from ``model.name``).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from agents.learners.config import warmup_steps
from agents.policies.policy import HFPolicy, PolicyOutput, ValueModel
from agents.rollout.batch import TrainBatch
from agents.training.backends.base import register_backend, split_micro_batches
from agents.training.backends.deepspeed_setup import deepspeed_config, import_deepspeed, saved_ranks, share_master_weights
from agents.training.backends.distributed import DataParallelBackend, EveryRankError, init_process_group
from agents.training.backends.models import frozen_copy, trainable
from agents.training.backends.schedules import warmup_schedule
from agents.training.backends.settings import BackendSettings

__all__ = ["DeepSpeedBackend", "DeepSpeedOptions"]

#: The tag of the engine's checkpoint inside the backend's folder.
ENGINE_TAG = "engine"
#: The tag of the separate critic's engine checkpoint (PPO with ``algorithm.critic: separate``).
CRITIC_TAG = "critic"


@dataclass
class DeepSpeedOptions:
    """Options of ``run.backend: deepspeed``.

    Attributes:
        zero_stage: the ZeRO stage: 2 (optimiser states and gradients sharded) or 3 (parameters too).
        config: a JSON file whose keys override the engine config derived from the run's
            (:func:`deepspeed_setup.deepspeed_config`; nested groups merged key by key).
    """

    zero_stage: int = 2
    config: str | None = None

    def __post_init__(self) -> None:
        if self.zero_stage not in (2, 3):
            raise ValueError(f"backend.zero_stage must be 2 or 3, got {self.zero_stage}")


@register_backend("deepspeed", options=DeepSpeedOptions)
class DeepSpeedBackend(DataParallelBackend):
    """The policy (and a value head) in a DeepSpeed ZeRO engine, one process per device (module docstring);
    a separate critic in an engine of its own.

    Args:
        policy: the policy to train, not yet sharded.
        settings: what it reads of the run's config (its ``options`` a :class:`DeepSpeedOptions`; the ``optim``
            group, the precision, the collectives' timeout ...).
        critic: a separate value model (PPO without a value head), not yet sharded; trained by its own
            engine and AdamW, at the policy's ZeRO stage, as :class:`TorchBackend` trains its critic.
        critic_learning_rate: the critic's learning rate (default: the policy's).
        critic_warmup_steps: training steps of the critic's own linear warm-up.
        with_reference: keep a frozen copy of the policy for KL terms.
    """

    def __init__(self, policy: HFPolicy, settings: BackendSettings, *, critic: ValueModel | None = None,
                 critic_learning_rate: float | None = None, critic_warmup_steps: int = 0,
                 with_reference: bool = False) -> None:
        super().__init__()
        deepspeed = import_deepspeed()
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        on_gpu = accelerator.device_name() not in ("cpu",)
        init_process_group(on_gpu, lambda name, timeout: deepspeed.init_distributed(
            dist_backend=name, auto_mpi_discovery=False, verbose=False, timeout=timeout), timeout_s=settings.collective_timeout_s)
        self._join(torch.device(accelerator.current_device_name()) if on_gpu else torch.device("cpu"))
        self.settings = settings
        self.stage = settings.options.zero_stage
        if on_gpu and self.stage not in (2, 3):
            raise ValueError(f"backend.zero_stage {self.stage} is not one this backend runs (2 or 3)")
        bf16_ok = on_gpu and accelerator.is_bf16_supported()
        if settings.dtype == "bf16" and not bf16_ok:
            raise ValueError("run.dtype bf16 with run.backend deepspeed needs a GPU that supports bf16 (on a CPU the engine trains in fp32)")
        hidden = getattr(getattr(policy.model, "config", None), "hidden_size", None)
        self.ds_config = deepspeed_config(settings, self._world, on_gpu=on_gpu, bf16_ok=bf16_ok, hidden_size=hidden)
        policy.to(self._device)
        # Before the policy's weights are sharded; a LoRA policy's reference is its base (adapters off), no copy.
        reference = frozen_copy(policy) if with_reference and not policy.has_adapters else None
        optim = settings.optim
        self.engine, self.client_optimizer, self.scheduler = self._trained_engine(
            policy, optim.learning_rate, warmup_steps(optim.warmup_steps, optim.warmup_ratio, settings.steps))
        self.optimizer = self.engine.optimizer
        self.policy = policy
        self.critic = critic
        self.critic_engine: Any = None
        self.critic_optimizer: torch.optim.AdamW | None = None
        self.critic_scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if critic is not None:
            critic.to(self._device)
            self.critic_engine, self.critic_optimizer, self.critic_scheduler = self._trained_engine(
                critic, optim.learning_rate if critic_learning_rate is None else critic_learning_rate, critic_warmup_steps)
        # (the critic's values, the leaf copy the learner's loss saw) of the last forward under grad: see backward
        self._critic_pending: tuple[torch.Tensor, torch.Tensor] | None = None
        self.reference: Any = None
        self._with_reference = with_reference
        if reference is not None:
            self.reference = self._frozen(reference)
        self._supervised: dict[str, Any] | None = None
        self._supervised_resume_steps = 0  # a checkpointed warm start's schedule position, for the next block


    def _trained_engine(self, model: torch.nn.Module, learning_rate: float,
                        warmup: int) -> tuple[Any, torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
        """``model`` in a ZeRO engine with an AdamW of the run's settings at ``learning_rate`` and a linear
        warm-up over ``warmup`` training steps: (engine, the AdamW the engine steps, its schedule)."""
        optim = self.settings.optim
        optimizer = torch.optim.AdamW(trainable(model.parameters()), lr=learning_rate, betas=tuple(optim.adam_betas),
                                      weight_decay=optim.weight_decay)
        scheduler = warmup_schedule(optimizer, warmup)
        try:
            engine, *_ = import_deepspeed().initialize(model=model, optimizer=optimizer, config=self.ds_config)
        except (AssertionError, NotImplementedError) as exc:
            raise ValueError(f"DeepSpeed cannot run ZeRO stage {self.stage} on {self._device.type}: "
                             f"{' '.join(str(exc).split()) or type(exc).__name__}") from None
        share_master_weights(engine.optimizer)
        return engine, optimizer, scheduler

    def _frozen(self, model: HFPolicy) -> Any:
        """The frozen copy ``model`` for reference log-probs: sharded (a ZeRO-3 engine without optimiser)
        under ZeRO-3, whole (stage 0) otherwise."""
        if self.stage < 3:
            return model
        deepspeed = import_deepspeed()
        ref_config = {k: v for k, v in self.ds_config.items() if k not in ("gradient_clipping",)}
        ref_config["zero_optimization"] = {"stage": 3, **{k: v for k, v in self.ds_config["zero_optimization"].items()
                                                          if k.startswith("stage3_")}}
        engine, *_ = deepspeed.initialize(model=model, config=ref_config)
        engine.eval()
        return engine

    @contextmanager
    def generation(self) -> Iterator[None]:
        """The policy's weights whole for decoding (ZeRO-3: gathered on every rank, the engine's module
        hooks lifted, then sharded again); a collective every rank enters."""
        if self.stage < 3:
            yield
            return
        from deepspeed.runtime.zero.partition_parameters import GatheredParameters

        offload = self.engine.optimizer.parameter_offload
        with GatheredParameters(list(self.policy.parameters())):
            for param in self.policy.parameters():
                param.ds_active_sub_modules.clear()
            for hook in [*offload.forward_hooks, *offload.backward_hooks]:
                hook.remove()
            offload.forward_hooks, offload.backward_hooks = [], []
            try:
                yield
            finally:
                offload._register_deepspeed_module(offload.module)

    @contextmanager
    def scoring(self) -> Iterator[None]:
        """Nothing to gather beforehand: under ZeRO-3 the engine's module hooks gather each module's parameters
        for its forward pass and partition them again after it; ZeRO-2 holds them whole. The policy computes
        in the engine's precision either way (its parameters' dtype)."""
        yield

    def rollout_weights(self, *, adapters: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """ZeRO-3: each partitioned parameter gathered whole on every rank, yielded, and partitioned again
        before the next one is gathered, so that beyond its shards a rank holds one parameter whole at a time
        (what it yielded stays valid: partitioning drops the parameter's reference to the gathered tensor, not
        the tensor); a collective every rank runs to the end. Within :meth:`generation` the parameters are
        whole already and are yielded as they are, with no collective (rank 0 alone may read them there, as
        an evaluation does). ZeRO-2 holds them whole."""
        if self.stage < 3:
            yield from super().rollout_weights(adapters=adapters)
            return
        from deepspeed.runtime.zero.partition_parameters import GatheredParameters, ZeroParamStatus

        for name, tensor in self.policy.named_weights(adapters=adapters):
            partitioned = getattr(tensor, "ds_status", None) == ZeroParamStatus.NOT_AVAILABLE  # buffers have none
            with GatheredParameters([tensor], enabled=partitioned):
                yield name, tensor.detach()

    # -- forward passes --------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._device

    def forward(self, batch: TrainBatch, *, with_entropy: bool = False, with_values: bool = False) -> PolicyOutput:
        """The policy engine's outputs; a separate critic's values come from its own engine, and under grad as
        a leaf copy whose gradient :meth:`backward` hands to that engine (each engine's backward then covers
        its own graph only, so each reduces exactly its own gradients)."""
        head_values = with_values and self.critic_engine is None
        out = self.engine(batch.input_ids, batch.attention_mask, batch.position_ids,
                          temperature=self.settings.temperature, with_entropy=with_entropy,
                          with_values=head_values, from_column=batch.first_trained_column)
        if with_values and self.critic_engine is not None:
            values = self.critic_engine(batch.input_ids, batch.attention_mask, batch.position_ids)
            if values.requires_grad:
                leaf = values.detach().requires_grad_()
                self._critic_pending = (values, leaf)
                values = leaf
            out = replace(out, values=values)
        return out

    @torch.no_grad()
    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        if not self._with_reference:
            raise RuntimeError("this backend keeps no reference policy (no KL term)")
        args = (batch.input_ids, batch.attention_mask, batch.position_ids)
        options = {"temperature": self.settings.temperature, "from_column": batch.first_trained_column}
        if self.reference is not None:
            return self.reference(*args, **options).logprobs
        training = self.policy.training  # a LoRA policy's base, without dropout as a frozen copy would run
        self.engine.eval()
        try:
            with self.policy.adapters_off():
                return self.engine(*args, **options).logprobs
        finally:
            self.engine.train(training)

    def reset_reference(self) -> None:
        if self._with_reference and self.policy.has_adapters:
            raise RuntimeError("the reference of a policy with LoRA adapters is its base model (adapters off); "
                               "it cannot become the adapted policy")
        if self.reference is None:
            return
        if self.stage < 3:
            self.reference.load_state_dict(self.policy.state_dict())
            return
        from deepspeed.runtime.zero.partition_parameters import GatheredParameters

        ref_module = self.reference.module
        with GatheredParameters(list(self.policy.parameters())), \
                GatheredParameters(list(ref_module.parameters()), modifier_rank=0), torch.no_grad():
            for mine, theirs in zip(ref_module.parameters(), self.policy.parameters()):
                mine.data.copy_(theirs.data)

    def micro_batches(self, batch: TrainBatch) -> list[TrainBatch]:
        return split_micro_batches(batch, self.settings.optim.micro_batch_size)

    # -- optimisation ----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        # The loss is this rank's share of the global batch's loss: the engine's data-parallel mean must
        # become a sum (x world size) and its accumulation scaling is off. A warm start's loss is the whole
        # batch's on every rank (see supervised): the mean of the ranks' equal gradients is its gradient.
        supervised = self._supervised
        if supervised is not None:
            supervised["loss"] += float(loss.detach())
            # The warm start calls the policy's module, not the engine, whose forward is where ZeRO-3 counts
            # micro-batches: uncounted, every micro-batch's gradient would replace the one before it.
            self.engine.optimizer.clear_backward_seen_flag()
        self.engine.backward(loss * self._world if supervised is None else loss, scale_wrt_gas=False)
        pending, self._critic_pending = self._critic_pending, None
        if pending is not None:  # the critic's part: d(loss x world)/d(values), carried into its own graph
            values, leaf = pending
            grad = leaf.grad if leaf.grad is not None else torch.zeros_like(values)
            self.critic_engine.backward((values * grad).sum(), scale_wrt_gas=False)

    def step(self) -> float:
        supervised = self._supervised
        if supervised is not None:  # a warm start's own rate schedule on the same engine
            self._check_same_on_every_rank(supervised["loss"])
            supervised["loss"] = 0.0
            factor = supervised["schedule"](supervised["steps"])
            for group in self.client_optimizer.param_groups:
                group["lr"] = supervised["lr"] * factor
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        norm = float(norm) if norm is not None else 0.0
        if supervised is not None:
            supervised["steps"] += 1
        elif self.critic_engine is not None:
            self.critic_engine.step()
        self._run_post_step_hooks()
        return norm

    def finish_step(self) -> None:
        self.scheduler.step()
        if self.critic_scheduler is not None:
            self.critic_scheduler.step()

    @contextmanager
    def supervised(self, learning_rate: float, schedule: Callable[[int], float] | None = None,
                   **adamw: Any) -> Iterator[None]:
        """The warm start's steps on the run's engine at ``learning_rate`` x ``schedule``, with the other
        settings of a fresh ``AdamW(lr, **adamw)`` (those :class:`TorchBackend`'s warm start gets); its AdamW
        moments are the run's own optimiser's (a sharded engine has one optimiser), so they are cleared
        after the block, and the run's rates and settings are put back.

        With several ranks, every rank runs the whole warm start on the same demonstrations (it is
        supervised and cheap, and needs no rank to hold the whole model's optimiser): each backward's
        loss is the whole batch's, the engine's mean over ranks of their equal gradients is the batch's
        gradient, and all ranks start RL from the weights one process gets. A step whose loss differs
        between ranks (they built different demonstrations) is one ``ValueError`` line."""
        settings = {key: value for key, value in torch.optim.AdamW([torch.zeros(1)], lr=learning_rate, **adamw).defaults.items()
                    if key in ("betas", "eps", "weight_decay", "amsgrad")}
        saved = [(group["lr"], dict(group)) for group in self.client_optimizer.param_groups]
        for group in self.client_optimizer.param_groups:
            group.update(settings)
        # A block after loading a checkpoint written inside one goes on with its schedule (the engine's
        # checkpoint held the moments).
        steps, self._supervised_resume_steps = self._supervised_resume_steps, 0
        self._supervised = {"lr": learning_rate, "schedule": schedule or (lambda _: 1.0), "steps": steps, "loss": 0.0}
        try:
            yield
        finally:
            self._supervised = None
            for group, (lr, before) in zip(self.client_optimizer.param_groups, saved):
                group.update({"lr": lr, **{key: before[key] for key in settings}})
            self.client_optimizer.state.clear()

    def train(self) -> None:
        self.engine.train()
        if self.critic_engine is not None:
            self.critic_engine.train()

    def eval(self) -> None:
        self.engine.eval()
        if self.critic_engine is not None:
            self.critic_engine.eval()

    @property
    def learning_rate(self) -> float:
        return float(self.client_optimizer.param_groups[0]["lr"])

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """The engine's checkpoint (weights, optimiser shards: one file per rank) and the schedule's
        position; a collective every rank enters. The reference is saved only when a warm start made
        it differ from what the run's start rebuilds (it is then the policy at the warm start's end)."""
        client = {"scheduler": self.scheduler.state_dict(), "world_size": self._world, "zero_stage": self.stage,
                  "supervised_steps": self._supervised_resume_steps if self._supervised is None else self._supervised["steps"]}
        # A LoRA policy's frozen base is loaded again from model.name: the engine saves the adapters only.
        self.engine.save_checkpoint(str(directory), tag=ENGINE_TAG, client_state=client, save_latest=False,
                                    exclude_frozen_parameters=self.policy.has_adapters)
        if self.critic_engine is not None:
            self.critic_engine.save_checkpoint(str(directory), tag=CRITIC_TAG, save_latest=False,
                                               client_state={"scheduler": self.critic_scheduler.state_dict()})
        if self.reference is not None and self.settings.warm_starts:
            if self.stage < 3:
                if self._rank == 0:
                    torch.save(self.reference.state_dict(), Path(directory) / "reference.pt")
            else:
                self.reference.save_checkpoint(str(directory), tag="reference", save_latest=False)
        self.barrier()

    def load(self, directory: Path) -> None:
        folder = Path(directory)
        if not (folder / ENGINE_TAG).is_dir():
            raise ValueError(f"checkpoint folder {folder} holds no DeepSpeed engine checkpoint ({ENGINE_TAG}/): "
                             "it was written by another backend")
        written = saved_ranks(folder / ENGINE_TAG)  # before the engine reads anything: its own errors come per rank
        if written and written != self._world:
            raise EveryRankError(f"checkpoint {folder} was written by {written} ranks; this run has {self._world}: "
                                 f"resume it with {written} ranks (torchrun --nproc_per_node {written})")
        _, client = self.engine.load_checkpoint(str(folder), tag=ENGINE_TAG, load_module_strict=not self.policy.has_adapters)
        if client is None:
            raise ValueError(f"DeepSpeed could not load the checkpoint in {folder}")
        if client.get("world_size") != self._world or client.get("zero_stage") != self.stage:
            raise ValueError(f"checkpoint {folder} was written by {client.get('world_size')} ranks under ZeRO-"
                             f"{client.get('zero_stage')}; this run has {self._world} under ZeRO-{self.stage}")
        self.scheduler.load_state_dict(client["scheduler"])
        self._supervised_resume_steps = client.get("supervised_steps") or 0
        for group, factor in zip(self.client_optimizer.param_groups, self.scheduler.lr_lambdas):
            group["lr"] = self.scheduler.base_lrs[0] * factor(self.scheduler.last_epoch)
        if self.critic_engine is not None:
            if not (folder / CRITIC_TAG).is_dir():
                raise ValueError(f"checkpoint folder {folder} holds no critic ({CRITIC_TAG}/): it was written by a run "
                                 "without a separate critic")
            _, critic_client = self.critic_engine.load_checkpoint(str(folder), tag=CRITIC_TAG)
            self.critic_scheduler.load_state_dict(critic_client["scheduler"])
            for group, factor in zip(self.critic_optimizer.param_groups, self.critic_scheduler.lr_lambdas):
                group["lr"] = self.critic_scheduler.base_lrs[0] * factor(self.critic_scheduler.last_epoch)
        if self.reference is not None:
            if (folder / "reference.pt").is_file():
                self.reference.load_state_dict(torch.load(folder / "reference.pt", map_location=self._device, weights_only=True))
            elif (folder / "reference").is_dir():
                self.reference.load_checkpoint(str(folder), tag="reference", load_optimizer_states=False,
                                               load_lr_scheduler_states=False)
