"""The RL algorithm benchmark's summaries over runs (:mod:`benchmarks.algorithms`): each algorithm's final
values as mean, standard deviation, lowest and highest over seeds; the interquartile mean of its final
held-out EM and of the area under its held-out EM curve with stratified-bootstrap 95% intervals, and the
steps and episodes each run took to reach EM thresholds; the probability of improvement between
algorithm pairs (:mod:`benchmarks.common.rl_statistics`); as markdown tables and CSV files, and one plot
per metric."""
from __future__ import annotations

import csv
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from benchmarks.common.algorithm_runs import COLLAPSE_FRACTIONS, METRICS, RunRecord
from benchmarks.common.rl_statistics import (
    DEFAULT_REPS, Interval, performance_profile, probability_of_improvement, stratified_bootstrap_ci,
)

__all__ = ["PROFILE_TAUS", "THRESHOLDS", "area_under_curve", "final_value", "format_improvements", "format_table", "improvements", "plot_metric",
           "plot_profiles", "profiles", "summarize", "to_threshold", "write_csvs"]

#: Held-out EM levels whose first crossing is recorded per run (steps and episodes to reach them).
THRESHOLDS = (0.5, 0.8)

#: The thresholds of the performance profiles: held-out EM 0, 0.05, ..., 1.
PROFILE_TAUS = tuple(i / 20 for i in range(21))


def final_value(record: RunRecord, metric: str, window: int) -> float | None:
    """A run's final value of ``metric``: the mean of its last ``window`` steps' values for a step metric;
    the ``"final"`` evaluation's for a held-out one (``None`` when it has none, e.g. a metric recorded only
    since a later version than the run's record)."""
    if METRICS[metric][1]:
        finals = [p[metric] for p in record.evaluations if p["stage"] == "final"]
        return finals[-1] if finals else None
    values = [p[metric] for p in record.steps if p.get(metric) is not None][-window:]
    return statistics.fmean(values) if values else None


def area_under_curve(record: RunRecord, metric: str = "heldout_em") -> float | None:
    """The area under a run's held-out ``metric`` curve over its evaluations (the start's included), by the
    trapezoid rule, divided by the span of their steps: the curve's mean level over training, which
    rewards reaching a level early where the final value does not. ``None`` with fewer than two evaluated
    steps."""
    points = sorted((p["step"], p[metric]) for p in record.evaluations if p[metric] is not None)
    if len(points) < 2 or points[-1][0] == points[0][0]:
        return None
    area = sum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in zip(points, points[1:]))
    return area / (points[-1][0] - points[0][0])


def to_threshold(record: RunRecord, threshold: float, metric: str = "heldout_em") -> dict[str, Any] | None:
    """The first evaluation at which the run's held-out ``metric`` reached ``threshold`` (>=): its ``step``,
    the training ``episodes`` rolled out up to it (0 at the start) and the process CPU minutes spent up to
    the end of that step (``cpu_minutes``; 0 at the start, ``None`` in a record made before steps kept their
    CPU time); ``None`` when it never did."""
    by_step = {p["step"]: p for p in record.steps}
    for point in sorted(record.evaluations, key=lambda p: p["step"]):
        if point[metric] is not None and point[metric] >= threshold:
            step = point["step"]
            if step == 0:
                return {"step": 0, "episodes": 0, "cpu_minutes": 0.0}
            cpu = by_step[step].get("cpu_s")
            return {"step": step, "episodes": by_step[step]["episodes"], "cpu_minutes": None if cpu is None else cpu / 60}
    return None


def _start_em(record: RunRecord) -> float | None:
    starts = [p["heldout_em"] for p in record.evaluations if p["stage"] == "start"]
    return starts[0] if starts else None


