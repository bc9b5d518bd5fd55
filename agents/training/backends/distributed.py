"""What every multi-rank backend shares of ``torch.distributed``: joining the launcher's process group
(gloo on a CPU, NCCL on GPUs), ending it, and the collectives of the :class:`TrainingBackend
<agents.training.backends.base.TrainingBackend>` interface over it (:class:`DataParallelBackend`).

A command that joins a group ends through :func:`agents.training.rank_exit.run_main`, as ``agents.train``
does: ending the group does not stop gloo's threads, which can abort the process as the interpreter is
finalised (that module says why).
"""
from __future__ import annotations

import atexit
import os
import socket
from typing import TYPE_CHECKING, Any, Callable

import torch

from agents.training.backends.base import TrainingBackend
from agents.training.config import TrainConfig

if TYPE_CHECKING:
    from agents.learners import BatchCounts

__all__ = ["DataParallelBackend", "check_world", "end_process_group", "free_port", "init_process_group", "launcher_world_size"]


def init_process_group(on_gpu: bool, start: Callable[[str], None] | None = None) -> None:
    """Join the launcher's process group (``torchrun``'s or DeepSpeed's environment: ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR`` ...), or start a group of one when the command was run without a launcher; nothing when
    a group is joined already. ``start(name)`` joins it over the collective backend ``name`` (``nccl`` on
    GPUs, ``gloo`` on a CPU; default: ``torch.distributed.init_process_group``, after choosing this rank's
    GPU). The group is ended by the process's exit handlers (:func:`end_process_group`)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    if "RANK" not in os.environ:  # a plain `python -m agents.train`: one rank
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"})
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    name = "nccl" if on_gpu else "gloo"
    if start is not None:
        start(name)
    else:
        if on_gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=name)
    atexit.register(end_process_group)


def end_process_group() -> None:
    """Destroy the default process group, if one is joined."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def free_port() -> int:
    """A TCP port free on this machine now (for a group of one, which needs an address of its own)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launcher_world_size() -> int:
    """The ranks the launcher started (``WORLD_SIZE``; 1 without a launcher), known before any group is joined."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_world(config: TrainConfig, world: int) -> None:
    """One line when ``world`` ranks cannot share a step's questions and mini-batches evenly."""
    questions = config.rollout.questions_per_step
    if questions % world:
        raise ValueError(f"{world} ranks cannot share rollout.questions_per_step={questions} "
                         f"(a question's group stays on one rank): use a multiple of {world}")
    mini = config.optim.mini_batch_size
    if mini and mini % world:
        raise ValueError(f"{world} ranks cannot share optim.mini_batch_size={mini} evenly: use a multiple of {world}")


class DataParallelBackend(TrainingBackend):
    """A backend of one process per device in the default process group: the interface's rank, world size
    and collectives over it. A subclass joins the group (:func:`init_process_group`) and then calls
    :meth:`_join`, which records this rank and the device its collectives run on."""

    _rank: int = 0
    _world: int = 1
    _device: torch.device = torch.device("cpu")

    def _join(self, device: torch.device) -> None:
        import torch.distributed as dist

        self._dist = dist
        self._rank, self._world, self._device = dist.get_rank(), dist.get_world_size(), device

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Summed in float64 on a CPU (float32 on a GPU, whose collectives may lack float64)."""
        out = tensor.detach().to(self._device, torch.float64 if self._device.type == "cpu" else torch.float32).clone()
        self._dist.all_reduce(out)
        return out.to(tensor.device, tensor.dtype)

    def barrier(self) -> None:
        self._dist.barrier()

    def broadcast_object(self, obj: Any) -> Any:
        box = [obj]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        box: list[Any] = [None] * self._world
        self._dist.all_gather_object(box, obj)
        return box

    def reduce_counts(self, counts: BatchCounts) -> BatchCounts:
        from agents.learners import BatchCounts

        summed = self.all_reduce_sum(torch.tensor([counts.tokens, counts.sequences], dtype=torch.float64))
        return BatchCounts(tokens=float(summed[0]), sequences=float(summed[1]), norm_length=counts.norm_length)

    def _check_same_on_every_rank(self, loss: float) -> None:
        """One ``ValueError`` line, on every rank, when a warm-start step's loss differs between ranks (every
        rank runs the whole warm start on the same demonstrations: see :meth:`supervised`); a collective."""
        if self._world == 1:
            return
        both = torch.tensor([loss, -loss], dtype=torch.float64 if self._device.type == "cpu" else torch.float32,
                            device=self._device)
        self._dist.all_reduce(both, op=self._dist.ReduceOp.MAX)
        highest, lowest = float(both[0]), -float(both[1])
        if highest - lowest > 1e-5 * max(1.0, abs(highest)):
            raise ValueError(f"the warm start's loss differs between ranks ({lowest:.6g} to {highest:.6g}): every rank "
                             "must clone the same demonstrations (the same dataset, seed and warm_start settings)")
