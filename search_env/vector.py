"""Many SearchQA episodes stepped together, with each source answering one batch per round.

An LLM rollout generates for a whole batch of prompts at once and hands every episode its chunk. The
episodes' search calls are gathered: every source receives all pending queries in one ``search`` call
(one BM25 pass, one encoder batch, one HTTP request), and NL-DAG plans of different episodes run on
worker threads side by side. An episode whose chunk runs past its call continues once the results are
in, and may issue another call in a later round of the same ``step``.

This is a documented batch environment rather than a ``gymnasium.vector.VectorEnv``: observations are
variable-length token arrays, and episodes end at different times, so ``step`` takes ``None`` for a
finished episode instead of auto-resetting it.
"""
from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import numpy as np

from search_env._fork import forget_threads_after_fork
from search_env.env import PlanRequest, Request, SearchQAEnv, SearchRequest

__all__ = ["BatchSearchQAEnv"]


class BatchSearchQAEnv:
    """``num_envs`` :class:`SearchQAEnv` episodes that share their tokenizer, data and sources.

    Args:
        num_envs: how many episodes run side by side.
        **env_kwargs: passed to :class:`SearchQAEnv` (built once; the others share its examples,
            sources and tokenizer, so the synthetic world and its indexes are built only once).
    """

    def __init__(self, num_envs: int, **env_kwargs: Any) -> None:
        if num_envs < 1:
            raise ValueError("num_envs must be >= 1")
        first = SearchQAEnv(**env_kwargs)
        shared = dict(env_kwargs, dataset=first.examples, sources=first.sources, tokenizer=first.codec,
                      cache_size=0, source_timeout_s=None)  # the first env's sources are wrapped already
        shared.setdefault("default_source", first.default_source)
        shared.setdefault("source_aliases", first.source_aliases)
        self.envs = [first] + [SearchQAEnv(**shared) for _ in range(num_envs - 1)]
        self.num_envs = num_envs
        self.single_action_space = first.action_space
        self.single_observation_space = first.observation_space
        self._pool: ThreadPoolExecutor | None = None
        forget_threads_after_fork(self, _drop_pool)

    def reset(self, *, seed: int | None = None, options: Sequence[dict | None] | dict | None = None):
        """Reset every episode (episode ``i`` gets seed ``seed + i``); ``options`` may be one dict per
        episode (e.g. ``{"index": i}``). Returns lists of observations and infos."""
        per_env = options if isinstance(options, (list, tuple)) else [options] * self.num_envs
        results = [
            env.reset(seed=None if seed is None else seed + i, options=per_env[i]) for i, env in enumerate(self.envs)
        ]
        return [r[0] for r in results], [r[1] for r in results]

    def step(self, actions: Sequence[int | Sequence[int] | None]):
        """Feed each episode a token id or chunk (``None`` for a finished episode, which is left alone).

        Returns lists of observations and infos, and arrays of rewards, terminated and truncated flags.
        """
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        checked = {}
        for i, (env, action) in enumerate(zip(self.envs, actions)):
            if action is not None and env.done:
                raise RuntimeError(f"episode {i} has ended: pass None as its action, or reset it")
            if action is not None:
                checked[i] = env.check_action(action)  # all checked before any episode starts: a bad one changes nothing
        pending = {i: self.envs[i].start_checked_step(*ids_chunk) for i, ids_chunk in checked.items()}
        pending = {i: request for i, request in pending.items() if request is not None}
        while pending:
            answers = self._answer_round(pending)
            pending = {i: self.envs[i].take_results(answers[i]) for i in pending}
            pending = {i: request for i, request in pending.items() if request is not None}

        observations, infos = [], []
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        for i, env in enumerate(self.envs):
            if i in checked:
                obs, rewards[i], terminated[i], truncated[i], info = env.finish_step()
            else:  # not stepped: nothing new, the flags as they stand (properties reading one attribute each: cheap)
                obs, info = {"token_ids": (), "producers": ()}, {}
                terminated[i], truncated[i] = env.terminated, env.truncated
            observations.append(obs)
            infos.append(info)
        return observations, rewards, terminated, truncated, infos

    def set_reward_step(self, step: int) -> None:
        """Score the episodes that end from now on at training step ``step`` (see
        :meth:`SearchQAEnv.set_reward_step`); a trainer calls it every step."""
        for env in self.envs:
            env.set_reward_step(step)

    def _answer_round(self, pending: dict[int, Request]) -> dict[int, Any]:
        """Answer one round of requests: one batched call per source with each distinct query once,
        plans side by side on threads."""
        answers: dict[int, Any] = {}
        by_source: dict[tuple[int, str], list[int]] = defaultdict(list)
        plans: list[int] = []
        for i, request in pending.items():
            if isinstance(request, SearchRequest):
                source = self.envs[i].sources[request.source]
                by_source[(id(source), request.source)].append(i)
            elif isinstance(request, PlanRequest):
                plans.append(i)
            else:
                raise TypeError(f"unknown request {request!r}")
        if plans:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="searchqa-plans")
            futures = {i: self._pool.submit(self.envs[i].run_plan, pending[i]) for i in plans}
        for (_, name), members in by_source.items():
            env = self.envs[members[0]]
            k = max(pending[i].k for i in members)
            # A group's samples often ask the same query in the same round: each distinct query runs once.
            queries = list(dict.fromkeys(pending[i].query for i in members))
            found = dict(zip(queries, env.search_batch(name, queries, k)))
            for i in members:
                result = found[pending[i].query]
                answers[i] = result if isinstance(result, BaseException) else result[: pending[i].k]
        if plans:
            for i, future in futures.items():
                answers[i] = future.result()
        return answers

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self.envs[0].close()


def _drop_pool(env: BatchSearchQAEnv) -> None:
    env._pool = None
