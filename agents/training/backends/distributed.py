"""What every multi-rank backend shares of ``torch.distributed``: joining the launcher's process group
(gloo on a CPU, NCCL on GPUs), ending it, and the collectives of the :class:`TrainingBackend
<agents.training.backends.base.TrainingBackend>` interface over it (:class:`DataParallelBackend`).

A command that joins a group ends through :func:`agents.training.rank_exit.run_main`, as ``agents.train``
does: ending the group does not stop gloo's threads, which can abort the process as the interpreter is
finalised (that module says why).

Nothing hangs for ever, and nothing is left running:

* a collective waits ``run.collective_timeout_s`` for the other ranks; a rank whose collective timed out
  finds out which ranks never came to it (:class:`CollectiveBoard`) and raises :class:`RankStopped`, one
  line naming them, which ``python -m agents.train`` prints as its ``error:`` line (exit status 1);
  the launcher then ends the stuck ranks. On GPUs NCCL's own watchdog may end the process first, with
  its own message;
* a rank started by a launcher (``torchrun``) watches it: when the launcher is gone (killed, even with
  ``kill -9``), the rank says so in one line and ends (:func:`watch_launcher`), instead of finishing the
  run on its own into the folder a relaunch would use.
"""
from __future__ import annotations

import atexit
import datetime
import os
import re
import socket
import sys
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from agents.training.backends.base import TrainingBackend
from agents.training.backends.models import trained_models
from agents.training.backends.settings import BackendSettings
from agents.training.config import TrainConfig

if TYPE_CHECKING:
    from agents.learners import Algorithm, BatchCounts
    from agents.policies.policy import HFPolicy

__all__ = ["CollectiveBoard", "DataParallelBackend", "EveryRankError", "RankStopped", "as_rank_stopped", "check_world",
           "end_process_group", "free_port", "init_process_group", "launcher_world_size", "watch_launcher"]

#: How long a collective waits for the other ranks without ``run.collective_timeout_s`` (its default).
DEFAULT_TIMEOUT_S = 1800.0
#: How often a rank checks that its launcher is still there.
LAUNCHER_POLL_S = 1.0


def init_process_group(on_gpu: bool, start: Callable[[str, datetime.timedelta], None] | None = None, *,
                       timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Join the launcher's process group (``torchrun``'s or DeepSpeed's environment: ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR`` ...), or start a group of one when the command was run without a launcher; nothing when
    a group is joined already. ``start(name, timeout)`` joins it over the collective backend ``name``
    (``nccl`` on GPUs, ``gloo`` on a CPU), its collectives waiting at most ``timeout`` (``timeout_s``:
    ``run.collective_timeout_s``); default: ``torch.distributed.init_process_group``, after choosing this
    rank's GPU. A rank a launcher started watches it (:func:`watch_launcher`). The group is ended by the
    process's exit handlers (:func:`end_process_group`)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    if "RANK" not in os.environ:  # a plain `python -m agents.train`: one rank
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"})
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    else:
        watch_launcher()
    name, timeout = ("nccl" if on_gpu else "gloo"), datetime.timedelta(seconds=timeout_s)
    if start is not None:
        start(name, timeout)
    else:
        if on_gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=name, timeout=timeout)
    atexit.register(end_process_group)
    global _board
    _board = CollectiveBoard(dist.get_rank(), dist.get_world_size(), timeout_s) if dist.get_world_size() > 1 else None


def watch_launcher(poll_s: float = LAUNCHER_POLL_S) -> None:
    """Watch this rank's launcher (its parent process, ``torchrun``) from a daemon thread: once it is gone
    (the rank was handed to another parent), say so in one line on stderr and end the process at once,
    wherever its main thread is (a collective, a step). Nothing when the parent is gone already."""
    parent = os.getppid()
    if parent == 1:
        return

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                print(f"error: rank {os.environ.get('RANK', '?')}: its launcher (process {parent}) is gone; the rank "
                      "stops (its last checkpoint is the run's: --run.resume true continues it)", file=sys.stderr, flush=True)
                os._exit(1)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


class EveryRankError(ValueError):
    """A bad setup that every rank finds alike (a checkpoint of another number of ranks): one line, which
    ``python -m agents.train`` prints on rank 0 alone, so a run says it once, not once per rank."""

    every_rank = True  #: what the command line reads (it tells without importing torch)


class RankStopped(RuntimeError):
    """A collective that failed because some ranks stopped answering; the message is one line naming them."""


#: A collective's failure, as gloo and NCCL word it: a timeout, or a peer's connection gone.
_COLLECTIVE_FAILURE = re.compile(r"timed out|timeout|connection (closed|reset)|broken pipe", re.IGNORECASE)


