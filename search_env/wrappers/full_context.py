"""Observe the whole context (prompt, agent tokens, results) instead of only what is new."""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class FullContextObservation(gym.ObservationWrapper):
    """Each observation is the episode's entire token sequence so far, with its producer flags.

    Useful for policies that re-encode the whole context each step; LLM rollouts should prefer the
    base environment's incremental observations (they are what a KV cache needs).
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._ids: list[np.ndarray] = []
        self._producers: list[np.ndarray] = []

    def reset(self, **kwargs: Any):
        self._ids, self._producers = [], []
        return super().reset(**kwargs)

    def observation(self, observation: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._ids.append(observation["token_ids"])
        self._producers.append(observation["producers"])
        return {"token_ids": np.concatenate(self._ids), "producers": np.concatenate(self._producers)}
