"""Learning-rate schedules of every backend, and what a resumed optimiser keeps of its run's settings.

The RL schedules count training steps (:meth:`TrainingBackend.finish_step
<agents.training.backends.base.TrainingBackend.finish_step>`), as the seed systems do; the warm start's
counts its own optimiser steps (:meth:`TrainingBackend.supervised
<agents.training.backends.base.TrainingBackend.supervised>`). Both are factors of a base rate, as
``torch.optim.lr_scheduler.LambdaLR`` takes them.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

__all__ = ["linear_warmup", "optimizer_settings", "restore_optimizer_settings", "warmup_cosine", "warmup_schedule"]


def linear_warmup(steps: int) -> Callable[[int], float]:
    """A learning-rate factor rising linearly over ``steps`` (then 1): step ``s`` (from 0) gets ``(s + 1) / steps``."""
    return lambda done: 1.0 if steps <= 0 else min(1.0, (done + 1) / steps)


def warmup_schedule(optimizer: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """``optimizer``'s schedule in a run: :func:`linear_warmup` over ``steps`` training steps, then constant."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, linear_warmup(steps))


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """The warm start's factor at optimiser step ``step`` (from 0): linear warm-up to 1 over ``warmup`` steps,
    then a cosine decay to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1.0 + math.cos(math.pi * min((step - warmup) / max(total - warmup, 1), 1.0)))


def optimizer_settings(optimizer: torch.optim.Optimizer, scheduler: Any) -> tuple[list[dict[str, Any]], list[float]]:
    """An optimiser's settings per parameter group (all but its parameters and rates) and its schedule's base
    rates, taken before a checkpoint's states are loaded over them (see :func:`restore_optimizer_settings`)."""
    groups = [{k: v for k, v in group.items() if k not in ("params", "lr", "initial_lr")} for group in optimizer.param_groups]
    return groups, list(scheduler.base_lrs)


def restore_optimizer_settings(optimizer: torch.optim.Optimizer, scheduler: Any,
                               saved: tuple[list[dict[str, Any]], list[float]]) -> None:
    """Put back settings taken by :func:`optimizer_settings` over a loaded state, and set each group's rate as
    the schedule computes it at its restored position (the loaded rate when nothing changed): a setting
    deliberately changed on resume takes effect, and the run's own config gives the saved rates."""
    groups, base_lrs = saved
    scheduler.base_lrs = list(base_lrs)
    for group, settings, base, factor in zip(optimizer.param_groups, groups, base_lrs, scheduler.lr_lambdas):
        group.update(settings)
        group["initial_lr"] = base
        group["lr"] = base * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