class CollectiveBoard:
    """Where ranks whose collective failed say so, in the launcher's key-value store (the one the group was
    set up through): a rank whose collective timed out writes its own mark, then waits
    :data:`GRACE_S` for the marks of the others. Ranks that were waiting in the same collective fail
    within about that time of each other and mark it; those that never mark it were not in it - they
    stopped answering (stuck, stopped, or busy far longer than the timeout allows)."""

    _PREFIX = "searchqa/failed/"
    #: How long a rank whose collective failed waits for the others' marks.
    GRACE_S = 10.0

    def __init__(self, rank: int, world: int, timeout_s: float) -> None:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _get_default_store

        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self._store = dist.PrefixStore(self._PREFIX, _get_default_store())
        self._verdict: tuple[RankStopped | None] | None = None

    def stopped(self) -> RankStopped | None:
        """Mark this rank's collective failed and return :class:`RankStopped` naming the ranks that did not
        mark theirs within :data:`GRACE_S` (``None`` when every rank did, or the store is gone); the
        verdict is kept, so a second call answers at once."""
        if self._verdict is None:
            self._verdict = (self._silent_ranks_error(),)
        return self._verdict[0]

    def _silent_ranks_error(self) -> RankStopped | None:
        others = [str(rank) for rank in range(self.world) if rank != self.rank]
        try:
            self._store.set(str(self.rank), "1")
            deadline = time.monotonic() + self.GRACE_S
            while True:
                silent = [int(rank) for rank in others if not self._store.check([rank])]
                if not silent or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        except RuntimeError:  # the store is gone with the launcher
            return None
        if not silent:
            return None
        who = f"rank {silent[0]}" if len(silent) == 1 else "ranks " + ", ".join(map(str, silent))
        return RankStopped(f"{who} stopped answering: rank {self.rank} waited {self.timeout_s:g} s "
                           f"(run.collective_timeout_s) in a collective {'it' if len(silent) == 1 else 'they'} never "
                           "entered; see that rank's own output for why it is stuck (the run's last checkpoint "
                           "stands: --run.resume true continues it)")


_board: CollectiveBoard | None = None  #: this process's board, once it joined a group of several ranks


def as_rank_stopped(exc: BaseException) -> RankStopped | None:
    """``exc`` as a :class:`RankStopped` when it is one, or when it is a collective's failure (a timeout, a
    peer's connection gone) that some ranks did not share (:class:`CollectiveBoard`); otherwise ``None``."""
    if isinstance(exc, RankStopped):
        return exc
    if _board is None or not isinstance(exc, RuntimeError) or not _COLLECTIVE_FAILURE.search(str(exc)):
        return None
    if not _raised_in_torch_distributed(exc):  # a timeout of something else (a search, a file) is not a rank's
        return None
    return _board.stopped()


def _raised_in_torch_distributed(exc: BaseException) -> bool:
    """Whether ``exc`` was raised from within ``torch.distributed`` (a collective's wait)."""
    marker = os.path.join("torch", "distributed", "")
    traceback = exc.__traceback__
    while traceback is not None:
        if marker in traceback.tb_frame.f_code.co_filename:
            return True
        traceback = traceback.tb_next
    return False


@contextmanager
def _collective() -> Iterator[None]:
    """Around one of this module's collectives: its failure raised as :class:`RankStopped` where some
    ranks stopped answering (:func:`as_rank_stopped`)."""
    try:
        yield
    except RuntimeError as exc:
        stopped = as_rank_stopped(exc)
        if stopped is None:
            raise
        raise stopped from exc


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

    @classmethod
    def from_config(cls, config: TrainConfig, policy: HFPolicy, algorithm: Algorithm) -> DataParallelBackend:
        """A separate critic (PPO without a value head) starts as a copy of the policy's model
        (:func:`~agents.training.backends.models.trained_models`). A world size that does not divide
        ``rollout.questions_per_step`` (a question's group is never split between ranks) is one line."""
        check_world(config, launcher_world_size())
        return cls(policy, BackendSettings.of(config), **trained_models(config, policy, algorithm).options())

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
        with _collective():
            self._dist.all_reduce(out)
        return out.to(tensor.device, tensor.dtype)

    def barrier(self) -> None:
        with _collective():
            self._dist.barrier()

    def broadcast_object(self, obj: Any) -> Any:
        box = [obj]
        with _collective():
            self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        box: list[Any] = [None] * self._world
        with _collective():
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
        with _collective():
            self._dist.all_reduce(both, op=self._dist.ReduceOp.MAX)
        highest, lowest = float(both[0]), -float(both[1])
        if highest - lowest > 1e-5 * max(1.0, abs(highest)):
            raise ValueError(f"the warm start's loss differs between ranks ({lowest:.6g} to {highest:.6g}): every rank "
                             "must clone the same demonstrations (the same dataset, seed and warm_start settings)")
