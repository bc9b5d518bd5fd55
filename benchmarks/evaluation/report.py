"""The results table: one row per dataset x protocol x agent, computed from episode records, in four forms.

A row is the mean of its episodes' metrics (over every question and, for sampled decoding, every seed)
with what the numbers depend on beside them: retriever, corpus, top-k, search turns, token budget,
decoding, the subset of questions, the judge model and the reward preset with its range. Search-agent
papers move 5-10 points between versions from such settings alone, so no table leaves them out.

Forms: markdown (the settings as a header block, then the table), CSV (every setting a column), a
bar chart of the answer metrics (PNG, matplotlib's Agg canvas, no display needed), and the plain
terminal table.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Mapping, Sequence

from benchmarks.evaluation.metrics import EPISODE_METRICS, mean_metrics
from benchmarks.evaluation.retrieval import Retrieval
from benchmarks.evaluation.runner import Cell, Plan
from benchmarks.evaluation.store import EpisodeLog

__all__ = ["COLUMNS", "NOTES", "print_legend", "print_table", "summarize", "table_rows", "to_markdown", "write_chart", "write_csv"]

#: Notes on reward parts that could not count, by the reward component that reports them.
NOTES = {
    "evidence_skipped": "evidence F1 counted 0: no evidence model was given (it needs one)",
    "f1_stand_in": "no judge was given: answer F1 stood in for the judge",
}

#: The metric columns: key, markdown header, decimals.
COLUMNS = (("em", "EM", 3), ("f1", "F1", 3), ("cover_em", "cover-EM", 3), ("judge", "judge", 3), ("reward", "reward", 3),
           ("searches", "searches", 2), ("failed_searches", "failed searches", 2), ("no_search", "no search", 2),
           ("agent_tokens", "agent tokens", 1),
           ("retrieved_tokens", "retrieved tokens", 1),
           ("seconds", "s/question", 3), ("gold_recall", "gold recall", 3))

#: The settings a row states, with what each depends on (the header block groups values by it).
SETTINGS = (("retriever", "dataset"), ("corpus", "dataset"), ("subset", "dataset"), ("top_k", "protocol"),
            ("max_turns", "protocol"), ("max_new_tokens", None), ("decoding", "agent"), ("judge_model", None),
            ("preset", "protocol"))
_UNSET = {"max_turns": "unlimited", "judge_model": "none"}  # what None means, where it means something
_SETTING_NAMES = {"top_k": "top-k", "max_turns": "search turns", "max_new_tokens": "agent tokens per episode",
                  "judge_model": "judge", "preset": "reward preset"}

_CSV_FIELDS = ("dataset", "protocol", "agent", "questions", "seeds", "episodes", *EPISODE_METRICS, "reward_min", "reward_max",
               "preset", "retriever", "corpus", "top_k", "max_turns", "max_new_tokens", "decoding", "subset", "judge_model", "notes")


def summarize(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The means of ``records``' metrics, their reward preset and its range, and the notes that apply."""
    if not records:
        raise ValueError("no episodes to summarize")
    components = [r["reward_components"] for r in records]
    notes = sorted({key for c in components for key in NOTES if c.get(key) is True or c.get("judge_source") == key})
    reward_range = records[0].get("reward_range")
    return {**mean_metrics([r["metrics"] for r in records]), "preset": records[0]["reward_preset"],
            "reward_range": tuple(reward_range) if reward_range is not None else None, "notes": notes}


def table_rows(plan: Plan, log: EpisodeLog, retrieval: Retrieval, judge_model: str | None) -> list[dict[str, Any]]:
    """One row per dataset x protocol x agent of ``plan`` (in that order), from the episodes ``log``
    holds for it, with the settings it ran under; a combination without episodes has no row."""
    rows = []
    for dataset in plan.datasets:
        for protocol in plan.protocols:
            for agent in plan.agents:
                seeds = plan.seeds(agent)
                records = log.records([key for seed in seeds for key in Cell(dataset, protocol, agent, seed).keys()])
                if not records:
                    continue
                rows.append({"dataset": dataset.name, "protocol": protocol, "agent": agent.name,
                             "questions": len(dataset.examples), "seeds": len(seeds), "episodes": len(records),
                             **summarize(records), **retrieval.describe(dataset), "subset": dataset.subset,
                             "top_k": plan.env.top_k_of(protocol), "max_turns": plan.env.max_turns_of(protocol),
                             "max_new_tokens": plan.env.max_new_tokens, "decoding": agent.decoding, "judge_model": judge_model})
    return rows


