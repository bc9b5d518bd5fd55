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

from typing import Any, Sequence

import numpy as np

from search_env.batch import BatchOptions, BatchStep, per_episode_options
from search_env.data.example import QAExample
from search_env.env import SearchQAEnv
from search_env.protocols import Dialect
from search_env.tokenization import TokenCodec
from search_env.types import Action, Info, Observation

__all__ = ["BatchSearchQAEnv"]


class BatchSearchQAEnv:
    """``num_envs`` :class:`SearchQAEnv` episodes that share their tokenizer, data and sources; a
    :class:`~search_env.batch.BatchEnv`.

    Args:
        num_envs: how many episodes run side by side.
        **env_kwargs: passed to :class:`SearchQAEnv` (built once; the others share its examples,
            sources and tokenizer, so the synthetic world and its indexes are built only once).

    ``envs`` holds the episodes' environments, for reading each one's trajectory; the settings are
    the batch's own properties.
    """

    def __init__(self, num_envs: int, **env_kwargs: Any) -> None:
        if num_envs < 1:
            raise ValueError("num_envs must be >= 1")
        first = SearchQAEnv(**env_kwargs)
        self._shared = dict(env_kwargs, dataset=first.examples, sources=first.sources, tokenizer=first.codec,
                            cache_size=0, source_timeout_s=None)  # the first env's sources are wrapped already
        self._shared.setdefault("default_source", first.default_source)
        self._shared.setdefault("source_aliases", first.source_aliases)
        self.envs = [first] + [SearchQAEnv(**self._shared) for _ in range(num_envs - 1)]
        self.searcher = first.searcher  #: answers every episode's search requests (the sources are shared)
        self.num_envs = num_envs
        self.single_action_space = first.action_space
        self.single_observation_space = first.observation_space

    @property
    def examples(self) -> list[QAExample]:
        """The dataset's questions, shared by every episode."""
        return self.envs[0].examples

    @property
    def protocol(self) -> Dialect:
        """The episodes' protocol."""
        return self.envs[0].protocol

    @property
    def codec(self) -> TokenCodec:
        """The episodes' tokenizer."""
        return self.envs[0].codec

    @property
    def max_new_tokens(self) -> int:
        """Agent tokens per episode before truncation."""
        return self.envs[0].max_new_tokens

    @property
    def max_context(self) -> int:
        """Total tokens per episode before truncation."""
        return self.envs[0].max_context

    def make_env(self) -> SearchQAEnv:
        """A new :class:`SearchQAEnv` with the batch's settings, sharing its dataset, sources and
        tokenizer; its episodes are its own, apart from the batch's. Leave closing to the batch (the
        sources are shared)."""
        return SearchQAEnv(**self._shared)

    def reset(self, *, seed: int | None = None, options: BatchOptions = None) -> tuple[list[Observation], list[Info]]:
        """Reset every episode (episode ``i`` gets seed ``seed + i``); ``options`` may be one dict per
        episode (e.g. ``{"index": i}``). Returns lists of observations and infos."""
        per_env = per_episode_options(options, self.num_envs)
        results = [
            env.reset(seed=None if seed is None else seed + i, options=per_env[i]) for i, env in enumerate(self.envs)
        ]
        return [r[0] for r in results], [r[1] for r in results]

    def step(self, actions: Sequence[Action | None]) -> BatchStep:
        """Feed each episode a token id or chunk (``None`` for a finished episode, which is left alone).

        The episodes' search calls are answered in rounds by :attr:`searcher`, all episodes' requests
        of a round together. Returns
        lists of observations and infos, and arrays of rewards, terminated and truncated flags.
        """
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        checked = {}
        for i, (env, action) in enumerate(zip(self.envs, actions)):
            if action is not None and env.done:
                raise RuntimeError(f"episode {i} has ended: pass None as its action, or reset it")
            if action is not None:
                checked[i] = env.check_action(action)  # all checked before any episode starts: a bad one changes nothing
        started = {i: self.envs[i].start_checked_step(*ids_chunk) for i, ids_chunk in checked.items()}
        pending = {i: request for i, request in started.items() if request is not None}
        while pending:
            answers = self.searcher.answer(pending)
            following = {i: self.envs[i].take_results(answers[i]) for i in pending}
            pending = {i: request for i, request in following.items() if request is not None}

        observations: list[Observation] = []
        infos: list[Info] = []
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        for i, env in enumerate(self.envs):
            if i in checked:
                obs, rewards[i], terminated[i], truncated[i], info = env.finish_step()
            else:  # not stepped: nothing new, the flags as they stand (cheap properties)
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

    def close(self) -> None:
        """Close the shared sources and the threads that run NL-DAG plans."""
        self.searcher.close()
