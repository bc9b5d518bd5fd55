"""The side virtualenvs (vLLM's, GEM's, verl's: ``.ci/*_venv.sh``) that the selected tests need, built in the
background from the start of the run: on a fresh machine each takes minutes of mostly downloading, which
otherwise waits inside the first test that needs it while the other tests could run. Each script is
idempotent and takes a lock, so a test that needs a venv still being built waits for that build to end."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

__all__ = ["BackgroundBuild", "scripts_for"]

SCRIPTS = Path(__file__).resolve().parents[1] / ".ci"


def scripts_for(items: Iterable[pytest.Item]) -> list[str]:
    """The venv scripts ``items`` need, in the order the tests first need them: ``vllm_venv.sh`` for a test
    marked ``vllm``, and those a test module names in its ``VENV_SCRIPTS``."""
    wanted: list[str] = []
    for item in items:
        names = ["vllm_venv.sh"] if item.get_closest_marker("vllm") is not None else []
        names += list(getattr(getattr(item, "module", None), "VENV_SCRIPTS", ()))
        wanted += [name for name in names if name not in wanted]
    return wanted


class BackgroundBuild:
    """Runs ``scripts`` (names in ``folder``) one after another in a process group of their own, their
    output to ``log``."""

    def __init__(self, scripts: list[str], log: Path, folder: Path = SCRIPTS) -> None:
        command = " ; ".join(f"bash {shlex.quote(str(folder / name))} >/dev/null" for name in scripts)
        with open(log, "w", encoding="utf-8") as out:
            self.process = subprocess.Popen(["bash", "-c", command], stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        """End a build still running when the tests end (a ``-x`` stop): the script rebuilds a venv it did
        not finish from scratch next time."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)
