"""What a rollout engine with its own copy of the weights must offer, declared once.

An engine that decodes the trained policy itself (the ``hf`` engine) cannot go stale. One that holds a copy
(the ``vllm`` and ``vllm-server`` engines) takes the trained weights after the optimiser steps, and the trainer
checks every such sync (:mod:`agents.rollout.sync_check`), keeps rollouts in flight while it updates
(``rollout.max_staleness``) and sends earlier weights to it from a snapshot. All of that reads members beyond
:class:`~agents.rollout.engines.RolloutEngine`'s: the sync counter, the precision, whether it serves LoRA
adapters, its own log-probs of given ids and a sync from given weights. Read by duck typing, an engine that
lacked one silently lost its sync check; here they are one base class, and an engine claims them by
inheriting it::

    class MyEngine(EngineWithWeights):
        logprobs_are_trainers = False
        decodes_trained_policy = False
        needs_policy = True
        reuse_logprobs = False

        def __init__(self, ...):
            self.syncs, self.dtype, self.lora = 0, "float32", False
        def sync(self, weights=None): ...
        def logprobs(self, sequences): ...
        ...                                  # agent, attach, sleep, wake_up, close, build

:func:`check_engine_with_weights` checks a built engine: one that claims the capability and lacks a member,
or one that counts syncs without claiming it (its syncs would go unchecked), fails with one line.
"""
from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterator, Sequence

__all__ = ["EngineWithWeights", "WeightSource", "check_engine_with_weights", "holds_own_weights"]

#: What a weight source yields (``backend.rollout_weights`` or a snapshot of it): (state-dict name, tensor).
WeightSource = Callable[..., Iterator[tuple[str, Any]]]


class EngineWithWeights(ABC):
    """A :class:`~agents.rollout.engines.RolloutEngine` that holds its own copy of the trained weights.

    Attributes (set by the engine, every instance):
        syncs: the weight syncs done so far; the sync check scores the engine each time it goes up.
        dtype: the precision the engine computes in (``"float32"``, ``"bfloat16"``, ``"auto"``); the sync
            check's default tolerance depends on it.
        lora: the engine serves the policy's LoRA adapters on a frozen base, so a sync (and a snapshot of
            the weights, ``rollout.max_staleness`` 2 and more) carries the adapters alone.
    """

    syncs: int
    dtype: str
    lora: bool
    #: With several data-parallel ranks, its rollouts and syncs take no collective of the trainer's group (its
    #: own agreements run on a group of their own), so a rollout may run ahead on a thread while an update
    #: takes the trainer's collectives (``rollout.max_staleness`` on ranks).
    rolls_ahead_on_ranks: bool = False

    @abstractmethod
    def sync(self, weights: WeightSource | None = None) -> None:
        """Take the policy's current weights now (from the backend the engine follows), or those ``weights``
        yields when given (called as ``backend.rollout_weights`` is, ``adapters=lora``: a copy of earlier
        weights, for a rollout launched behind others), and count the sync in :attr:`syncs`."""

    @abstractmethod
    def logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """The engine's log-prob of each id given the ids before it, at temperature 1, token-aligned like
        :meth:`HFPolicy.forward <agents.policies.policy.HFPolicy.forward>` (entry 0 is 0); the sync check
        compares them with the trainer's."""


#: The instance members :class:`EngineWithWeights` declares besides its abstract methods.
_ATTRIBUTES = ("syncs", "dtype", "lora")


def holds_own_weights(engine: Any) -> bool:
    """Whether ``engine`` (an engine or an engine class) claims its own copy of the weights."""
    return isinstance(engine, EngineWithWeights) or (isinstance(engine, type) and issubclass(engine, EngineWithWeights))


def check_engine_with_weights(engine: Any) -> None:
    """Raise ``ValueError`` (one line naming what is missing) when ``engine`` claims
    :class:`EngineWithWeights` but lacks one of its members, its ``sync`` takes no ``weights`` or it says it
    decodes the trained policy itself; or when it counts syncs (``syncs``) without claiming it, so that the
    trainer would never check them."""
    name = type(engine).__name__
    if isinstance(engine, EngineWithWeights) and getattr(engine, "decodes_trained_policy", False):
        raise ValueError(f"engine {name} is an EngineWithWeights but decodes_trained_policy: an engine decodes the "
                         "trained policy itself or holds a copy of its weights, not both")
    if not isinstance(engine, EngineWithWeights):
        if hasattr(engine, "syncs"):
            raise ValueError(f"engine {name} counts weight syncs but is no EngineWithWeights, so they would go "
                             "unchecked: subclass agents.rollout.engine_weights.EngineWithWeights")
        return
    missing = [attribute for attribute in _ATTRIBUTES if not hasattr(engine, attribute)]
    if "weights" not in inspect.signature(engine.sync).parameters:
        missing.append("sync(weights=...)")
    if missing:
        raise ValueError(f"engine {name} is an EngineWithWeights but lacks {', '.join(missing)} "
                         "(see agents.rollout.engine_weights.EngineWithWeights)")
