"""verl's tool class in verl's own virtualenv (``.ci/verl_venv.sh``, built on first use): verl builds it
from a tool config, and driven as verl's agent loop drives it, it answers a scripted episode's calls with
``gym.make("SearchQA-v0")``'s observations (query, NL-DAG and native tool-call protocols).

The checks run in verl_tool_check.py under the venv's Python, with this work tree first on its path."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import REPO_ROOT

#: The side virtualenv these tests run in, built in the background from the start of the run (tests/side_venvs.py).
VENV_SCRIPTS = ("verl_venv.sh",)

pytestmark = [pytest.mark.integrations, pytest.mark.slow, pytest.mark.timeout(2400)]

PROTOCOLS = ("search-r1", "r1-searcher", "reasoning-search", "tool-calls")


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    build = subprocess.run(["bash", str(REPO_ROOT / ".ci" / "verl_venv.sh")], capture_output=True, text=True, timeout=2000)
    assert build.returncode == 0, build.stderr[-3000:]
    python = os.path.join(build.stdout.strip().splitlines()[-1], "bin", "python")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    run = subprocess.run([python, str(REPO_ROOT / "tests" / "search_env" / "integrations" / "verl_tool_check.py"), *PROTOCOLS],
                         capture_output=True, text=True, timeout=600, cwd=REPO_ROOT, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith('{"check"')]
    return {line["check"]: line for line in lines}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_verl_runs_the_tool_with_the_environments_observations(results, protocol):
    checks = {name: line for name, line in results.items() if name.startswith(f"{protocol}: ")}
    assert sorted(checks) == [f"{protocol}: observations", f"{protocol}: schema"]
    assert [name for name, line in checks.items() if not line["ok"]] == [], checks
