"""The vLLM virtualenv for the tests marked ``vllm``, and the lines that say it is being built: the first
build takes minutes, and a test run that sat silent through it (pytest captures the build's output) looked
stalled."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Callable

__all__ = ["built_venv"]

#: What the building line says about the build, and how to leave these tests out instead.
BUILD_NOTE = "once, about 4 minutes, needs the package registry; -m 'not vllm' leaves these tests out"


def built_venv(script: Path, say: Callable[[str], None]) -> str:
    """The folder of the virtualenv ``script`` (``.ci/vllm_venv.sh``) builds or finds, built first when it is
    not: then ``say`` gets a line before the build (where, how long, how to leave the tests out) and one
    after it (the seconds it took). A failed build is an ``AssertionError`` with the end of its output."""
    ready = subprocess.run(["bash", str(script), "--check"], capture_output=True, text=True, timeout=120)
    started = time.monotonic()
    if ready.returncode != 0:
        say(f"building the vLLM virtualenv for the tests marked vllm ({BUILD_NOTE}): bash {script}")
    build = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, f"building the vLLM venv failed:\n{build.stderr[-4000:]}"
    folder = build.stdout.strip().splitlines()[-1]
    if ready.returncode != 0:
        say(f"built the vLLM virtualenv in {time.monotonic() - started:.0f} s: {folder}")
    return folder