def _spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean, sample standard deviation (0 for one value), min and max of the values that are not ``None``."""
    present = [v for v in values if v is not None]
    if not present:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(present), "std": statistics.stdev(present) if len(present) > 1 else 0.0,
            "min": min(present), "max": max(present), "n": len(present)}


def _iqm(values: Sequence[float | None], reps: int, seed: int) -> dict[str, float] | None:
    """The interquartile mean of the values that are not ``None`` with its stratified-bootstrap 95%
    interval (``value``, ``low``, ``high``); ``None`` when there are none."""
    present = [v for v in values if v is not None]
    return None if not present else _interval(stratified_bootstrap_ci(present, reps=reps, seed=seed))


def _interval(interval: Interval) -> dict[str, float]:
    return {"value": interval.value, "low": interval.low, "high": interval.high}


def _by_algorithm(records: Sequence[RunRecord]) -> dict[str, list[RunRecord]]:
    by_algorithm: dict[str, list[RunRecord]] = {}
    for record in records:
        by_algorithm.setdefault(record.algorithm, []).append(record)
    return by_algorithm


def summarize(records: Sequence[RunRecord], window: int, *, reps: int = DEFAULT_REPS, seed: int = 0) -> list[dict[str, Any]]:
    """Per algorithm (in the order of first appearance): its runs' final values of every metric, the
    held-out EM at the start, the area under the held-out EM curve (``heldout_em_auc``), wall and CPU
    minutes, each as :func:`_spread` over seeds; the interquartile means of the final held-out EM and of
    the area with their bootstrap intervals (``reps`` resamples from ``seed``; with one seed the interval
    is the point); per threshold of :data:`THRESHOLDS`, each run's :func:`to_threshold`; the episodes per
    step; and the collapse steps of each run (``None``: no collapse)."""
    rows = []
    for algorithm, runs in _by_algorithm(records).items():
        per_step = {r.episodes / max(len(r.steps), 1) for r in runs}
        finals = [final_value(r, "heldout_em", window) for r in runs]
        areas = [area_under_curve(r) for r in runs]
        rows.append({
            "algorithm": algorithm, "seeds": [r.seed for r in runs], "episodes_per_step": sorted(per_step),
            "start_em": _spread([_start_em(r) for r in runs]),
            **{metric: _spread([final_value(r, metric, window) for r in runs]) for metric in METRICS},
            "heldout_em_auc": _spread(areas),
            "heldout_em_iqm": _iqm(finals, reps, seed), "heldout_em_auc_iqm": _iqm(areas, reps, seed),
            "to_threshold": {str(t): [to_threshold(r, t) for r in runs] for t in THRESHOLDS},
            "wall_minutes": _spread([r.wall_s / 60 for r in runs]), "cpu_minutes": _spread([r.cpu_s / 60 for r in runs]),
            "collapse": {name: [r.collapse.get(name) for r in runs] for name in COLLAPSE_FRACTIONS},
        })
    return rows


def improvements(records: Sequence[RunRecord], window: int, *, reps: int = DEFAULT_REPS, seed: int = 0) -> list[dict[str, Any]]:
    """Per pair of algorithms X before Y (in the order of first appearance) that both have at least two
    runs with a final held-out EM: ``P(X > Y)`` of the final held-out EM and of the area under its curve,
    each with its bootstrap interval (a pair where either lacks the area has ``None`` there)."""
    values = {}
    for algorithm, runs in _by_algorithm(records).items():
        finals = [v for v in (final_value(r, "heldout_em", window) for r in runs) if v is not None]
        areas = [v for v in (area_under_curve(r) for r in runs) if v is not None]
        if len(finals) >= 2:
            values[algorithm] = (finals, areas)
    names = list(values)
    rows = []
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            (x_final, x_area), (y_final, y_area) = values[x], values[y]
            rows.append({"x": x, "y": y,
                         "heldout_em": _interval(probability_of_improvement(x_final, y_final, reps=reps, seed=seed)),
                         "heldout_em_auc": _interval(probability_of_improvement(x_area, y_area, reps=reps, seed=seed))
                         if len(x_area) >= 2 and len(y_area) >= 2 else None})
    return rows


def profiles(records: Sequence[RunRecord], window: int, *, reps: int = DEFAULT_REPS, seed: int = 0) -> dict[str, dict[str, list[float]]]:
    """Per algorithm with a final held-out EM: its performance profile over :data:`PROFILE_TAUS` (the
    fraction of its seeds whose final held-out EM is above each threshold, with the bootstrap band:
    ``taus``, ``fractions``, ``low``, ``high``)."""
    result = {}
    for algorithm, runs in _by_algorithm(records).items():
        finals = [v for v in (final_value(r, "heldout_em", window) for r in runs) if v is not None]
        if finals:
            result[algorithm] = asdict(performance_profile(finals, PROFILE_TAUS, reps=reps, seed=seed))
    return result


def _ci(interval: Mapping[str, float] | None, digits: int = 3) -> str:
    if interval is None:
        return "-"
    text = f"{interval['value']:.{digits}f}"
    if interval["low"] == interval["high"] == interval["value"]:
        return text
    return text + f" [{interval['low']:.{digits}f}, {interval['high']:.{digits}f}]"


def format_improvements(rows: Sequence[Mapping[str, Any]]) -> str:
    """The probability of improvement as a markdown table, one pair per line (``P(Y > X)`` is one minus
    ``P(X > Y)``); empty when no pair has two seeds each."""
    if not rows:
        return ""
    lines = ["| X | Y | P(X > Y) final held-out EM [95% CI] | P(X > Y) area under the EM curve [95% CI] |", "|---|---|---|---|"]
    lines += [f"| {r['x']} | {r['y']} | {_ci(r['heldout_em'])} | {_ci(r['heldout_em_auc'])} |" for r in rows]
    return "\n".join(lines)


def _reached(hits: Sequence[Mapping[str, Any] | None]) -> str:
    """Each run's step to a threshold, ``-`` for a run that never reached it."""
    return ", ".join("-" if hit is None else str(hit["step"]) for hit in hits)


