"""A :class:`~search_env.BatchSearchQAEnv` stepped in a worker process, so that stepping overlaps generation.

A rollout generates for a batch of episodes in lockstep, and episodes end their chunks at different
decoding steps. In one process the environment can only step them after the whole batch has stopped,
so its work (scanning tags, searching, encoding results, scoring) adds to the rollout's time. An
:class:`EnvWorker` moves the episodes into a forked process: the rollout hands over each row's chunk as
soon as the row stops (:meth:`EnvWorker.submit`, which does not wait) and goes on decoding the others
while the worker steps it on another core, then gathers every result once the batch has stopped
(:meth:`EnvWorker.collect`). Only the time spent handing chunks over and waiting for the last results
remains on the rollout's side.

The worker is forked from the caller (the ``fork`` start method, so Linux), after the environment was
built: it shares the dataset and the search indexes copy-on-write and pickles nothing large (thread pools
of sources are restarted in it: :mod:`search_env._fork`; sources that run a PyTorch model are refused).
An :class:`EnvWorker` is a :class:`~search_env.batch.BatchEnv`: its settings (``protocol``, ``codec``,
``examples``, budgets) are read from the caller's own :class:`BatchSearchQAEnv`, which stays usable for
episodes of its own, independent of the worker's. Results are exactly those of stepping the environment
in the caller: the worker runs the same ``step``.

The worker never outlives its caller: it holds no copy of the caller's end of the pipe, so the caller's
exit (a crash or ``kill -9`` included) ends its wait for the next command, and on Linux it also asks the
kernel to kill it when the process that forked it dies (``PR_SET_PDEATHSIG``), which covers a caller
whose pipe end another forked process still holds. A worker that dies first is reported as
:class:`WorkerDied`, one line naming its pid and its exit code or signal.
"""
from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from search_env.batch import BatchOptions, BatchStep, per_episode_options
from search_env.data.example import QAExample
from search_env.protocols import Dialect
from search_env.tokenization import TokenCodec
from search_env.types import Info, Observation, StepResult
from search_env.vector import BatchSearchQAEnv

if TYPE_CHECKING:
    from search_env.env import SearchQAEnv

__all__ = ["EnvWorker", "StepResult", "WorkerDied"]


class WorkerDied(RuntimeError):
    """The environment worker process is gone (killed, crashed, out of memory): the message names its pid
    and how it ended. The worker's episodes are lost with it; close the :class:`EnvWorker` and start another."""


