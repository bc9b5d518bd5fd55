"""A fixed-size window of the latest tokens, for classic RL libraries that need fixed-shape spaces."""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class FixedWindowObservation(gym.ObservationWrapper):
    """Observe the last ``window`` tokens of the context, left-padded.

    The observation space is a ``Dict`` of fixed-shape spaces (``token_ids``: ``Box`` of ids,
    ``producers``: 1 where the agent produced the token, ``attention_mask``: 1 where a real token
    stands), which Stable-Baselines3 and most RL libraries accept. Padding uses the tokenizer's pad id.
    """

    def __init__(self, env: gym.Env, window: int = 512) -> None:
        super().__init__(env)
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        base = env.unwrapped
        self._pad = int(base.codec.pad_id)
        vocab = int(base.action_space.n)
        self.observation_space = spaces.Dict(
            {
                "token_ids": spaces.Box(low=0, high=vocab - 1, shape=(window,), dtype=np.int64),
                "producers": spaces.MultiBinary(window),
                "attention_mask": spaces.MultiBinary(window),
            }
        )
        self._ids = np.full(window, self._pad, dtype=np.int64)
        self._producers = np.zeros(window, dtype=np.int8)
        self._mask = np.zeros(window, dtype=np.int8)

    def reset(self, **kwargs: Any):
        self._ids[:] = self._pad
        self._producers[:] = 0
        self._mask[:] = 0
        return super().reset(**kwargs)

    def observation(self, observation: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
        new_ids, new_producers = np.asarray(observation["token_ids"]), np.asarray(observation["producers"])
        n = min(len(new_ids), self.window)
        if n:
            for buf, new in ((self._ids, new_ids), (self._producers, new_producers), (self._mask, None)):
                buf[:-n] = buf[n:].copy() if n < self.window else buf[:0]
                buf[-n:] = 1 if new is None else new[-n:]
        return {"token_ids": self._ids.copy(), "producers": self._producers.copy(), "attention_mask": self._mask.copy()}