def _cpu_reached(hits: Sequence[Mapping[str, Any] | None]) -> str:
    """Each run's process CPU minutes to a threshold, ``-`` for a run that never reached it (``?``: reached,
    in a record without CPU times)."""
    return ", ".join("-" if hit is None else "?" if hit["cpu_minutes"] is None else f"{hit['cpu_minutes']:.2f}" for hit in hits)


def _mean_sd(spread: Mapping[str, Any], digits: int = 3) -> str:
    if spread["mean"] is None:
        return "-"
    text = f"{spread['mean']:.{digits}f}"
    return text + f" ± {spread['std']:.{digits}f}" if spread["n"] > 1 else text


def _collapses(steps: Sequence[int | None]) -> str:
    hit = [s for s in steps if s is not None]
    return "none" if not hit else f"{len(hit)}/{len(steps)} (step {', '.join(map(str, hit))})"


_TABLE = (("start EM", "start_em", 3), ("final reward", "reward", 3), ("held-out EM", "heldout_em", 3),
          ("2-hop EM", "heldout_em_2hop", 3), ("EM curve area", "heldout_em_auc", 3), ("searches", "searches", 2),
          ("no-search share", "zero_search_frac", 2), ("tokens", "response_tokens", 1),
          ("KL", "kl", 4), ("entropy", "entropy", 3), ("wall min", "wall_minutes", 1), ("CPU min", "cpu_minutes", 1))


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The summary as a markdown table: mean ± standard deviation over seeds (the mean alone for one seed);
    the interquartile means with their 95% intervals; each seed's step and process CPU minutes to every
    threshold."""
    header = ["algorithm", "seeds", "episodes/step", *(label for label, _, _ in _TABLE), "EM IQM [95% CI]",
              "EM area IQM [95% CI]", *(f"steps to EM {t:g}" for t in THRESHOLDS), *(f"CPU min to EM {t:g}" for t in THRESHOLDS),
              "reward collapse", "entropy collapse"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["algorithm"], str(len(row["seeds"])), "/".join(f"{e:g}" for e in row["episodes_per_step"]),
                 *(_mean_sd(row[key], digits) for _, key, digits in _TABLE),
                 _ci(row["heldout_em_iqm"]), _ci(row["heldout_em_auc_iqm"]),
                 *(_reached(row["to_threshold"][str(t)]) for t in THRESHOLDS),
                 *(_cpu_reached(row["to_threshold"][str(t)]) for t in THRESHOLDS),
                 _collapses(row["collapse"]["reward"]), _collapses(row["collapse"]["entropy"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csvs(rows: Sequence[Mapping[str, Any]], records: Sequence[RunRecord], window: int, output_dir: Path) -> None:
    """``table.csv`` (per algorithm: mean, std, min and max of each summary column; the interquartile means
    and their intervals; the collapse steps) and ``runs.csv`` (per run: the final values, the area under the
    held-out EM curve, steps and episodes to each threshold, collapse steps and times)."""
    keys = [key for _, key, _ in _TABLE]
    with open(output_dir / "table.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["algorithm", "seeds", "episodes_per_step", *(f"{k}_{s}" for k in keys for s in ("mean", "std", "min", "max")),
                         *(f"{k}_{s}" for k in _IQMS for s in ("value", "low", "high")),
                         *(f"{name}_collapse_steps" for name in COLLAPSE_FRACTIONS)])
        for row in rows:
            writer.writerow([row["algorithm"], " ".join(map(str, row["seeds"])), " ".join(f"{e:g}" for e in row["episodes_per_step"]),
                             *(_csv(row[k][s]) for k in keys for s in ("mean", "std", "min", "max")),
                             *(_csv(row[k][s] if row[k] else None) for k in _IQMS for s in ("value", "low", "high")),
                             *(" ".join("-" if s is None else str(s) for s in row["collapse"][name]) for name in COLLAPSE_FRACTIONS)])
    with open(output_dir / "runs.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["algorithm", "seed", "steps", "episodes", "start_em", *METRICS, "heldout_em_auc",
                         *(f"{what}_to_{t:g}" for t in THRESHOLDS for what in ("steps", "episodes", "cpu_minutes")),
                         *(f"{n}_collapse_step" for n in COLLAPSE_FRACTIONS),
                         "wall_s", "cpu_s", "eval_wall_s", "output_dir"])
        for r in records:
            writer.writerow([r.algorithm, r.seed, len(r.steps), r.episodes, _csv(_start_em(r)),
                             *(_csv(final_value(r, m, window)) for m in METRICS), _csv(area_under_curve(r)),
                             *(cell for t in THRESHOLDS for cell in _csv_hit(to_threshold(r, t))),
                             *("" if r.collapse.get(n) is None else r.collapse[n] for n in COLLAPSE_FRACTIONS),
                             f"{r.wall_s:.3f}", f"{r.cpu_s:.3f}", f"{r.eval_wall_s:.3f}", r.output_dir])


_IQMS = ("heldout_em_iqm", "heldout_em_auc_iqm")


def _csv_hit(hit: Mapping[str, Any] | None) -> tuple[str, str, str]:
    """A threshold crossing's step, episodes and CPU minutes as three CSV cells' text (empty: never reached,
    or no CPU time recorded)."""
    return ("", "", "") if hit is None else (str(hit["step"]), str(hit["episodes"]), _csv(hit.get("cpu_minutes")))


def _csv(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _curve(record: RunRecord, metric: str) -> list[tuple[int, float]]:
    points = record.evaluations if METRICS[metric][1] else record.steps
    return [(p["step"], p[metric]) for p in points if p.get(metric) is not None]


def plot_metric(records: Sequence[RunRecord], metric: str, path: Path) -> Path:
    """One PNG of ``metric`` against the training step: per algorithm the mean over its seeds and the
    band between the lowest and highest seed; dotted vertical lines mark a run's collapse of this metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    algorithms = list(dict.fromkeys(r.algorithm for r in records))
    for i, algorithm in enumerate(algorithms):
        by_step: dict[int, list[float]] = {}
        runs = [r for r in records if r.algorithm == algorithm]
        for run in runs:
            for step, value in _curve(run, metric):
                by_step.setdefault(step, []).append(value)
        steps = sorted(by_step)
        color = f"C{i}"
        ax.plot(steps, [statistics.fmean(by_step[s]) for s in steps], "-o" if METRICS[metric][1] else "-", ms=3, color=color,
                label=f"{algorithm} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
        ax.fill_between(steps, [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps], color=color, alpha=0.18, lw=0)
        for run in runs:
            if run.collapse.get(metric) is not None:
                ax.axvline(run.collapse[metric], color=color, ls=":", lw=1)
    ax.set_xlabel("training step (0: the shared warm start)")
    ax.set_ylabel(METRICS[metric][0])
    ax.set_title(f"{METRICS[metric][0]}: mean over seeds, band min-max")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_profiles(curves: Mapping[str, Mapping[str, list[float]]], path: Path) -> Path:
    """One PNG of the performance profiles of :func:`profiles`: per algorithm the fraction of seeds above
    each final held-out EM, with its bootstrap band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    for i, (algorithm, curve) in enumerate(curves.items()):
        ax.step(curve["taus"], curve["fractions"], where="post", color=f"C{i}", label=algorithm)
        ax.fill_between(curve["taus"], curve["low"], curve["high"], step="post", color=f"C{i}", alpha=0.18, lw=0)
    ax.set_xlabel("final held-out greedy EM, tau")
    ax.set_ylabel("fraction of seeds with EM > tau")
    ax.set_title("performance profiles (band: 95% stratified bootstrap)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