class EnvWorker:
    """``env``'s episodes, stepped in a forked worker process (see the module docstring).

    Args:
        env: the batch environment to serve; the worker gets a copy of it as it stands.

    Raises:
        RuntimeError: the platform cannot fork (the worker needs the ``fork`` start method).
        ValueError: a source cannot search from a forked process (:attr:`Source.fork_safe`: dense
            retrieval runs a PyTorch model); serve it with the retrieval server instead
            (:class:`~search_env.sources.remote.RemoteSource` is fork-safe).

    Use it as a context manager, or call :meth:`close`. ``reset`` and ``set_reward_step`` wait for the
    worker (a reset of given questions does not: see :meth:`reset`); ``submit`` queues a step and returns
    at once; ``collect`` waits for every queued step. An error inside the worker (a bad action, a
    finished episode) is raised again, with the worker's message, by the call that waits for its reply:
    ``collect`` (or ``step``) for a queued step or a reset of given questions, ``reset`` or
    ``set_reward_step`` for their own. ``submit`` never raises the worker's errors, even when it takes in
    replies that have already arrived; ``collect`` waits for every queued reply before raising the first
    error among them, and keeps the other rows' results for the next ``collect``. A worker process that
    died raises :class:`WorkerDied` from whichever call finds it gone.
    """

    def __init__(self, env: BatchSearchQAEnv) -> None:
        if "fork" not in multiprocessing.get_all_start_methods():
            raise RuntimeError("EnvWorker needs the 'fork' start method (Linux); step the BatchSearchQAEnv in-process instead")
        unsafe = sorted(name for name, source in env.searcher.sources.items() if not source.fork_safe)
        if unsafe:
            raise ValueError(f"sources {unsafe} cannot search from a forked worker (they run a PyTorch model in-process): "
                             "serve them with the retrieval server (RemoteSource), or step the environment in-process")
        self.env = env  #: the caller's copy, which the worker was forked from
        self.envs = env.envs  #: the caller's copy's environments (the worker's episodes are not in them)
        self.num_envs = env.num_envs
        # Objects that live as long as the program (the world, its indexes) move out of the collector's
        # reach, so that neither process walks them, and the child's collections do not copy their pages.
        gc.collect()
        gc.freeze()
        parent, child = multiprocessing.get_context("fork").Pipe()
        # The kernel's parent-death signal follows the thread that forks, not the process: asked for only
        # when the main thread forks, so that a worker started from a short-lived thread is not killed
        # when that thread ends (the closed pipe still ends it when the caller dies).
        forked_by_main = threading.current_thread() is threading.main_thread()
        self._process = multiprocessing.get_context("fork").Process(
            target=_serve, args=(env, child, parent, os.getpid() if forked_by_main else None),
            name="searchqa-env-worker", daemon=True,
        )
        self._process.start()
        child.close()
        self._conn: Connection | None = parent
        self._died: str | None = None  # how the worker ended, once it is found dead: every later call says so
        self._error: BaseException | None = None  # the first worker error taken in by submit, for collect to raise
        # The replies not received yet, in order: None for a step, a reset's prompts for a reset to check.
        self._expected: deque[list | None] = deque()
        self._results: dict[int, StepResult] = {}
        self._flags = (np.zeros(self.num_envs, dtype=bool), np.zeros(self.num_envs, dtype=bool))  # terminated, truncated
        self.busy_s = 0.0  #: the worker's time inside ``step`` for the steps collected so far

    # ---------------------------------------------------------------------------------------------
    @property
    def examples(self) -> list[QAExample]:
        """The dataset's questions (the caller's copy; the worker's are the same)."""
        return self.env.examples

    @property
    def protocol(self) -> Dialect:
        """The episodes' protocol."""
        return self.env.protocol

    @property
    def codec(self) -> TokenCodec:
        """The episodes' tokenizer."""
        return self.env.codec

    @property
    def max_new_tokens(self) -> int:
        """Agent tokens per episode before truncation."""
        return self.env.max_new_tokens

    @property
    def max_context(self) -> int:
        """Total tokens per episode before truncation."""
        return self.env.max_context

    @property
    def pid(self) -> int | None:
        """The worker process's id (to watch its memory or CPU from outside)."""
        return self._process.pid

    def make_env(self) -> SearchQAEnv:
        """A new single environment in this process with the episodes' settings (see
        :meth:`BatchSearchQAEnv.make_env`)."""
        return self.env.make_env()

    def reset(self, *, seed: int | None = None, options: BatchOptions = None) -> tuple[list[Observation], list[Info]]:
        """Reset every episode, as :meth:`BatchSearchQAEnv.reset` does.

        When every episode's question is given (``{"example": ...}`` or ``{"index": ...}``, no seed), the
        prompts are known here: the observations are built from this side's copy of the environment
        (:meth:`SearchQAEnv.first_observation`) and returned without waiting, while the worker resets;
        its own observations are checked against them when its reply arrives (a difference raises
        ``RuntimeError``). Otherwise this waits for the worker."""
        self._check_idle("reset")
        per_env = per_episode_options(options, self.num_envs)
        given = [o for o in per_env if o and ("example" in o or "index" in o)]
        if seed is not None or len(per_env) != self.num_envs or len(given) != len(per_env):
            return self._call("reset", (seed, options))
        examples = [o["example"] if "example" in o else env.examples[int(o["index"])] for o, env in zip(given, self.envs)]
        firsts = [env.first_observation(example) for env, example in zip(self.envs, examples)]
        self._send(("reset", (None, [{"example": example} for example in examples])))
        self._expected.append([obs["token_ids"] for obs, _ in firsts])
        return [obs for obs, _ in firsts], [info for _, info in firsts]

    def submit(self, actions: Mapping[int, Sequence[int]]) -> None:
        """Queue a step of the episodes in ``actions`` (row -> token ids); the others are left alone.
        Returns without waiting; replies that have already arrived are taken in on the way."""
        self._send(("step", {int(row): list(ids) for row, ids in actions.items()}))
        self._expected.append(None)
        while self._expected and self._poll():  # keep the pipe drained, so the worker never blocks on a reply
            self._receive()

    def collect(self) -> dict[int, StepResult]:
        """Wait for every queued step and return the rows' results (row -> observation, reward,
        terminated, truncated, info), each row as its last queued step left it. Raises the first error
        the worker replied with since the last ``collect`` (after every reply has been taken in)."""
        if not self._process.is_alive():  # even with nothing to wait for: a dead worker's episodes are gone
            self._connection()
            raise self._worker_died()
        self._drain()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        results, self._results = self._results, {}
        return results

    def step(self, actions: Sequence[Sequence[int] | None]) -> BatchStep:
        """Step as :meth:`BatchSearchQAEnv.step` does (``None``: leave the episode alone), waiting for the
        result: lists of observations and infos, and arrays of rewards, terminated and truncated flags."""
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        self.submit({row: ids for row, ids in enumerate(actions) if ids is not None})
        results = self.collect()
        terminated, truncated = self._flags[0].copy(), self._flags[1].copy()  # a row not stepped: its flags as they stand
        observations: list[Observation] = [{"token_ids": (), "producers": ()} for _ in range(self.num_envs)]
        infos: list[Info] = [{} for _ in range(self.num_envs)]
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        for row, (obs, reward, term, trunc, info) in results.items():
            observations[row], rewards[row], terminated[row], truncated[row], infos[row] = obs, reward, term, trunc, info
        return observations, rewards, terminated, truncated, infos

    def set_reward_step(self, step: int) -> None:
        """Score the episodes that end from now on at training step ``step`` (in the worker and here)."""
        self._check_idle("set_reward_step")
        self.env.set_reward_step(step)  # checks the value, and keeps the caller's copy in step
        self._call("reward_step", step)

    def close(self) -> None:
        """Stop the worker (idempotent; a worker that died is only cleaned up)."""
        if self._conn is None:
            return
        try:
            self._conn.send(("close", None))
        except (BrokenPipeError, OSError, ValueError):
            pass
        self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()
        self._conn.close()
        self._conn = None

    def __enter__(self) -> EnvWorker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    # ---------------------------------------------------------------------------------------------
    def _connection(self) -> Connection:
        if self._died is not None:
            raise WorkerDied(self._died)
        if self._conn is None:
            raise RuntimeError("the EnvWorker is closed")
        return self._conn

    def _check_idle(self, what: str) -> None:
        if any(expected is None for expected in self._expected) or self._results or self._error is not None:
            raise RuntimeError(f"{what}() while submitted steps are not collected: call collect() first")

    def _call(self, command: str, argument: Any) -> Any:
        self._drain()
        if self._error is not None:  # a reset's reply checked on the way: this call waited for it
            error, self._error = self._error, None
            raise error
        self._send((command, argument))
        return _unwrap(self._recv())

    def _drain(self) -> None:
        """Receive every reply still expected (a worker error is kept for the waiting call to raise)."""
        while self._expected:
            self._receive()

    def _receive(self) -> None:
        """Take in the next reply: a step's results, or the check of a reset answered ahead of it. A worker
        error (or a reset that disagrees) is kept, not raised: the call that waits for the reply raises it
        (:meth:`collect`), whichever call happened to take the reply in."""
        expected = self._expected.popleft()
        try:
            value = _unwrap(self._recv())
            if expected is not None and [obs["token_ids"] for obs in value[0]] != expected:
                raise RuntimeError("the worker's reset gave other prompts than this side's copy of the environment")
        except WorkerDied:
            raise
        except Exception as exc:  # noqa: BLE001 - kept for the waiting call
            if self._error is None:
                self._error = exc
            return
        if expected is None:
            results, self._flags, busy = value
            self._results.update(results)
            self.busy_s += busy

    def _send(self, message: tuple[str, Any]) -> None:
        conn = self._connection()
        try:
            conn.send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            raise self._worker_died() from None

    def _poll(self) -> bool:
        try:
            return self._connection().poll()
        except (BrokenPipeError, ConnectionResetError, EOFError):
            raise self._worker_died() from None

    def _recv(self) -> tuple[str, Any]:
        conn = self._connection()
        try:
            return conn.recv()
        except (EOFError, ConnectionResetError, BrokenPipeError):
            raise self._worker_died() from None

    def _worker_died(self) -> WorkerDied:
        """The error of a worker whose pipe broke (remembered: every later call raises it too)."""
        if self._died is None:
            self._process.join(timeout=5)  # the pipe breaks as the process ends: its exit status follows at once
            self._died = f"the environment worker (pid {self._process.pid}) died: {_how_it_ended(self._process.exitcode)}"
        return WorkerDied(self._died)


