"""Aggregate statistics over RL runs that stay honest with few seeds, after Agarwal et al. 2021, "Deep
Reinforcement Learning at the Edge of the Statistical Precipice" (the definitions of its ``rliable``
package, written here against numpy alone so the benchmarks need no further dependency).

Scores are arrays of shape ``(runs, tasks)``: one row per run (seed), one column per task; every task has
the same number of runs. A one-task benchmark passes ``(runs, 1)``.

- :func:`iqm`: the interquartile mean, ``scipy.stats.trim_mean(scores, 0.25, axis=None)`` as rliable's
  ``aggregate_iqm`` takes it: the scores of all runs and tasks together, sorted, with ``floor(n / 4)`` cut
  from each end and the rest averaged (no fractional weighting of the boundary scores: for ``n`` not a
  multiple of 4 slightly more than half the scores are kept).
- :func:`stratified_bootstrap_ci`: a percentile interval of any such statistic, resampling runs with
  replacement within each task (the tasks are kept), from a seeded ``numpy.random.Generator``.
- :func:`performance_profile`: the fraction of runs whose score is above each threshold ``tau``, with
  bootstrap bands.
- :func:`probability_of_improvement`: ``P(X > Y)``, the chance that a run of algorithm X scores above a run
  of Y on a task (Mann-Whitney U over the pairs, a tie counting 1/2), averaged over tasks, with an interval
  from resampling X's and Y's runs independently within each task.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

__all__ = ["DEFAULT_REPS", "Interval", "Profile", "iqm", "performance_profile", "probability_of_improvement",
           "stratified_bootstrap_ci"]

#: Bootstrap resamples when a caller does not say (rliable's default for interval estimates).
DEFAULT_REPS = 2000


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap confidence interval ``[low, high]``."""

    value: float
    low: float
    high: float


def _scores(scores: Sequence[Sequence[float]] | np.ndarray, what: str = "scores") -> np.ndarray:
    array = np.asarray(scores, dtype=float)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"{what} must be a non-empty (runs, tasks) array, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{what} must be finite numbers")
    return array


def iqm(scores: Sequence[Sequence[float]] | np.ndarray) -> float:
    """The interquartile mean of all runs' scores on all tasks: sorted, ``floor(n / 4)`` cut from each end,
    the rest averaged (``scipy.stats.trim_mean(scores, 0.25, axis=None)``, rliable's definition). Robust to
    one outlying seed, unlike the mean, and less coarse than the median with few runs."""
    flat = np.sort(_scores(scores).ravel())
    cut = len(flat) // 4
    return float(flat[cut:len(flat) - cut].mean())


def _resample_indices(rng: np.random.Generator, runs: int, tasks: int, reps: int) -> np.ndarray:
    """Run indices of ``reps`` stratified resamples, shape ``(reps, runs, tasks)``: each task's column drawn
    with replacement from that task's own runs."""
    return rng.integers(0, runs, size=(reps, runs, tasks))


def _percentiles(values: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    tail = 100 * (1 - confidence) / 2
    return np.percentile(values, tail, axis=0), np.percentile(values, 100 - tail, axis=0)


def _check(reps: int, confidence: float) -> None:
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def stratified_bootstrap_ci(scores: Sequence[Sequence[float]] | np.ndarray,
                            statistic: Callable[[np.ndarray], float] = iqm, *, reps: int = DEFAULT_REPS,
                            confidence: float = 0.95, seed: int = 0) -> Interval:
    """``statistic`` of ``scores`` with its percentile interval over ``reps`` stratified bootstrap resamples
    (runs drawn with replacement within each task; ``numpy.random.default_rng(seed)``, so the interval is
    reproducible). With one run per task the interval is the point itself: one run says nothing of spread."""
    _check(reps, confidence)
    array = _scores(scores)
    runs, tasks = array.shape
    indices = _resample_indices(np.random.default_rng(seed), runs, tasks, reps)
    resampled = array[indices, np.arange(tasks)]  # (reps, runs, tasks)
    values = np.array([statistic(sample) for sample in resampled])
    low, high = _percentiles(values, confidence)
    return Interval(float(statistic(array)), float(low), float(high))


@dataclass(frozen=True)
class Profile:
    """A performance profile: per threshold ``taus[i]``, the fraction of runs scoring above it,
    ``fractions[i]``, within the bootstrap band ``[low[i], high[i]]``."""

    taus: list[float]
    fractions: list[float]
    low: list[float]
    high: list[float]


def _above(array: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """Per tau, the fraction of runs above it on each task, averaged over tasks; ``array`` may carry leading
    resample axes before ``(runs, tasks)``."""
    above = array[..., None] > taus  # (..., runs, tasks, taus)
    return above.mean(axis=-3).mean(axis=-2)


def performance_profile(scores: Sequence[Sequence[float]] | np.ndarray, taus: Sequence[float], *,
                        reps: int = DEFAULT_REPS, confidence: float = 0.95, seed: int = 0) -> Profile:
    """The fraction of runs (averaged over tasks) whose score is strictly above each ``tau``, with the
    percentile band of the same fraction over stratified bootstrap resamples. A profile shows the whole
    distribution of scores, where a table shows one number of it."""
    _check(reps, confidence)
    array = _scores(scores)
    grid = np.asarray(taus, dtype=float)
    if grid.ndim != 1 or len(grid) < 1:
        raise ValueError("taus must be a non-empty list of thresholds")
    runs, tasks = array.shape
    resampled = array[_resample_indices(np.random.default_rng(seed), runs, tasks, reps), np.arange(tasks)]
    low, high = _percentiles(_above(resampled, grid), confidence)
    return Profile(grid.tolist(), _above(array, grid).tolist(), low.tolist(), high.tolist())


def _improvement(x: np.ndarray, y: np.ndarray) -> float:
    """Mean over tasks of P(x > y) over all pairs of a run of x and a run of y, a tie counting 1/2."""
    greater = (x[:, None, :] > y[None, :, :]).mean(axis=(0, 1))
    ties = (x[:, None, :] == y[None, :, :]).mean(axis=(0, 1))
    return float((greater + 0.5 * ties).mean())


def probability_of_improvement(x: Sequence[Sequence[float]] | np.ndarray, y: Sequence[Sequence[float]] | np.ndarray, *,
                               reps: int = DEFAULT_REPS, confidence: float = 0.95, seed: int = 0) -> Interval:
    """``P(X > Y)``: the probability that a run of algorithm X scores above a run of Y on a task (every pair
    of their runs compared, a tie counting 1/2), averaged over tasks; 0.5 means no difference. The interval
    resamples X's runs and Y's runs independently within each task (X's first, from one generator)."""
    _check(reps, confidence)
    xs, ys = _scores(x, "x"), _scores(y, "y")
    if xs.shape[1] != ys.shape[1]:
        raise ValueError(f"x and y must score the same tasks, got {xs.shape[1]} and {ys.shape[1]}")
    rng = np.random.default_rng(seed)
    tasks = np.arange(xs.shape[1])
    x_samples = xs[_resample_indices(rng, xs.shape[0], xs.shape[1], reps), tasks]
    y_samples = ys[_resample_indices(rng, ys.shape[0], ys.shape[1], reps), tasks]
    values = np.array([_improvement(a, b) for a, b in zip(x_samples, y_samples)])
    low, high = _percentiles(values, confidence)
    return Interval(_improvement(xs, ys), float(low), float(high))
