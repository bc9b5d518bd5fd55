"""Run a module or script on several CPU ranks with ``torchrun`` (gloo), as the DeepSpeed tests do."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env() -> dict[str, str]:
    """The ranks' environment: one torch thread each, the repository importable, no progress bars."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "SEARCHQA_PROGRESS": "0"}


def torchrun(ranks: int, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node RANKS ARGS...`` from the repository root, once;
    fails the calling test with the end of its output unless it exits 0 (a rank that aborts as it exits
    fails it too: see :mod:`agents.training.rank_exit`)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *args]
    done = subprocess.run(command, cwd=ROOT, env=rank_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done