def _unwrap(reply: tuple[str, Any]) -> Any:
    status, value = reply
    if status == "error":
        raise value
    return value


def _how_it_ended(exitcode: int | None) -> str:
    """A process's exit status in words: its exit code or the signal that killed it."""
    if exitcode is None:
        return "its pipe closed, exit status not known yet"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to kill this process when its parent dies (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the closed pipe still ends the worker
            pass
    if os.getppid() != parent_pid:  # the parent died before the request was made
        os._exit(0)


def _serve(env: BatchSearchQAEnv, conn: Connection, parent_end: Connection, parent_pid: int | None) -> None:
    """The worker's loop: answer each command with ("ok", value) or ("error", exception).

    ``parent_end`` (the caller's end of the pipe, inherited by the fork) is closed first: while the worker
    held it, the caller's death could not close the pipe. With ``parent_pid`` the worker also dies with
    that process (:func:`_die_with_parent`)."""
    parent_end.close()
    if parent_pid is not None:
        _die_with_parent(parent_pid)
    # Ctrl-C reaches the whole process group; the caller decides when the worker stops (a trainer
    # finishes its step first), so the worker must not die of it mid-rollout.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The tokenizer library's threads were not copied either: it must not try to use them here.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    n = env.num_envs
    while True:
        try:
            command, argument = conn.recv()
        except EOFError:  # the caller is gone
            return
        try:
            if command == "close":
                return
            if command == "step":
                started = time.perf_counter()
                actions: list[Any] = [None] * n
                for row, ids in argument.items():
                    actions[row] = ids
                obs, rewards, terminated, truncated, infos = env.step(actions)
                value: Any = ({row: (obs[row], float(rewards[row]), bool(terminated[row]), bool(truncated[row]), infos[row])
                               for row in argument}, (terminated, truncated), time.perf_counter() - started)
            elif command == "reset":
                seed, options = argument
                value = env.reset(seed=seed, options=options)
            elif command == "reward_step":
                env.set_reward_step(argument)
                value = None
            else:
                raise ValueError(f"unknown command {command!r}")
            reply: tuple[str, Any] = ("ok", value)
        except Exception as exc:  # noqa: BLE001 - the caller raises it
            reply = ("error", exc)
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - an exception or value that does not pickle
            conn.send(("error", RuntimeError(f"the environment worker could not send its reply: {exc!r}")))
