"""Checked weight syncs with the in-process vLLM engine (full weights and LoRA adapters), in the vLLM
virtualenv: correct syncs give gaps far below the float32 tolerance, and a sync broken on purpose after
step 2 (one that loads nothing; the step-0 adapters sent again) stops a short training run at sync 3 with
the check's one line. One subprocess runs both (two tiny engines); another trains one and two steps ahead
(``rollout.max_staleness``), each sync checked. The server engine's check is in
``test_vllm_server_engine.py``, on that module's engine."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from agents.rollout.sync_check import FP32_TOLERANCE
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(2400)]

CHECKS = REPO_ROOT / "tests" / "agents" / "rollout" / "vllm_sync_checks.py"


def run_checks(python: str, *checks: str) -> dict:
    """The named checks' results, from one subprocess of the vLLM venv's Python (``python``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    run = subprocess.run([python, str(CHECKS), *checks], capture_output=True, text=True, timeout=2100,
                         cwd=REPO_ROOT, env=env)
    assert run.returncode == 0, f"the vLLM sync checks failed:\n{run.stderr[-6000:]}"
    results = json.loads(run.stdout.strip().splitlines()[-1])
    print("vLLM sync checks:", json.dumps(results))
    return results


@pytest.fixture(scope="module")
def results(vllm_python) -> dict:
    """The broken-sync checks (full weights, LoRA), from one subprocess."""
    return run_checks(vllm_python, "full", "lora")


@pytest.fixture(scope="module")
def ahead(vllm_python) -> dict:
    """Training one and two steps ahead (``rollout.max_staleness`` 1, with ``engine.sleep``, and 2), from one
    subprocess."""
    return run_checks(vllm_python, "async1", "async2")


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_correct_syncs_pass_and_a_broken_one_stops_the_run_in_one_line(results, mode):
    result = results[mode]
    assert result["lora"] is (mode == "lora")
    assert result["tolerance"] == FP32_TOLERANCE  # float32 engine and trainer
    assert [sync for sync, _ in result["gaps"]] == [1, 2, 3], result
    assert all(gap < 1e-4 for _, gap in result["gaps"][:2]), result  # correct syncs: kernels' differences only
    assert [step["sync_gap"] for step in result["steps"]] == [gap for _, gap in result["gaps"][:2]]
    assert result["gaps"][2][1] > FP32_TOLERANCE, result
    error = result["error"]
    assert error is not None and "\n" not in error, result
    assert error.startswith("weight sync check: engine vllm, sync 3:"), error
    assert result["steps_done"] == 2, result  # stopped at the rollout of step 3


def test_a_check_costs_little_next_to_a_step(results):
    for mode in ("full", "lora"):
        seconds, steps = results[mode]["check_seconds"], results[mode]["steps"]
        # the failing check raises before it is timed; the first includes vLLM's first prompt-log-prob call
        assert len(seconds) == 2 and seconds[-1] < 1.0, results[mode]
        print(mode, "check s:", seconds, "step s:", [s["step_s"] for s in steps])


def test_one_step_ahead_runs_on_the_in_process_engine_with_checked_syncs(ahead):
    """The rollout ahead runs vLLM on a thread of its own (whose OpenMP threads the engine matches to torch's,
    as vLLM's CPU attention requires); the syncs stay on the main thread, each checked, and the engine sleeps
    only where no rollout is in flight."""
    result = ahead["async1"]
    assert result["steps_done"] == 3 and result["staleness"] == [0.0, 1.0, 1.0], result
    assert result["syncs"] == [["MainThread", None], ["MainThread", None]], result  # the start; step 2's launch
    assert [sync for sync, _ in result["gaps"]] == [1, 2] and all(gap < 1e-4 for _, gap in result["gaps"]), result
    assert result["sleeps_in_flight"] and not any(result["sleeps_in_flight"]), result
    assert result["in_flight"] is False, result


def test_two_steps_ahead_sync_a_snapshot_on_the_rollouts_thread_and_check_it(ahead):
    result = ahead["async2"]
    assert result["steps_done"] == 4 and result["staleness"] == [0.0, 1.0, 2.0, 2.0], result
    # Step 3 is launched at step 1 behind step 2's rollout: a snapshot of v1, synced on its own thread.
    assert result["syncs"] == [["MainThread", None], ["rollout-step-3", 1]], result
    assert [sync for sync, _ in result["gaps"]] == [1, 2] and all(gap < 1e-4 for _, gap in result["gaps"]), result
