"""When a training curve collapses: it falls well below its best level and never comes back.

A per-step curve (training reward, policy entropy) is noisy, so the rule reads its trailing rolling
mean: the mean of the last ``window`` values at each step (fewer at the first steps). A run
**collapses at step s** when

1. the rolling mean's peak ``P`` (its largest value over the whole run) is above 0, and
2. from step ``s`` to the end of the run the rolling mean stays below ``fraction x P`` (and ``s`` is
   the first step for which that holds), and
3. that stretch holds at least ``window`` steps: a fall in the last few steps may still recover, so
   it is not called a collapse.

A curve that dips and comes back is not a collapse (the stretch must reach the end), nor is one that
never rose above 0 (nothing to fall from). Missing points (a step with no value, e.g. no entropy in a
step whose update had no trained tokens) are left out before the rule is applied; ``s`` is the step
of the first point of the stretch.
"""
from __future__ import annotations

import math
from typing import Sequence

__all__ = ["collapse_step", "rolling_mean"]


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """The trailing mean of the last ``window`` values at each position (of fewer at the first ones).

    Raises:
        ValueError: ``window`` < 1.
    """
    if window < 1:
        raise ValueError(f"the rolling window must be >= 1, got {window}")
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def collapse_step(steps: Sequence[int], values: Sequence[float | None], *, fraction: float, window: int) -> int | None:
    """The step at which the curve ``values`` (one per entry of ``steps``) collapses by the module's
    rule, or ``None`` when it does not.

    Raises:
        ValueError: ``steps`` and ``values`` differ in length, ``fraction`` is not in (0, 1), or
            ``window`` < 1.
    """
    if len(steps) != len(values):
        raise ValueError(f"{len(steps)} steps but {len(values)} values")
    if not 0 < fraction < 1:
        raise ValueError(f"the collapse fraction must be in (0, 1), got {fraction}")
    points = [(s, v) for s, v in zip(steps, values) if v is not None and math.isfinite(v)]
    means = rolling_mean([v for _, v in points], window)
    if not means or max(means) <= 0:
        return None
    threshold = fraction * max(means)
    last_high = max(i for i, m in enumerate(means) if m >= threshold)
    first_low = last_high + 1
    if len(means) - first_low < window:
        return None
    return points[first_low][0]
