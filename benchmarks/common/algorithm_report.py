"""The RL algorithm benchmark's outputs (:mod:`benchmarks.algorithms`): one folder's tables, CSV files, plots
and ``results.json`` for a set of runs of one task, and, for a ladder of tasks
(:mod:`benchmarks.common.ladder`), the summary across rungs: per rung and algorithm the interquartile mean
of the area under the held-out EM curve and of the steps to each EM threshold, with stratified-bootstrap 95%
intervals, as a markdown table and one figure."""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from benchmarks.common.algorithm_runs import METRICS, RunRecord
from benchmarks.common.algorithm_tables import (
    THRESHOLDS, _by_algorithm, area_under_curve, format_improvements, format_table, improvements, plot_metric,
    plot_profiles, profiles, summarize, to_threshold, write_csvs,
)
from benchmarks.common.rl_statistics import DEFAULT_REPS, stratified_bootstrap_ci

__all__ = ["ONE_SEED_NOTE", "cpu_minutes_to_threshold", "em_band", "format_ladder_table", "ladder_summary", "plot_em_band",
           "plot_ladder_summary", "steps_to_threshold", "write_report"]


#: The header line of a table with an algorithm of one seed.
ONE_SEED_NOTE = ("One seed for an algorithm: its IQM columns are that seed's value, with no interval; seeds, not "
                 "a longer run, are what tell the algorithms apart.")


def write_report(records: Sequence[RunRecord], window: int, reps: int, out: Path, results: Mapping[str, Any], *,
                 title: str = "", header: Sequence[str] = ()) -> str:
    """Write ``out``'s ``table.md``, ``table.csv``, ``runs.csv``, a PNG per metric, the performance profiles,
    the held-out EM curve with its bootstrap band (:func:`plot_em_band`, ``title`` naming the task) and
    ``results.json`` (``results`` plus the summaries, the runs, the header and the load average at the end);
    return ``table.md``'s text: the ``header`` lines (which runs it shows, what it can show), with
    :data:`ONE_SEED_NOTE` where an algorithm has one seed, then the tables."""
    rows = summarize(records, window, reps=reps)
    pairs = improvements(records, window, reps=reps)
    notes = [*header, *([ONE_SEED_NOTE] if any(len(row["seeds"]) < 2 for row in rows) else [])]
    table = "\n".join(f"{line}\n" for line in notes) + ("\n" if notes else "") + format_table(rows)
    table += f"\n\n{format_improvements(pairs)}" if pairs else ""
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table + "\n", encoding="utf-8")
    write_csvs(rows, records, window, out)
    for metric in METRICS:
        plot_metric(records, metric, out / f"{metric}.png")
    profile_curves = profiles(records, window, reps=reps)
    if profile_curves:
        plot_profiles(profile_curves, out / "heldout_em_profile.png")
    bands = em_band(records, reps=reps)
    plot_em_band(bands, out / "heldout_em_band.png", title=title)
    everything = {**results, "header": notes, "bootstrap_reps": reps, "summary": rows, "improvements": pairs, "profiles": profile_curves,
                  "heldout_em_band": bands, "runs": [asdict(r) for r in records], "load_average_end": list(os.getloadavg())}
    (out / "results.json").write_text(json.dumps(everything, indent=2) + "\n", encoding="utf-8")
    return table


def em_band(records: Sequence[RunRecord], *, metric: str = "heldout_em", reps: int = DEFAULT_REPS,
            seed: int = 0) -> dict[str, dict[str, list[float]]]:
    """Per algorithm, its held-out ``metric`` curve over the steps every one of its runs evaluated: the mean
    over seeds (``mean``) and the 95% stratified-bootstrap interval of that mean (``low``, ``high``; the
    point itself with one seed), at ``steps``."""
    result = {}
    for algorithm, runs in _by_algorithm(records).items():
        curves = [{p["step"]: p[metric] for p in r.evaluations if p[metric] is not None} for r in runs]
        steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        band: dict[str, list[float]] = {"steps": [float(s) for s in steps], "mean": [], "low": [], "high": []}
        for step in steps:
            interval = stratified_bootstrap_ci([c[step] for c in curves], np.mean, reps=reps, seed=seed)
            band["mean"].append(interval.value)
            band["low"].append(interval.low)
            band["high"].append(interval.high)
        result[algorithm] = band
    return result


