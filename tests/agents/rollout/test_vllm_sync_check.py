"""Checked weight syncs with the in-process vLLM engine (full weights and LoRA adapters), in the vLLM
virtualenv: correct syncs give gaps far below the float32 tolerance, and a sync broken on purpose after
step 2 (one that loads nothing; the step-0 adapters sent again) stops a short training run at sync 3 with
the check's one line. One subprocess runs both (two tiny engines). The server engine's check is in
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


@pytest.fixture(scope="module")
def results(vllm_python) -> dict:
    """Both checks' results, from one subprocess of the vLLM venv's Python (built by ``.ci/vllm_venv.sh``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    run = subprocess.run([vllm_python, str(CHECKS), "full", "lora"], capture_output=True, text=True, timeout=2100,
                         cwd=REPO_ROOT, env=env)
    assert run.returncode == 0, f"the vLLM sync checks failed:\n{run.stderr[-6000:]}"
    results = json.loads(run.stdout.strip().splitlines()[-1])
    print("vLLM sync checks:", json.dumps(results))
    return results


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
