"""The ``hf`` rollout engine: the trained model itself samples the episodes
(:class:`~agents.rollout.hf_sampler.HFSampler`), so its log-probs are the trainer's own."""
from __future__ import annotations

from dataclasses import dataclass

from agents.rollout.engines import register_engine

__all__ = ["HFEngineOptions"]


@dataclass
class HFEngineOptions:
    """Options of ``rollout.engine: hf``.

    Attributes:
        reuse_logprobs: the sampler's own log-probs are the rollout policy's log-probs (one forward pass
            fewer when the update takes several optimiser steps); they agree with a recomputation to float
            precision, as the sampler runs the trained model itself.
    """

    reuse_logprobs: bool = False


def _build(config, policy, backend):
    return None  # the trainer's own sampler over the trained policy


register_engine("hf", options=HFEngineOptions, build=_build)
