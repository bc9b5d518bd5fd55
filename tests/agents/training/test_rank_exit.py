"""A command that joined a torch process group ends without finalising the interpreter, after its
non-daemon threads, its exit handlers and a flush of its output, with main's exit status; one that did
not join ends as usual. Each case runs in its own process (a single-rank gloo group where one is joined):
whether the interpreter was finalised shows in a module-level object whose ``__del__`` prints."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch")
from agents.training.rank_exit import _exit_code  # noqa: E402
from tests.agents.training.torchrun import ROOT, free_port, rank_env  # noqa: E402

SCRIPT = """
import atexit, sys, threading, time
import torch.distributed as dist
from agents.training.rank_exit import run_main

class Finalised:
    def __del__(self, write=sys.stderr.write):  # bound now: the module's names are gone by then
        write("finalised\\n")

KEEP = Finalised()  # freed only when the interpreter is finalised
mode, port = sys.argv[1], sys.argv[2]

def late():
    time.sleep(0.3)
    sys.stdout.write("thread done\\n")

def main():
    if mode != "alone":
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    atexit.register(lambda: sys.stdout.write("handlers ran\\n"))
    threading.Thread(target=late).start()
    sys.stdout.write("unflushed")
    if mode == "raise":
        raise RuntimeError("broken")
    if mode == "message":
        sys.exit("bad input")
    return 3

run_main(main)
"""


def _run(tmp_path, mode: str) -> subprocess.CompletedProcess:
    script = tmp_path / "command.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, str(script), mode, str(free_port())], cwd=ROOT, env=rank_env(),
                          capture_output=True, text=True, timeout=120)


def test_a_process_in_a_group_leaves_without_finalisation_after_its_threads_and_handlers(tmp_path):
    done = _run(tmp_path, "group")
    assert done.returncode == 3, done.stderr[-3000:]
    assert done.stdout == "unflushedthread done\nhandlers ran\n"  # thread joined, then the handlers, then flushed
    assert "finalised" not in done.stderr


def test_a_process_without_a_group_ends_as_usual(tmp_path):
    done = _run(tmp_path, "alone")
    assert done.returncode == 3, done.stderr[-3000:]
    assert done.stdout == "unflushedthread done\nhandlers ran\n"
    assert "finalised" in done.stderr


def test_an_exception_prints_its_traceback_and_exits_1(tmp_path):
    done = _run(tmp_path, "raise")
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "RuntimeError: broken" in done.stderr
    assert "handlers ran" in done.stdout and "finalised" not in done.stderr


def test_a_system_exit_message_goes_to_stderr_with_status_1(tmp_path):
    done = _run(tmp_path, "message")
    assert done.returncode == 1 and done.stderr.splitlines()[0] == "bad input"


@pytest.mark.parametrize("status, code", [(None, 0), (0, 0), (4, 4), (True, 1), (False, 0)])
def test_exit_codes_are_those_of_sys_exit(status, code):
    assert _exit_code(status) == code
