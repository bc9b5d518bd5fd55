"""The ``hf`` rollout engine: the trained model itself samples the episodes
(:class:`~agents.rollout.hf_sampler.HFSampler`), so its log-probs are the trainer's own and it always
decodes the current weights (nothing to sync)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.rollout.agent import RolloutAgent
from agents.rollout.engines import EngineSetup, register_engine

__all__ = ["HFEngine", "HFEngineOptions"]


@dataclass
class HFEngineOptions:
    """Options of ``rollout.engine: hf``.

    Attributes:
        reuse_logprobs: the sampler's own log-probs are the rollout policy's log-probs (one forward pass
            fewer when the update takes several optimiser steps); they agree with a recomputation to float
            precision, as the sampler runs the trained model itself.
    """

    reuse_logprobs: bool = False


class HFEngine:
    """A :class:`~agents.rollout.engines.RolloutEngine` over ``policy`` itself: each agent is an
    :class:`~agents.rollout.hf_sampler.HFSampler` at the engine's temperature and top-p.

    The sampler's module (torch, transformers) is imported with the first agent, not with the run's
    config, whose ``--help`` reads this module.

    Args:
        policy: the :class:`~agents.policies.policy.HFPolicy` whose model decodes (the trained one, in training).
        temperature / top_p: how sampled agents sample.
        reuse_logprobs: see :class:`HFEngineOptions`.
    """

    logprobs_are_trainers = True
    decodes_trained_policy = True
    needs_policy = True

    def __init__(self, policy: Any, *, temperature: float = 1.0, top_p: float = 1.0, reuse_logprobs: bool = False) -> None:
        self.policy, self.temperature, self.top_p = policy, temperature, top_p
        self.reuse_logprobs = reuse_logprobs

    @classmethod
    def build(cls, options: HFEngineOptions, setup: EngineSetup) -> HFEngine:
        return cls(setup.policy, temperature=setup.temperature, top_p=setup.top_p, reuse_logprobs=options.reuse_logprobs)

    def agent(self, *, greedy: bool, seed: int, first_row: int = 0) -> RolloutAgent:
        from agents.rollout.hf_sampler import HFSampler

        return HFSampler(self.policy, temperature=self.temperature, top_p=self.top_p, greedy=greedy, seed=seed,
                         first_row=first_row)

    def attach(self, backend: Any) -> HFEngine:
        """Nothing to follow: the sampler reads the trained parameters themselves."""
        return self

    def sync(self) -> None:
        """Nothing to take: the weights are the policy's own."""

    def sleep(self) -> None:
        """Nothing to release: the model is the trainer's."""

    def wake_up(self) -> None:
        """Always ready."""

    def close(self) -> None:
        """Nothing held beyond the policy, which is the caller's."""


register_engine("hf", HFEngine, options=HFEngineOptions)
