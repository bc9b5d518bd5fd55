"""Ranks under faults, two CPU ranks under ``torchrun`` (gloo): a rank that stops answering ends the others
within ``run.collective_timeout_s`` with one line naming it, and killing the launcher ends every rank within
seconds instead of leaving them to finish the run on their own."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
from tests.agents.training.torchrun import ROOT, TINY_RUN, free_port, rank_env  # noqa: E402

pytestmark = [pytest.mark.fsdp, pytest.mark.slow]


def _launch(output_dir: Path, log: Path, *flags: str) -> subprocess.Popen:
    """``torchrun`` of two ranks of the tiny run under the FSDP backend, its output (the ranks' too) to ``log``."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), "-m", "agents.train", "--run.backend", "fsdp", *TINY_RUN,
               "--eval.questions", "0", "--run.output_dir", str(output_dir), *flags]
    with open(log, "w") as handle:
        return subprocess.Popen(command, cwd=ROOT, env=rank_env(), stdout=handle, stderr=subprocess.STDOUT)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_rank_that_stops_answering_ends_the_others_with_one_line_naming_it(tmp_path):
    timeout = 30
    log = tmp_path / "log.txt"
    launcher = _launch(tmp_path / "run", log, "--run.steps", "4", "--run.collective_timeout_s", str(timeout),
                       "--import", "tests.agents.training.stall_rank")
    try:
        launcher.wait(timeout=400)  # rank 1 sleeps 600 s: only rank 0's timeout ends the run this soon
    finally:
        launcher.kill()
    text = log.read_text()
    assert launcher.returncode != 0
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert errors == [f"error: rank 1 stopped answering: rank 0 waited {timeout} s (run.collective_timeout_s) in a "
                      "collective it never entered; see that rank's own output for why it is stuck (the run's last "
                      "checkpoint stands: --run.resume true continues it)"], text[-3000:]
    assert "Traceback" not in text.partition("error: rank 1")[0][-2000:]  # rank 0 said it in its line alone


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_the_launcher_ends_every_rank_within_seconds(tmp_path):
    log, metrics = tmp_path / "log.txt", tmp_path / "run" / "metrics.jsonl"
    launcher = _launch(tmp_path / "run", log, "--run.steps", "100000")
    try:
        deadline = time.monotonic() + 300
        while not (metrics.is_file() and metrics.read_text().strip()):  # the ranks are training
            assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        ranks = _children(launcher.pid)
        assert len(ranks) == 2
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [pid for pid in ranks if _alive(pid)]
    finally:
        for pid in _children(launcher.pid) + locals().get("ranks", []):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not left, f"ranks {left} still run 10 s after their launcher was killed"
    time.sleep(0.5)  # their last lines
    # Each rank says why it stops (one that the other's end took down first may not get to say it).
    said = [line for line in log.read_text().splitlines() if "its launcher" in line]
    assert said and all(line.startswith(("error: rank 0: ", "error: rank 1: ")) for line in said), log.read_text()[-3000:]
    assert all(f"its launcher (process {launcher.pid}) is gone; the rank stops" in line for line in said)
