"""The RL algorithm benchmark's summaries over runs (:mod:`benchmarks.algorithms`): each algorithm's final
values as mean, standard deviation, lowest and highest over seeds, as a markdown table and CSV files, and
one plot per metric."""
from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

from benchmarks.common.algorithm_runs import COLLAPSE_FRACTIONS, METRICS, RunRecord

__all__ = ["final_value", "format_table", "plot_metric", "summarize", "write_csvs"]


def final_value(record: RunRecord, metric: str, window: int) -> float | None:
    """A run's final value of ``metric``: the mean of its last ``window`` steps' values for a step metric;
    the ``"final"`` evaluation's for a held-out one (``None`` when it has none)."""
    if METRICS[metric][1]:
        finals = [p[metric] for p in record.evaluations if p["stage"] == "final"]
        return finals[-1] if finals else None
    values = [p[metric] for p in record.steps if p[metric] is not None][-window:]
    return statistics.fmean(values) if values else None


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


def summarize(records: Sequence[RunRecord], window: int) -> list[dict[str, Any]]:
    """Per algorithm (in the order of first appearance): its runs' final values of every metric, the
    held-out EM at the start, wall and CPU minutes, each as :func:`_spread` over seeds; the episodes per
    step; and the collapse steps of each run (``None``: no collapse)."""
    by_algorithm: dict[str, list[RunRecord]] = {}
    for record in records:
        by_algorithm.setdefault(record.algorithm, []).append(record)
    rows = []
    for algorithm, runs in by_algorithm.items():
        per_step = {r.episodes / max(len(r.steps), 1) for r in runs}
        rows.append({
            "algorithm": algorithm, "seeds": [r.seed for r in runs], "episodes_per_step": sorted(per_step),
            "start_em": _spread([_start_em(r) for r in runs]),
            **{metric: _spread([final_value(r, metric, window) for r in runs]) for metric in METRICS},
            "wall_minutes": _spread([r.wall_s / 60 for r in runs]), "cpu_minutes": _spread([r.cpu_s / 60 for r in runs]),
            "collapse": {name: [r.collapse.get(name) for r in runs] for name in COLLAPSE_FRACTIONS},
        })
    return rows


def _mean_sd(spread: Mapping[str, Any], digits: int = 3) -> str:
    if spread["mean"] is None:
        return "-"
    text = f"{spread['mean']:.{digits}f}"
    return text + f" ± {spread['std']:.{digits}f}" if spread["n"] > 1 else text


def _collapses(steps: Sequence[int | None]) -> str:
    hit = [s for s in steps if s is not None]
    return "none" if not hit else f"{len(hit)}/{len(steps)} (step {', '.join(map(str, hit))})"


_TABLE = (("start EM", "start_em", 3), ("final reward", "reward", 3), ("held-out EM", "heldout_em", 3),
          ("2-hop EM", "heldout_em_2hop", 3), ("searches", "searches", 2), ("tokens", "response_tokens", 1),
          ("KL", "kl", 4), ("entropy", "entropy", 3), ("wall min", "wall_minutes", 1), ("CPU min", "cpu_minutes", 1))


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The summary as a markdown table: mean ± standard deviation over seeds (the mean alone for one seed)."""
    header = ["algorithm", "seeds", "episodes/step", *(label for label, _, _ in _TABLE), "reward collapse", "entropy collapse"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["algorithm"], str(len(row["seeds"])), "/".join(f"{e:g}" for e in row["episodes_per_step"]),
                 *(_mean_sd(row[key], digits) for _, key, digits in _TABLE),
                 _collapses(row["collapse"]["reward"]), _collapses(row["collapse"]["entropy"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csvs(rows: Sequence[Mapping[str, Any]], records: Sequence[RunRecord], window: int, output_dir: Path) -> None:
    """``table.csv`` (per algorithm: mean, std, min and max of each summary column; the collapse steps) and
    ``runs.csv`` (per run: the final values, collapse steps and times)."""
    keys = [key for _, key, _ in _TABLE]
    with open(output_dir / "table.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["algorithm", "seeds", "episodes_per_step", *(f"{k}_{s}" for k in keys for s in ("mean", "std", "min", "max")),
                         *(f"{name}_collapse_steps" for name in COLLAPSE_FRACTIONS)])
        for row in rows:
            writer.writerow([row["algorithm"], " ".join(map(str, row["seeds"])), " ".join(f"{e:g}" for e in row["episodes_per_step"]),
                             *(_csv(row[k][s]) for k in keys for s in ("mean", "std", "min", "max")),
                             *(" ".join("-" if s is None else str(s) for s in row["collapse"][name]) for name in COLLAPSE_FRACTIONS)])
    with open(output_dir / "runs.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["algorithm", "seed", "steps", "episodes", "start_em", *METRICS,
                         *(f"{n}_collapse_step" for n in COLLAPSE_FRACTIONS),
                         "wall_s", "cpu_s", "eval_wall_s", "output_dir"])
        for r in records:
            writer.writerow([r.algorithm, r.seed, len(r.steps), r.episodes, _csv(_start_em(r)),
                             *(_csv(final_value(r, m, window)) for m in METRICS),
                             *("" if r.collapse.get(n) is None else r.collapse[n] for n in COLLAPSE_FRACTIONS),
                             f"{r.wall_s:.3f}", f"{r.cpu_s:.3f}", f"{r.eval_wall_s:.3f}", r.output_dir])


def _csv(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _curve(record: RunRecord, metric: str) -> list[tuple[int, float]]:
    points = record.evaluations if METRICS[metric][1] else record.steps
    return [(p["step"], p[metric]) for p in points if p[metric] is not None]


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
