"""The environment's interface types: what an action and an observation are, and what a step returns.

An action is one token id or a chunk of ids (what an LLM generated up to a stop string); an
observation is the tokens that became visible in a step, each with the code of who produced it
(:data:`~search_env.trajectory.AGENT` or :data:`~search_env.trajectory.ENVIRONMENT`).
"""
from __future__ import annotations

from typing import Any, Sequence, TypedDict, Union, cast

import numpy as np
from gymnasium import spaces

__all__ = ["Action", "Observation", "Info", "StepResult", "action_ids", "observation_space"]


class Observation(TypedDict):
    """The tokens that became visible in a step (the agent's echo and anything the environment
    appended), and per token who produced it."""

    token_ids: tuple[int, ...]
    producers: tuple[int, ...]


#: One token id, or a chunk of ids (a list, tuple or integer array).
Action = Union[int, np.integer, Sequence[int], np.ndarray]

#: A step's or a reset's ``info`` dict (see :meth:`search_env.SearchQAEnv.step` for its keys).
Info = dict[str, Any]


#: One episode's step, as Gymnasium's ``step`` returns it: observation, reward, terminated, truncated,
#: info. A plain tuple, not a named one: building a named tuple per token would slow the token step.
StepResult = tuple[Observation, float, bool, bool, Info]


def observation_space(vocab: int) -> spaces.Space[Observation]:
    """The space of :class:`Observation` for a vocabulary of ``vocab`` ids: a ``Dict`` of two
    variable-length sequences."""
    space = spaces.Dict(
        {"token_ids": spaces.Sequence(spaces.Discrete(vocab)), "producers": spaces.Sequence(spaces.Discrete(2))}
    )
    return cast("spaces.Space[Observation]", space)  # a Dict space's samples are plain dicts


def action_ids(action: Any, vocab: int) -> tuple[list[int], bool]:
    """The checked token ids of ``action`` and whether it was a chunk (rather than one id).

    Raises ``ValueError`` for anything but an integer id or a sequence or array of integer ids (a
    float, a str or bools), and for an id outside ``[0, vocab)``.
    """
    if isinstance(action, (list, tuple)):  # first: a chunk is the usual action that gets here
        ids, chunk = list(action), True
        # Plain ints in range (a sampler's chunk) pass in one loop, cheaper than the C-level passes
        # below for chunks of up to hundreds of ids; anything else gets the full checks and their messages.
        for t in ids:
            if type(t) is not int or t < 0 or t >= vocab:
                break
        else:
            return ids, chunk
        kinds = set(map(type, ids))
        if kinds - {int}:
            if not all(kind is not bool and issubclass(kind, (int, np.integer)) for kind in kinds):
                names = ", ".join(sorted(kind.__name__ for kind in kinds))
                raise ValueError(f"token ids must be integers, not {names}")
            ids = [int(t) for t in ids]
    elif type(action) is int or isinstance(action, np.integer):
        ids, chunk = [int(action)], False
    elif isinstance(action, np.ndarray) or hasattr(action, "__array__"):
        array = np.asarray(action)
        if array.dtype.kind not in "iu":
            raise ValueError(f"token ids must be integers, not an array of {array.dtype}")
        ids, chunk = array.reshape(-1).tolist(), True
    else:
        raise ValueError(f"an action is a token id (int) or a sequence of ids, not {type(action).__name__}")
    if ids and (min(ids) < 0 or max(ids) >= vocab):
        raise ValueError(f"token ids must lie in [0, {vocab}) (the action space)")
    return ids, chunk