def _number(value: Any, decimals: int) -> str:
    return "-" if value is None else f"{value:.{decimals}f}"


def _range_text(value_range: Sequence[float] | None) -> str:
    return f"[{value_range[0]:g}, {value_range[1]:g}]" if value_range is not None else "?"


def _setting(rows: Sequence[Mapping[str, Any]], key: str) -> str:
    """One setting over the rows: its value, or each value with the datasets/protocols/agents it holds for."""
    owner = dict(SETTINGS)[key]
    groups: dict[str, list[str]] = {}
    for row in rows:
        value = row.get(key)
        owners = groups.setdefault(_UNSET.get(key, "-") if value is None else str(value), [])
        if owner is not None and row[owner] not in owners:
            owners.append(row[owner])
    if len(groups) == 1:
        return next(iter(groups))
    return "; ".join(f"{value} ({', '.join(owners)})" for value, owners in groups.items())


def to_markdown(rows: Sequence[Mapping[str, Any]], title: str = "Evaluation", not_played: Sequence[str] = (), *,
                level: int = 1) -> str:
    """The settings as a header block, the table (one row per dataset x protocol x agent) and the notes,
    with ``not_played``: the agents left out of a dataset, each with why. ``title`` is a heading of
    ``level`` (2 or more inside a larger document)."""
    lines = [f"{'#' * level} {title}", "", "| setting | value |", "| --- | --- |"]
    for key, _ in SETTINGS:
        lines.append(f"| {_SETTING_NAMES.get(key, key)} | {_setting(rows, key)} |")
    lines.append("| metrics | EM, F1, cover-EM (a gold is a substring of the answer): the extracted answer against every gold "
                 "alias, SQuAD-normalised; tokens and searches per question; no search: share of the episodes without a search "
                 "call; s/question: wall time of a batch over its size |")
    columns = [c for c in COLUMNS if any(r.get(c[0]) is not None for r in rows)]
    judge_model = next((r["judge_model"] for r in rows if r.get("judge_model")), None)
    headers = ["dataset", "protocol", "agent", "questions", "seeds"]
    headers += [f"judge ({judge_model})" if key == "judge" else name for key, name, _ in columns] + ["reward range"]
    lines += ["", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in rows:
        cells = [r["dataset"], r["protocol"], r["agent"], str(r["questions"]), str(r["seeds"])]
        cells += [_number(r.get(key), decimals) + (" (searches failed)" if key == "em" and r.get("failed_searches") else "")
                  for key, _, decimals in columns] + [_range_text(r.get("reward_range"))]
        lines.append("| " + " | ".join(cells) + " |")
    notes = _notes(rows) + [f"not played: {line}" for line in not_played]
    if notes:
        lines += [""] + [f"- {line}" for line in notes]
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """One line per row, every metric and setting a column (empty: not measured)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=_CSV_FIELDS)
        writer.writeheader()
        for r in rows:
            value_range = r.get("reward_range")
            line = {key: r.get(key) for key in _CSV_FIELDS}
            line.update(reward_min=value_range[0] if value_range else None, reward_max=value_range[1] if value_range else None,
                        notes="; ".join(NOTES[key] for key in r.get("notes", ())))
            writer.writerow({key: "" if value is None else value for key, value in line.items()})


def write_chart(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Grouped bars of the answer metrics (EM, F1, cover-EM, judge when measured): one panel per metric,
    datasets along the axis, one bar per agent and protocol."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = [(key, name) for key, name, _ in COLUMNS[:4] if any(r.get(key) is not None for r in rows)]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    series = list(dict.fromkeys((r["agent"], r["protocol"]) for r in rows))
    value = {(r["dataset"], r["agent"], r["protocol"]): r for r in rows}
    width = 0.8 / len(series)
    figure = Figure(figsize=(max(6.0, 1.2 * len(datasets) * len(metrics) + 2), 4.2), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(metrics), squeeze=False)[0]
    for ax, (key, name) in zip(axes, metrics):
        for i, (agent, protocol) in enumerate(series):
            heights = [(value.get((d, agent, protocol)) or {}).get(key) or 0.0 for d in datasets]
            ax.bar([x + (i - (len(series) - 1) / 2) * width for x in range(len(datasets))], heights, width,
                   label=f"{agent} ({protocol})")
        ax.set_title(name)
        ax.set_xticks(range(len(datasets)), [Path(d).stem for d in datasets], rotation=30, ha="right")  # a path by its file
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("mean over questions")
    figure.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=min(3, len(series)), fontsize="small")
    figure.suptitle(f"retriever: {_setting(rows, 'retriever')}; top-k: {_setting(rows, 'top_k')}; "
                    f"decoding: {_setting(rows, 'decoding')}", fontsize="small", wrap=True)
    figure.savefig(path, dpi=120)


def print_table(rows: Sequence[Mapping[str, Any]], data_line: str) -> None:
    """The rows of one dataset as a plain table, then ``data_line`` (which questions, searched how)."""
    width = max(22, *(len(r["agent"]) for r in rows))
    judged = any(r.get("judge") is not None for r in rows)
    header = (f"{'protocol':18s} {'agent':{width}s} {'reward':>7s} {'of range':>10s} {'EM':>6s} {'F1':>6s} {'searches':>8s} "
              f"{'failed':>6s} {'no search':>9s} {'gold rec.':>9s} {'agent tok':>9s} {'ret. tok':>8s} {'cover-EM':>8s}"
              + (f" {'judge':>6s}" if judged else "")
              + f" {'s/q':>7s}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['protocol']:18s} {r['agent']:{width}s} {_number(r['reward'], 3):>7s} {_range_text(r['reward_range']):>10s} "
              f"{_number(r['em'], 3):>6s} {_number(r['f1'], 3):>6s} {_number(r['searches'], 2):>8s} "
              f"{_number(r['failed_searches'], 2):>6s} {_number(r.get('no_search'), 2):>9s} {_number(r['gold_recall'], 3):>9s} "
              f"{_number(r['agent_tokens'], 1):>9s} "
              f"{_number(r['retrieved_tokens'], 1):>8s} "
              f"{_number(r['cover_em'], 3):>8s}" + (f" {_number(r.get('judge'), 3):>6s}" if judged else "")
              + f" {_number(r['seconds'], 3):>7s}")
    print(f"({data_line})")


def print_legend(rows: Sequence[Mapping[str, Any]]) -> None:
    """What the terminal table's columns mean, and the notes on reward parts that could not count."""
    print("reward: the protocol's reward preset, which spans the range beside it at its default options ('?': it declares none); "
          "EM/F1/cover-EM: the extracted answer against the golds (cover-EM: a gold is a substring of it); failed: searches "
          "per question that failed or timed out; no search: share of the episodes without a search call; gold rec.: gold "
          "passages among those retrieved; tok: per question; s/q: seconds per question")
    for line in _notes(rows):
        print(f"note: {line}")


def _notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The reward parts that could not count, then the rows whose searches failed (their EM is the
    retriever's as much as the agent's)."""
    by_note: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        for key in r.get("notes", ()):
            by_note.setdefault((r["preset"], key), []).append(r["agent"])
    notes = [f"{preset}: {NOTES[key]} ({', '.join(dict.fromkeys(agents))})" for (preset, key), agents in sorted(by_note.items())]
    failed = [r for r in rows if r.get("failed_searches")]
    if failed:
        notes.append("searches failed, so these EMs count answers given without passages: " + "; ".join(
            f"{r['agent']} on {r['dataset']} under {r['protocol']} (EM {_number(r['em'], 3)}, "
            f"{_number(r['failed_searches'], 2)} of {_number(r['searches'], 2)} searches per question failed)" for r in failed))
    return notes
