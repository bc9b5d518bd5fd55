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
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from search_env.batch import BatchOptions, BatchStep, per_episode_options
from search_env.data.example import QAExample
from search_env.protocols import Protocol
from search_env.tokenization import TokenCodec
from search_env.types import Info, Observation, StepResult
from search_env.vector import BatchSearchQAEnv

if TYPE_CHECKING:
    from search_env.env import SearchQAEnv

__all__ = ["EnvWorker", "StepResult"]


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
    finished episode) is raised again by the call that receives its reply, with the worker's message.
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
        self._process = multiprocessing.get_context("fork").Process(
            target=_serve, args=(env, child), name="searchqa-env-worker", daemon=True
        )
        self._process.start()
        child.close()
        self._conn: Connection | None = parent
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
    def protocol(self) -> Protocol:
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
        self._connection().send(("reset", (None, [{"example": example} for example in examples])))
        self._expected.append([obs["token_ids"] for obs, _ in firsts])
        return [obs for obs, _ in firsts], [info for _, info in firsts]

    def submit(self, actions: Mapping[int, Sequence[int]]) -> None:
        """Queue a step of the episodes in ``actions`` (row -> token ids); the others are left alone.
        Returns without waiting; replies that have already arrived are taken in on the way."""
        conn = self._connection()
        conn.send(("step", {int(row): list(ids) for row, ids in actions.items()}))
        self._expected.append(None)
        while self._expected and conn.poll():  # keep the pipe drained, so the worker never blocks on a reply
            self._receive()

    def collect(self) -> dict[int, StepResult]:
        """Wait for every queued step and return the rows' results (row -> observation, reward,
        terminated, truncated, info), each row as its last queued step left it."""
        self._drain()
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
        """Stop the worker (idempotent)."""
        if self._conn is None:
            return
        try:
            self._conn.send(("close", None))
        except (BrokenPipeError, OSError):
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
        if self._conn is None:
            raise RuntimeError("the EnvWorker is closed")
        return self._conn

    def _check_idle(self, what: str) -> None:
        if any(expected is None for expected in self._expected) or self._results:
            raise RuntimeError(f"{what}() while submitted steps are not collected: call collect() first")

    def _call(self, command: str, argument: Any) -> Any:
        self._drain()
        conn = self._connection()
        conn.send((command, argument))
        return _unwrap(self._recv(conn))

    def _drain(self) -> None:
        """Receive every reply still expected."""
        while self._expected:
            self._receive()

    def _receive(self) -> None:
        """Take in the next reply: a step's results, or the check of a reset answered ahead of it."""
        expected = self._expected.popleft()
        value = _unwrap(self._recv(self._connection()))
        if expected is None:
            results, self._flags, busy = value
            self._results.update(results)
            self.busy_s += busy
        elif [obs["token_ids"] for obs in value[0]] != expected:
            raise RuntimeError("the worker's reset gave other prompts than this side's copy of the environment")

    def _recv(self, conn: Connection) -> tuple[str, Any]:
        try:
            return conn.recv()
        except EOFError:
            raise RuntimeError(f"the environment worker died (exit code {self._process.exitcode})") from None


def _unwrap(reply: tuple[str, Any]) -> Any:
    status, value = reply
    if status == "error":
        raise value
    return value


def _serve(env: BatchSearchQAEnv, conn: Connection) -> None:
    """The worker's loop: answer each command with ("ok", value) or ("error", exception)."""
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
