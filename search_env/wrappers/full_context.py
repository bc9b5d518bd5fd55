"""Observe the whole context (prompt, agent tokens, results) instead of only what is new."""
from __future__ import annotations

from typing import Any

import gymnasium as gym


class FullContextObservation(gym.ObservationWrapper):
    """Each observation is the episode's entire token sequence so far, with its producer flags.

    Useful for policies that re-encode the whole context each step; LLM rollouts should prefer the
    base environment's incremental observations (they are what a KV cache needs).
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._ids: list[int] = []
        self._producers: list[int] = []

    def reset(self, **kwargs: Any):
        self._ids, self._producers = [], []
        return super().reset(**kwargs)

    def observation(self, observation: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        self._ids.extend(observation["token_ids"])
        self._producers.extend(observation["producers"])
        return {"token_ids": tuple(self._ids), "producers": tuple(self._producers)}
