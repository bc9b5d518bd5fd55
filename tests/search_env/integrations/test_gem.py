"""The GEM adapter in GEM's own virtualenv (``.ci/gem_venv.sh``, built on first use): an episode through
it has the tokens and the reward of ``gym.make("SearchQA-v0")``, for every protocol; ``gem.make`` builds it.

The checks run in gem_fidelity.py under the venv's Python, with this work tree first on its path."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import REPO_ROOT
from tests.search_env.integrations.scripted import PROTOCOLS

#: The side virtualenv these tests run in, built in the background from the start of the run (tests/side_venvs.py).
VENV_SCRIPTS = ("gem_venv.sh",)

pytestmark = [pytest.mark.integrations, pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    build = subprocess.run(["bash", str(REPO_ROOT / ".ci" / "gem_venv.sh")], capture_output=True, text=True, timeout=1500)
    assert build.returncode == 0, build.stderr[-3000:]
    python = os.path.join(build.stdout.strip().splitlines()[-1], "bin", "python")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), HF_DATASETS_OFFLINE="1")
    run = subprocess.run([python, str(REPO_ROOT / "tests" / "search_env" / "integrations" / "gem_fidelity.py")],
                         capture_output=True, text=True, timeout=600, cwd=REPO_ROOT, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith('{"check"')]
    return {line["check"]: line for line in lines}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_episode_through_gem_matches_gym_make(results, protocol):
    checks = {name: line for name, line in results.items() if name.startswith(f"{protocol}: ")}
    assert len(checks) == 6
    assert [name for name, line in checks.items() if not line["ok"]] == [], checks


def test_gem_builds_the_registered_environment(results):
    registry = {name: line for name, line in results.items() if ":" not in name}
    assert len(registry) == 2 and all(line["ok"] for line in registry.values()), registry
