"""Run a module or script on several CPU ranks with ``torchrun`` (gloo), as the DeepSpeed and FSDP tests do,
and the runs those tests compare."""
from __future__ import annotations

import copy
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


def torchrun(ranks: int, *args: str, timeout: int = 600, python: str = sys.executable,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node RANKS ARGS...`` from the repository root, once
    (``python``: another virtualenv's, e.g. the vLLM one; ``env``: variables besides :func:`rank_env`'s);
    fails the calling test with the end of its output unless it exits 0 (a rank that aborts as it exits
    fails it too: see :mod:`agents.training.rank_exit`)."""
    command = [python, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *args]
    done = subprocess.run(command, cwd=ROOT, env={**rank_env(), **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


#: The one-process runs made so far in this test session, by their flags (:func:`_one_process_key`): the torch
#: backend's run is deterministic, so the tests that compare several layouts with one setting share its run.
_ONE_PROCESS_RUNS: dict[tuple[str, ...], dict] = {}


def _one_process_key(flags: tuple[str, ...]) -> tuple[str, ...]:
    """``flags`` without what a torch-backend run of ds_equivalence ignores or takes by default: ``--zero N``
    (DeepSpeed's alone), ``--algo grpo`` and ``--critic head``."""
    key, i = [], 0
    while i < len(flags):
        pair = tuple(flags[i:i + 2])
        if flags[i] == "--zero" or pair in {("--algo", "grpo"), ("--critic", "head")}:
            i += 2
        else:
            key.append(flags[i])
            i += 1
    return tuple(key)


def equivalence_run(out: Path, backend: str, *flags: str) -> dict:
    """:mod:`tests.agents.training.ds_equivalence` with ``--backend BACKEND FLAGS...``: one process for
    ``torch`` (made once per setting in a test session, then a copy of that run), two ranks under ``torchrun``
    for a data-parallel backend (``deepspeed``, ``fsdp``); returns what rank 0 wrote to ``out``."""
    import torch

    args = ["-m", "tests.agents.training.ds_equivalence", "--backend", backend, "--out", str(out), *flags]
    if backend == "torch":
        key = _one_process_key(flags)
        if key not in _ONE_PROCESS_RUNS:
            done = subprocess.run([sys.executable, *args], cwd=ROOT, env=rank_env(), capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-4000:]
            _ONE_PROCESS_RUNS[key] = torch.load(out)
        return copy.deepcopy(_ONE_PROCESS_RUNS[key])
    torchrun(2, *args)
    return torch.load(out)


#: ``agents.train`` flags of a two-step run of the tiny model that two ranks share (one question group each).
TINY_RUN = ("--run.steps", "2", "--rollout.questions_per_step", "2", "--algorithm.group_size", "2",
            "--env.max_new_tokens", "12", "--data.world_size", "30", "--optim.micro_batch_size", "2",
            "--algorithm.kl_coef", "0.01", "--model.tiny_layers", "1", "--model.tiny_hidden", "32",
            "--model.tiny_heads", "2", "--run.report_to", "[]")


def train_run(backend: str, output_dir: Path, *flags: str, ranks: int = 2) -> None:
    """``agents.train`` of :data:`TINY_RUN` on ``ranks`` ranks with ``--run.backend BACKEND FLAGS...``,
    writing to ``output_dir``."""
    torchrun(ranks, "-m", "agents.train", "--run.backend", backend, *TINY_RUN, "--run.output_dir", str(output_dir), *flags)
