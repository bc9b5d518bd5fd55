"""Run a module or script on several CPU ranks with ``torchrun`` (gloo), as the DeepSpeed tests do."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

#: What a rank printed when it aborted at exit, after its work was done and written.
TEARDOWN_ABORT = "terminate called without an active exception"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env() -> dict[str, str]:
    """The ranks' environment: one torch thread each, the repository importable, no progress bars."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "SEARCHQA_PROGRESS": "0"}


def torchrun(ranks: int, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node RANKS ARGS...`` from the repository root; fails the
    calling test with the end of its output unless it exits 0.

    A rank can abort with :data:`TEARDOWN_ABORT` as the interpreter exits: DeepSpeed keeps references to
    the gloo process groups past ``destroy_process_group``, so their threads are still running then. It
    was seen once in a CI run of about 25 launches and not in 102 launches run to reproduce it. Such a
    launch is run once more; any other failure, or that one twice, fails.
    """
    done = _launch(ranks, args, timeout)
    if done.returncode != 0 and _aborted_at_exit(done):
        done = _launch(ranks, args, timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


def _launch(ranks: int, args: tuple[str, ...], timeout: int) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *args]
    return subprocess.run(command, cwd=ROOT, env=rank_env(), capture_output=True, text=True, timeout=timeout)


def _aborted_at_exit(done: subprocess.CompletedProcess) -> bool:
    """A rank died of SIGABRT (as torchrun reports it) after printing :data:`TEARDOWN_ABORT`."""
    return f"exitcode  : -{int(signal.SIGABRT)} " in done.stderr and TEARDOWN_ABORT in done.stderr
