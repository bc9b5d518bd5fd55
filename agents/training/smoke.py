"""A recipe shrunk to a smoke run: the same model, data, protocol, reward, algorithm, backend and engine,
a few minutes' worth of steps (``python -m agents.train --config RECIPE --smoke``).

A seed recipe trains for hours (Search-R1's: 1005 steps of 512 questions x 5 samples of up to 2500 tokens).
Before that, a first trial checks that everything the recipe names loads and trains together; the settings
that only set its length and width are capped (:data:`SMOKE_CAPS`), each to at most its recipe value, so a
setting that is off (``0``) stays off. The rest - learning rate, KL, clipping, context, turns, top-k,
precision, backend - is the recipe's. The numbers a smoke run prints say nothing of the recipe's results.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agents.training.config import TrainConfig

__all__ = ["SMOKE_CAPS", "smoke_changes", "smoke_line"]

#: The most each length or width setting keeps in a smoke run.
SMOKE_CAPS: dict[str, int] = {
    "run.steps": 2,
    "rollout.questions_per_step": 2,
    "algorithm.group_size": 2,
    "env.max_new_tokens": 64,
    "optim.mini_batch_size": 4,
    "warm_start.steps": 4,
    "warm_start.copy_steps": 4,
    "warm_start.examples": 16,
    "warm_start.batch_size": 4,
    "eval.questions": 4,
}


def smoke_changes(config: TrainConfig) -> dict[str, Any]:
    """The ``{"group.field": value}`` changes that shrink ``config`` to a smoke run (module docstring): each of
    :data:`SMOKE_CAPS` lowered to its cap where the config sets more; ``run.stop_after`` and DAPO's
    ``algorithm.overlong_buffer`` lowered with what bounds them."""
    changes: dict[str, Any] = {}
    warm = config.warm_start.steps + config.warm_start.copy_steps > 0
    for key, cap in SMOKE_CAPS.items():
        group, _, name = key.partition(".")
        if group == "warm_start" and not warm:  # no warm start: its sizes are unused
            continue
        value = getattr(getattr(config, group), name)
        if value > cap:
            changes[key] = cap
    steps = changes.get("run.steps", config.run.steps)
    if config.run.stop_after is not None and config.run.stop_after > steps:
        changes["run.stop_after"] = steps
    max_new = changes.get("env.max_new_tokens", config.env.max_new_tokens)
    if getattr(config.algorithm, "overlong_buffer", 0) > max_new:
        changes["algorithm.overlong_buffer"] = max_new // 2
    return changes


def smoke_line(changes: dict[str, Any], config: TrainConfig) -> str:
    """The one line a smoke run prints: what it changed, from the recipe's value to the smoke run's."""
    def was(key: str) -> Any:
        group, _, name = key.partition(".")
        return getattr(getattr(config, group), name)

    shrunk = ", ".join(f"{key} {was(key)}->{value}" for key, value in changes.items())
    return f"smoke run (the recipe's other settings kept): {shrunk or 'the recipe is small already'}"
