"""What a batch of episodes offers the code that plays them: the :class:`BatchEnv` protocol.

Rollouts, trainers and warm starts step many episodes at once, in this process
(:class:`~search_env.vector.BatchSearchQAEnv`) or in a worker process
(:class:`~search_env.worker.EnvWorker`). Both satisfy :class:`BatchEnv`, so such code reads the
settings it needs (the dataset, the protocol, the tokenizer, the budgets) from the batch itself and
never from one of its episodes.
"""
from __future__ import annotations

import typing
from typing import Any, Sequence

import numpy as np

from search_env.data.example import QAExample
from search_env.protocols import Dialect
from search_env.tokenization import TokenCodec
from search_env.types import Info, Observation

if typing.TYPE_CHECKING:
    from search_env.env import SearchQAEnv

__all__ = ["BatchEnv", "BatchStep", "BatchOptions", "per_episode_options"]

#: What a batch step returns: per episode the observation, then arrays of rewards, terminated and
#: truncated flags (float64, bool, bool), then per episode the info.
BatchStep = tuple[list[Observation], np.ndarray, np.ndarray, np.ndarray, list[Info]]

#: Reset options: one dict for every episode, or one per episode (e.g. ``{"example": ...}``).
BatchOptions = typing.Union[dict, list[typing.Optional[dict]], tuple[typing.Optional[dict], ...], None]


def per_episode_options(options: BatchOptions, num_envs: int) -> list[dict | None]:
    """Reset options as one entry per episode (a list or tuple is that already)."""
    return list(options) if isinstance(options, (list, tuple)) else [options] * num_envs


@typing.runtime_checkable
class BatchEnv(typing.Protocol):
    """Episodes stepped together (``isinstance`` checks that the members exist, not their types).

    ``step`` takes one action per episode (a token id or a chunk; ``None`` leaves a finished episode
    alone) and returns a :data:`BatchStep`; an episode that ends is not reset until ``reset``.
    """

    @property
    def num_envs(self) -> int:
        """How many episodes run side by side."""

    @property
    def examples(self) -> list[QAExample]:
        """The dataset's questions (``{"index": i}`` in reset options picks ``examples[i]``)."""

    @property
    def protocol(self) -> Dialect:
        """The tag dialect the episodes speak (with the NL-DAG tools these sources offer)."""

    @property
    def codec(self) -> TokenCodec:
        """The tokenizer of the episodes' token ids."""

    @property
    def max_new_tokens(self) -> int:
        """Agent tokens per episode before truncation."""

    @property
    def max_context(self) -> int:
        """Total tokens per episode (prompt included) before truncation."""

    def make_env(self) -> SearchQAEnv:
        """A new single environment with these settings and the same dataset, sources and tokenizer,
        apart from the batch's episodes (e.g. to play a warm start's scripted demonstrations)."""

    def reset(self, *, seed: int | None = None, options: BatchOptions = None) -> tuple[list[Observation], list[Info]]:
        """Reset every episode; returns the observations and the infos."""

    def step(self, actions: Sequence[Any]) -> BatchStep:
        """Step every episode with its action (``None``: leave it alone)."""

    def set_reward_step(self, step: int) -> None:
        """Score the episodes that end from now on at training step ``step``."""

    def close(self) -> None:
        """Release the sources, threads and processes the batch holds."""
