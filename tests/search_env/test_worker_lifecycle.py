"""The environment worker's life and death (:class:`search_env.worker.EnvWorker`), with real processes: it
ends when the process that started it is killed, a worker that was killed is reported in one line, and a
worker's error is raised by the call that waits for it, whichever call took the reply in.

No verdict here depends on timing: waits poll for a condition, with generous bounds."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

from search_env import BatchSearchQAEnv
from search_env.tokenization import as_codec
from search_env.worker import EnvWorker

ROOT = Path(__file__).resolve().parents[2]

#: A trainer-like parent: builds environments, forks two workers (the second inherits the first's pipe
#: end), steps them, prints their pids, then waits to be killed. With "--holder" it then forks a process
#: that outlives it holding every pipe end it had (as a data-loader worker would): the workers must not
#: wait for their pipes to close.
TRAINER = """
import os, sys, time
from search_env import BatchSearchQAEnv
from search_env.worker import EnvWorker

env = BatchSearchQAEnv(2, protocol="search-r1", world_size=20)
workers = [EnvWorker(env), EnvWorker(env)]
for worker in workers:
    worker.reset(options=[{"index": 0}, {"index": 1}])
    worker.step([env.codec.encode(" thinking"), None])
pids = [worker._process.pid for worker in workers]
if "--holder" in sys.argv:
    holder = os.fork()
    if holder == 0:
        time.sleep(300)
        os._exit(0)
    pids.append(holder)
print(" ".join(map(str, pids)), flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for a parent that does not reap it counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_until(condition, bound_s: float = 30.0) -> bool:
    """Poll ``condition`` until it holds or ``bound_s`` seconds pass; returns whether it held."""
    limit = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > limit:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(scope="module")
def codec():
    return as_codec(None)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.timeout(180)
@pytest.mark.parametrize("holder", [False, True], ids=["alone", "pipe-ends-held-by-another-process"])
def test_workers_exit_when_their_trainer_is_killed_with_sigkill(tmp_path, holder):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    trainer = subprocess.Popen([sys.executable, str(script), *(["--holder"] if holder else [])],
                               stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    pids: list[int] = []
    try:
        pids = [int(pid) for pid in trainer.stdout.readline().split()]
        workers = pids[:2]
        assert len(pids) == 2 + holder and not any(gone(pid) for pid in pids)
        trainer.kill()
        trainer.wait()
        assert wait_until(lambda: all(gone(pid) for pid in workers), bound_s=30.0), \
            f"workers still alive 30 s after their trainer was killed: {[p for p in workers if not gone(p)]}"
    finally:
        trainer.kill()
        trainer.wait()
        trainer.stdout.close()
        for pid in pids:  # the test's own processes, should they have outlived it
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def killed(worker: EnvWorker) -> None:
    os.kill(worker._process.pid, signal.SIGKILL)
    worker._process.join(timeout=30)
    assert not worker._process.is_alive()


@pytest.mark.timeout(120)
def test_a_killed_worker_is_reported_in_one_line_by_every_call(codec):
    from search_env.worker import WorkerDied

    env = BatchSearchQAEnv(2, protocol="search-r1", tokenizer=codec, world_size=20)
    worker = EnvWorker(env)
    pid = worker._process.pid
    worker.reset(options=[{"index": 0}, {"index": 1}])
    killed(worker)
    message = f"the environment worker (pid {pid}) died: killed by SIGKILL"
    for call in (lambda: worker.step([codec.encode(" thinking"), None]), lambda: worker.submit({0: [1]}),
                 worker.collect, lambda: worker.set_reward_step(1), lambda: worker.reset(seed=0)):
        with pytest.raises(WorkerDied) as caught:
            call()
        assert str(caught.value) == message and isinstance(caught.value, RuntimeError)
        printed = "".join(traceback.format_exception(caught.value))
        assert "BrokenPipeError" not in printed and "EOFError" not in printed  # no pipe error chained to it
    worker.close()  # cleans up without raising
    worker.close()
    with pytest.raises(WorkerDied, match="died"):
        worker.collect()


@pytest.mark.timeout(120)
def test_a_worker_killed_with_steps_in_flight_is_reported_by_collect(codec):
    from search_env.worker import WorkerDied

    env = BatchSearchQAEnv(2, protocol="search-r1", tokenizer=codec, world_size=20)
    with EnvWorker(env) as worker:
        worker.reset(options=[{"index": 0}, {"index": 1}])
        os.kill(worker._process.pid, signal.SIGSTOP)  # the step below waits in the pipe, unanswered
        worker.submit({0: codec.encode(" thinking")})
        killed(worker)
        with pytest.raises(WorkerDied, match=rf"pid {worker._process.pid}\) died: killed by SIGKILL"):
            worker.collect()


@pytest.mark.timeout(120)
def test_an_error_reply_taken_in_by_submit_is_raised_by_collect(codec):
    env = BatchSearchQAEnv(2, protocol="search-r1", tokenizer=codec, world_size=20)
    with EnvWorker(env) as worker:
        worker.reset(options=[{"index": 0}, {"index": 1}])
        eos = min(codec.eos_ids)
        worker.step([[eos], None])  # episode 0 ends
        worker.submit({0: [eos]})  # the worker refuses
        assert worker._conn.poll(60)  # its refusal has arrived before the next submit
        worker.submit({1: codec.encode(" thinking")})  # takes the refusal in on the way, and must not raise it
        with pytest.raises(RuntimeError, match="episode 0 has ended"):
            worker.collect()
        with pytest.raises(RuntimeError, match="not collected"):  # row 1's result waits for the next collect
            worker.set_reward_step(1)
        assert set(worker.collect()) == {1}
        worker.set_reward_step(1)  # idle again
        # A reset of given questions is checked when its reply arrives: a submit that takes it in keeps the error too.
        question = env.envs[0].examples[2].question
        env.envs[0]._prompts[question] = ((1, 2, 3), b"abc", (1, 2, 3))
        worker.reset(options=[{"index": 2}, {"index": 1}])
        assert worker._conn.poll(60)
        worker.submit({1: codec.encode(" thinking")})
        with pytest.raises(RuntimeError, match="other prompts"):
            worker.collect()
