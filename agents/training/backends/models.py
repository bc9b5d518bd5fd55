"""The models a backend trains besides the policy, built the same way for every backend: PPO's separate
critic (a copy of the policy's model with a value head), the frozen reference policy for KL terms (a copy
of the policy, or nothing with LoRA: the reference is then the policy's own base with its adapters off),
and the parameters an optimiser updates."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

import torch

from agents.learners.config import warmup_steps
from agents.policies.policy import HFPolicy, ValueModel
from agents.training.config import TrainConfig

if TYPE_CHECKING:
    from agents.learners import Algorithm

__all__ = ["TrainedModels", "frozen_copy", "trainable", "trained_models"]


@dataclass
class TrainedModels:
    """What an algorithm needs besides the policy, as keyword arguments of a backend's constructor.

    Attributes:
        critic: a separate value model (PPO without a value head), a copy of the policy's model; ``None``
            otherwise.
        critic_learning_rate: the critic's learning rate (``algorithm.critic_lr``; ``None``: the policy's).
        critic_warmup_steps: training steps of the critic's own linear warm-up.
        with_reference: whether to keep a frozen reference policy (the algorithm has a KL term).
    """

    critic: ValueModel | None = None
    critic_learning_rate: float | None = None
    critic_warmup_steps: int = 0
    with_reference: bool = False

    def options(self) -> dict[str, Any]:
        """The fields as keyword arguments (``Backend(policy, config, **models.options())``)."""
        return {"critic": self.critic, "critic_learning_rate": self.critic_learning_rate,
                "critic_warmup_steps": self.critic_warmup_steps, "with_reference": self.with_reference}


def trained_models(config: TrainConfig, policy: HFPolicy, algorithm: Algorithm) -> TrainedModels:
    """The critic and reference ``algorithm`` needs around ``policy``: a separate critic starts as a copy of
    the policy's model (on the policy's device), with the run's critic learning rate and warm-up."""
    if not (algorithm.uses_critic and not algorithm.value_head):
        return TrainedModels(with_reference=algorithm.uses_reference)
    algo = config.algorithm
    critic = ValueModel(copy.deepcopy(policy.model)).to(next(policy.parameters()).device)  # the new head too
    return TrainedModels(critic=critic, critic_learning_rate=algo.critic_lr,
                         critic_warmup_steps=warmup_steps(algo.critic_warmup_steps, algo.critic_warmup_ratio, config.run.steps),
                         with_reference=algorithm.uses_reference)


def frozen_copy(policy: HFPolicy, dtype: torch.dtype | None = None) -> HFPolicy:
    """A frozen copy of ``policy`` as it is now, for reference log-probs: evaluation mode (no dropout), no
    parameter requiring grad, in ``dtype`` when given (bf16 for a reference only ever run under autocast)."""
    reference = copy.deepcopy(policy)
    if dtype is not None and dtype != torch.float32:
        reference.to(dtype)
    reference.eval()
    for param in reference.parameters():
        param.requires_grad_(False)
    return reference


def trainable(params: Iterable[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """The parameters an optimiser updates: those that require grad (a LoRA base's are frozen)."""
    return [p for p in params if p.requires_grad]
