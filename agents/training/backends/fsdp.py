"""PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) as a training backend (``run.backend: fsdp``),
for data-parallel training with every parameter, gradient and AdamW moment sharded over the ranks.

Launch one process per device, as for DeepSpeed::

    torchrun --nproc_per_node 2 -m agents.train --run.backend fsdp ...

Each transformer layer (the model's longest list of like blocks; the whole model when it has none) is
one FSDP unit, all-gathered for its forward and backward passes and sharded again after them
(``backend.reshard_after_forward: false`` keeps the layers whole from forward to backward: faster, more
memory); the rest of the model (embeddings, final norm, LM head) is the root unit, and a value head a unit
of its own. On a CPU the ranks talk over gloo; on GPUs over NCCL, one GPU per rank (``LOCAL_RANK``).

Everything else is :class:`~agents.training.backends.torch.TorchBackend`'s, over sharded (DTensor)
parameters: AdamW, precision (autocast over fp32 weights), schedules, the warm start's fresh optimiser,
PPO's separate critic (sharded the same way, with its own AdamW), LoRA (only the adapters in the
optimiser; the reference is the base with adapters off). What differs:

* the step keeps the maths of one process, as the DeepSpeed backend does: each micro-batch's loss is
  already divided by the global batch's counts, and FSDP averages gradients over the ranks, so the loss
  is multiplied by the world size (the sum over ranks of their shares is the full batch's gradient); a
  warm start runs whole on every rank, on the same demonstrations, so there the mean is the batch's
  gradient, and a step whose loss differs between ranks is refused; gradient clipping reads the global
  norm (gathered from the shards), the same on every rank;
* :meth:`FSDPBackend.generation` all-gathers every unit once and keeps it whole for the block (no
  collective while decoding, whose length differs from rank to rank, nor in a state dict read there);
* the frozen reference is sharded like the policy;
* a checkpoint is one file per rank (its shards, their AdamW moments, the schedules), and a resume with
  another number of ranks is refused in one line.

A command that uses this backend ends through :func:`agents.training.rank_exit.run_main` (``agents.train``
does), or gloo's threads may abort the ranks as they exit.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from agents.policies.policy import HFPolicy, ValueModel
from agents.training.backends.base import register_backend, training_dtype
from agents.training.backends.distributed import DataParallelBackend, EveryRankError, init_process_group
from agents.training.backends.models import frozen_copy, trainable
from agents.training.backends.settings import BackendSettings
from agents.training.backends.torch import TorchBackend
from agents.training.devices import resolve_device

__all__ = ["FSDPBackend", "FSDPOptions", "decoder_layers", "rank_file"]


@dataclass
class FSDPOptions:
    """Options of ``run.backend: fsdp``.

    Attributes:
        reshard_after_forward: shard each layer again after its forward pass and gather it once more for
            the backward pass (least memory); ``false`` keeps it whole in between (one all-gather fewer
            per layer and micro-batch).
    """

    reshard_after_forward: bool = True


def rank_file(rank: int) -> str:
    """The name of rank ``rank``'s file in a checkpoint folder."""
    return f"backend-rank{rank}.pt"


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's transformer layers: its ``ModuleList`` of modules all of one class that holds the most
    parameters (a decoder's ``layers``, GPT-2's ``h``); empty when it has none."""
    best: list[nn.Module] = []
    most = 0
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) and len({type(child) for child in module}) == 1:
            size = sum(p.numel() for p in module.parameters())
            if size > most:
                best, most = list(module), size
    return best


@register_backend("fsdp", options=FSDPOptions)
class FSDPBackend(DataParallelBackend, TorchBackend):
    """The policy (and a separate critic, and the reference) sharded by FSDP2 over the ranks, one process per
    device (module docstring); :class:`TorchBackend`'s optimisation on the shards.

    Args:
        policy: the policy to train, not yet sharded (sharded in place: it stays the object the trainer samples from).
        settings: what it reads of the run's config (its ``options`` an :class:`FSDPOptions`; the ``optim``
            group, the device, the collectives' timeout ...).
        critic: a separate value model (PPO without a value head), not yet sharded.
        critic_learning_rate: the critic's learning rate (default: the policy's).
        critic_warmup_steps: training steps of the critic's own linear warm-up.
        with_reference: keep a frozen copy of the policy for KL terms (sharded like the policy).
    """

    #: FSDP2 gathers a unit's parameters as one flat buffer, which holds one dtype: a LoRA base stays fp32.
    frozen_base_in_run_dtype = False

    def __init__(self, policy: HFPolicy, settings: BackendSettings, *, critic: ValueModel | None = None,
                 critic_learning_rate: float | None = None, critic_warmup_steps: int = 0,
                 with_reference: bool = False) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        on_gpu = torch.device(resolve_device(settings.device)).type == "cuda"
        init_process_group(on_gpu, timeout_s=settings.collective_timeout_s)
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        self._join(device)
        self._mesh = init_device_mesh(device.type, (self._world,))
        self._reshard = bool(settings.options.reshard_after_forward)
        policy.to(device)
        # Copied before the policy is sharded; a LoRA policy's reference is its base (adapters off), no copy.
        reference = None
        if with_reference and not policy.has_adapters:
            reference = frozen_copy(policy, training_dtype(settings.dtype, device))
        self._roots = self._shard(policy.model, policy.value_head)
        if critic is not None:
            self._shard(critic.to(device).backbone, critic.value_head)
        # The reference runs no backward pass: its root is sharded again after each forward too.
        self._reference_roots = [] if reference is None else self._shard(reference.model, reference.value_head, True)
        super().__init__(policy, settings, critic=critic, critic_learning_rate=critic_learning_rate,
                         critic_warmup_steps=critic_warmup_steps)
        self.reference, self._with_reference = reference, with_reference
        self._supervised_loss = 0.0  # a warm-start step's loss so far, to check that every rank has the same
        self._whole = False  # within generation(): every unit gathered whole


    def _shard(self, trunk: nn.Module, head: nn.Module | None, root_reshard: bool = False) -> list[nn.Module]:
        """Shard ``trunk`` layer by layer with itself as the root unit, and ``head`` (a value head, called
        after the trunk's forward) as a root of its own; returns the roots. A root keeps its parameters whole
        after its forward unless ``root_reshard`` (FSDP's default: the backward pass needs them at once)."""
        from torch.distributed.fsdp import fully_shard

        for layer in decoder_layers(trunk):
            fully_shard(layer, mesh=self._mesh, reshard_after_forward=self._reshard)
        roots = [fully_shard(trunk, mesh=self._mesh, reshard_after_forward=root_reshard)]
        if head is not None:
            roots.append(fully_shard(head, mesh=self._mesh, reshard_after_forward=root_reshard))
        return roots

    @property
    def device(self) -> torch.device:
        return self._device

    def _held(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor

    def _rebuilt_digest(self) -> str:
        """Over this rank's shards: every unit is sharded first (a root may still hold its parameters whole
        after a forward pass), so that the digest does not depend on when it is taken."""
        if self._rebuilt_sha256 is None:
            for unit in _units(self._roots + self._reference_roots):
                unit.reshard()
        return super()._rebuilt_digest()

    # -- whole weights ---------------------------------------------------------------------------
    @contextmanager
    def generation(self) -> Iterator[None]:
        """The policy's units all-gathered once and kept whole for the block, then sharded again; a
        collective every rank enters. Inside, no forward pass and no state-dict read runs a collective (rank
        0 alone may evaluate or export there): resharding after each unit's forward is off, and so are the
        hooks by which FSDP reshards a module before its state dict is read."""
        if self._whole:  # nested: already whole
            with self._precision():
                yield
            return
        units = _units(self._roots)
        for unit in units:
            unit.unshard()
        for root in self._roots:
            root.set_reshard_after_forward(False)
        hooks = _StateDictHooks(units)
        hooks.lift()
        self._whole = True
        try:
            with self._precision():
                yield
        finally:
            self._whole = False
            hooks.restore()
            for root in self._roots:
                root.set_reshard_after_forward(self._reshard)
                root.set_reshard_after_forward(False, recurse=False)
            for unit in units:
                unit.reshard()

    @contextmanager
    def scoring(self) -> Iterator[None]:
        """The run's precision, each unit gathered by its own forward pass and sharded again after it, as in
        training (the root, embeddings and head, stays whole until the next backward pass or state-dict read);
        within :meth:`generation` the units are whole already."""
        with self._precision():
            yield

    def rollout_weights(self, *, adapters: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """Each sharded weight gathered whole (``full_tensor()``) on every rank, one at a time: a collective
        every rank runs to the end. Within :meth:`generation` they are whole already and yielded as they
        are, with no collective. What is yielded is a copy of the shards, not the trained parameter."""
        for name, tensor in self.policy.named_weights(adapters=adapters):
            yield name, (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach()

    # -- optimisation ----------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        # FSDP's gradient reduction is a mean over ranks. RL: the loss is this rank's share of the global
        # batch's, so x world size makes the mean the sum. Warm start: the whole batch's on every rank.
        if self._supervised is not None:
            self._supervised_loss += float(loss.detach())
            loss.backward()
        else:
            (loss * self._world).backward()

    def step(self) -> float:
        if self._supervised is not None:
            self._check_same_on_every_rank(self._supervised_loss)
            self._supervised_loss = 0.0
        return super().step()

    def _apply(self, params: Any, optimizer: torch.optim.Optimizer) -> float:
        """Clip by the global gradient norm (the shards' norms reduced over the ranks, as one process
        computes it over whole gradients), then step, unless it is not finite."""
        import math

        params = [p for p in trainable(params) if p.grad is not None]
        limit = self.settings.optim.max_grad_norm if self.settings.optim.max_grad_norm > 0 else math.inf
        norm = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.zeros(())
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, limit, norm)
        if math.isfinite(float(norm)):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _copy_reference(self) -> None:
        """The reference's shards become the policy's (both are sharded alike: nothing is gathered)."""
        with torch.no_grad():
            for mine, theirs in zip(self.reference.parameters(), self.policy.parameters()):
                self._held(mine).copy_(self._held(theirs))

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """This rank's file: :meth:`TorchBackend.state_dict` with each sharded tensor as this rank's shard,
        and the number of ranks; a collective every rank enters."""
        from agents.training.checkpoint import save_checkpoint

        save_checkpoint(Path(directory) / rank_file(self._rank), {**_local(self.state_dict()), "world_size": self._world})
        self.barrier()

    def load(self, directory: Path) -> None:
        """This rank's file (see :meth:`TorchBackend.load`); a checkpoint of another number of ranks, or of
        another backend, is one ``ValueError`` line."""
        from agents.training.checkpoint import load_checkpoint

        folder = Path(directory)
        written = len(list(folder.glob(rank_file(0).replace("0", "*"))))
        if not written:
            raise ValueError(f"checkpoint folder {folder} holds no FSDP rank files ({rank_file(0)} ...): "
                             "it was written by another backend")
        file = folder / rank_file(self._rank)
        state = load_checkpoint(file, map_location=self._device) if file.is_file() else {}
        if written != self._world or state.get("world_size") != self._world:
            raise EveryRankError(f"checkpoint {folder} was written by {written} ranks; this run has {self._world}: "
                                 f"resume it with {written} ranks (torchrun --nproc_per_node {written})")
        self._restore(file, state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """:meth:`TorchBackend.load_state_dict` of a state whose shards (plain tensors, as :meth:`save` wrote
        them) are made sharded tensors again like the parameters they belong to."""
        state = dict(state)
        for key, module in (("policy", self.policy), ("critic", self.critic), ("reference", self.reference)):
            if key in state and module is not None:
                state[key] = _sharded_like(state[key], module.state_dict())
        for key, optimizer in (("optimizer", self.optimizer), ("critic_optimizer", self.critic_optimizer)):
            if key in state:
                state[key] = _optimizer_sharded_like(state[key], optimizer)
        if state.get("supervised") is not None:  # the warm start's AdamW, over the policy's trainable parameters
            state["supervised"] = {**state["supervised"],
                                   "optimizer": _optimizer_sharded_like(state["supervised"]["optimizer"], self.optimizer)}
        super().load_state_dict(state)


def _units(roots: list[nn.Module]) -> list[nn.Module]:
    """The FSDP units under ``roots``, the roots included."""
    from torch.distributed.fsdp import FSDPModule

    return [module for root in roots for module in root.modules() if isinstance(module, FSDPModule)]


class _StateDictHooks:
    """FSDP's state-dict hooks of some units, lifted for a while and put back.

    Why: before a module's state dict is read (or loaded), FSDP moves its parameters back to their shards
    and frees the gathered ones; within :meth:`FSDPBackend.generation` that would undo the gathering, and
    the next forward pass would gather again - a collective that rank 0, evaluating or exporting alone
    there, would wait on forever. FSDP keeps the hooks' handles on its parameter groups and registers them
    again on request; this class uses those (private) names, as the DeepSpeed backend lifts ZeRO-3's hooks.
    """

    def __init__(self, units: list[nn.Module]) -> None:
        self.groups = [group for unit in units for group in unit._get_fsdp_state()._fsdp_param_groups]

    def lift(self) -> None:
        for group in self.groups:
            for handles in (group._module_to_pre_save_state_dict_hook_handle, group._module_to_pre_load_state_dict_hook_handle):
                for handle in handles.values():
                    handle.remove()
                handles.clear()

    def restore(self) -> None:
        for group in self.groups:
            group._register_state_dict_hooks()


def _local(value: Any) -> Any:
    """``value`` with every sharded tensor in it (nested in dicts and lists) replaced by this rank's shard."""
    if isinstance(value, DTensor):
        return value.to_local()
    if isinstance(value, dict):
        return {key: _local(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_local(item) for item in value)
    return value


def _like(shard: torch.Tensor, model: torch.Tensor) -> torch.Tensor:
    """``shard`` as a sharded tensor laid out like ``model`` (itself when ``model`` is not sharded)."""
    if not isinstance(model, DTensor):
        return shard
    if shard.shape != model.to_local().shape:
        raise ValueError(f"a shard of shape {tuple(shard.shape)} where this rank holds {tuple(model.to_local().shape)}")
    return DTensor.from_local(shard.to(model.device), model.device_mesh, model.placements, run_check=False,
                              shape=model.shape, stride=model.stride())


def _sharded_like(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """A module's saved state dict with its shards made sharded tensors like ``current``'s entries."""
    return {key: _like(value, current[key]) if key in current and torch.is_tensor(value) else value
            for key, value in saved.items()}


def _optimizer_sharded_like(saved: dict[str, Any], optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An optimiser's saved state with each per-parameter tensor (AdamW's moments; not the 0-d step count)
    made sharded like its parameter."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {index: {key: _like(value, params[index]) if torch.is_tensor(value) and value.dim() else value
                     for key, value in entry.items()} for index, entry in saved["state"].items()}
    return {**saved, "state": state}