def plot_em_band(bands: Mapping[str, Mapping[str, list[float]]], path: Path, *, title: str = "") -> Path:
    """One PNG of :func:`em_band`: per algorithm the mean held-out EM against the step, with its band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, (algorithm, band) in enumerate(bands.items()):
        color = f"C{i % 10}"
        style = "-o" if i < 10 else "--o"
        ax.plot(band["steps"], band["mean"], style, ms=3, color=color, label=algorithm)
        ax.fill_between(band["steps"], band["low"], band["high"], color=color, alpha=0.15, lw=0)
    ax.set_xlabel("training step (0: the shared warm start)")
    ax.set_ylabel("held-out greedy EM")
    ax.set_title((title + ": " if title else "") + "mean over seeds, band: 95% bootstrap of the mean", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def steps_to_threshold(record: RunRecord, threshold: float) -> tuple[float, bool]:
    """The step at which the run's held-out EM first reached ``threshold``, and whether it did; a run that
    never did counts as its last evaluated step plus one (censored: the true value is later)."""
    hit = to_threshold(record, threshold)
    if hit is not None:
        return float(hit["step"]), True
    return float(max((p["step"] for p in record.evaluations), default=0) + 1), False


def cpu_minutes_to_threshold(record: RunRecord, threshold: float) -> float | None:
    """The process CPU minutes the run spent until its held-out EM first reached ``threshold``; a run that
    never did counts as its whole CPU time (censored, as :func:`steps_to_threshold`); ``None`` for a record
    whose steps kept no CPU time."""
    hit = to_threshold(record, threshold)
    if hit is not None:
        return hit["cpu_minutes"]
    return record.cpu_s / 60 if record.steps and "cpu_s" in record.steps[-1] else None


def ladder_summary(records_by_rung: Mapping[str, Sequence[RunRecord]], *, reps: int = DEFAULT_REPS,
                   seed: int = 0) -> list[dict[str, Any]]:
    """Per rung and algorithm: the interquartile mean over seeds of the area under the held-out EM curve
    (``auc``), of the steps to each EM threshold (``steps_to_<t>``, censored as :func:`steps_to_threshold`
    says, with ``reached``: how many seeds reached it) and of the process CPU minutes to it
    (``cpu_minutes_to_<t>``, censored alike; ``None`` unless every run kept its CPU times), each with its
    stratified-bootstrap 95% interval."""
    rows = []
    for rung, records in records_by_rung.items():
        for algorithm, runs in _by_algorithm(records).items():
            areas = [a for a in (area_under_curve(r) for r in runs) if a is not None]
            row: dict[str, Any] = {"rung": rung, "algorithm": algorithm, "seeds": len(runs),
                                   "auc": _interval(areas, reps, seed)}
            for t in THRESHOLDS:
                hits = [steps_to_threshold(r, t) for r in runs]
                row[f"steps_to_{t:g}"] = _interval([s for s, _ in hits], reps, seed)
                row[f"reached_{t:g}"] = sum(ok for _, ok in hits)
                cpu = [cpu_minutes_to_threshold(r, t) for r in runs]
                row[f"cpu_minutes_to_{t:g}"] = None if None in cpu else _interval(cpu, reps, seed)
            rows.append(row)
    return rows


def _interval(values: Sequence[float], reps: int, seed: int) -> dict[str, float] | None:
    if not values:
        return None
    interval = stratified_bootstrap_ci(values, reps=reps, seed=seed)
    return {"value": interval.value, "low": interval.low, "high": interval.high}


def _ci(interval: Mapping[str, float] | None, digits: int) -> str:
    if interval is None:
        return "-"
    return f"{interval['value']:.{digits}f} [{interval['low']:.{digits}f}, {interval['high']:.{digits}f}]"


def format_ladder_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """:func:`ladder_summary` as a markdown table; a steps or CPU-minutes cell says how many seeds reached the
    threshold (the others counted as censored: a run's whole length)."""
    header = ["rung", "algorithm", "seeds", "EM area IQM [95% CI]",
              *(f"steps to EM {t:g} IQM [95% CI] (seeds reaching)" for t in THRESHOLDS),
              *(f"CPU min to EM {t:g} IQM [95% CI] (seeds reaching)" for t in THRESHOLDS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        def reached(t: float) -> str:
            return f" ({row[f'reached_{t:g}']}/{row['seeds']})"

        cells = [row["rung"], row["algorithm"], str(row["seeds"]), _ci(row["auc"], 3),
                 *(_ci(row[f"steps_to_{t:g}"], 1) + reached(t) for t in THRESHOLDS),
                 *(_ci(row[f"cpu_minutes_to_{t:g}"], 2) + (reached(t) if row[f"cpu_minutes_to_{t:g}"] is not None else "") for t in THRESHOLDS)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_ladder_summary(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """One PNG across rungs: per rung a panel of the algorithms' interquartile mean of the area under the
    held-out EM curve, with 95% interval bars."""
    plt = _pyplot()
    rungs = list(dict.fromkeys(r["rung"] for r in rows))
    fig, axes = plt.subplots(1, len(rungs), figsize=(max(2.6 * len(rungs) + 1.5, 6.0), 4.0), sharey=True, squeeze=False)
    for ax, rung in zip(axes[0], rungs):
        mine = [r for r in rows if r["rung"] == rung and r["auc"] is not None]
        for i, row in enumerate(mine):
            auc = row["auc"]
            ax.errorbar([auc["value"]], [i], xerr=[[auc["value"] - auc["low"]], [auc["high"] - auc["value"]]], fmt="o",
                        color=f"C{i % 10}", ms=4, capsize=3)
        ax.set_yticks(range(len(mine)), [r["algorithm"] for r in mine], fontsize=7)
        ax.set_title(rung, fontsize=9)
        ax.set_xlabel("EM curve area (IQM)", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].invert_yaxis()
    fig.suptitle("area under the held-out EM curve\ninterquartile mean over seeds, 95% stratified bootstrap", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

