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

__all__ = ["BackgroundBuild", "scripts_for", "side_venv_modules_last"]

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


def side_venv_modules_last(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with the test modules that need a side venv after all others, each part in its order: the
    build then overlaps the other tests instead of being waited for by the first test that needs it. A
    module moves whole (by its path in the node id), so its fixtures are still set up once."""
    late = {item.nodeid.split("::")[0] for item in items if scripts_for([item])}
    return sorted(items, key=lambda item: item.nodeid.split("::")[0] in late)


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
