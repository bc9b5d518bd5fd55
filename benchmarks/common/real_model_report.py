"""The real-model benchmark's numbers: per-set and seven-set held-out scores with bootstrap intervals over
questions, read from the evaluation harness's episodes, and the record, table and figure made of them.

The seven-set average is the mean of the sets' means (each set weighs the same, as the papers' tables
average them). Its 95% interval resamples questions with replacement within each set, independently
(a stratified bootstrap over questions), and takes the percentiles of the resampled averages: the
interval says how much the average would move with other questions of the same sets, not with another
training seed.

Each episode also gets one outcome, the failure analysis of the table (:data:`OUTCOMES`): right, or where a
wrong one went astray: it closed no answer (format), answered without searching, searched but no result
held a gold answer (retrieval), or had one in its results and did not answer it (reading).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from agents.training.metric_keys import measures_the_machine
from rewards.metrics import answer_in_text
from search_env.protocols import get_protocol

__all__ = ["METRICS", "OUTCOMES", "Row", "bootstrap_average", "episode_outcome", "format_outcomes", "format_table",
           "paired_difference", "plot_training", "read_jsonl", "read_rows", "set_scores", "step_differences"]

#: The answer metrics of the table, as the harness's episodes name them.
METRICS = ("em", "f1", "cover_em")
#: An episode's outcomes, in the order :func:`episode_outcome` tells them apart.
OUTCOMES = ("right", "no answer", "no search", "not retrieved", "misread")
#: Bootstrap resamples of an interval.
REPS = 2000


@dataclass
class Row:
    """One system of the table: its scores per set and over the seven sets.

    Attributes:
        name: what the table calls it (``direct``, ``trained`` ...).
        role: ``baseline``, ``untrained``, ``cold-start``, ``trained`` or ``trained-empty-source``.
        agent: the harness's agent spec that played it.
        per_set: ``{set: {metric: mean, metric_ci_low: ..., metric_ci_high: ..., "questions": n, "searches": mean}}``.
        average: ``{metric: {"mean", "ci_low", "ci_high"}}`` over the sets.
        searches_per_episode: search calls per episode over every set's questions.
        no_search_share: share of the episodes that made no search call.
        outcomes: share of the episodes with each of :data:`OUTCOMES`, over every set's questions.
    """

    name: str
    role: str
    agent: str
    per_set: dict[str, dict[str, float]]
    average: dict[str, dict[str, float]]
    searches_per_episode: float
    no_search_share: float
    outcomes: dict[str, float]

    def as_record(self) -> dict[str, Any]:
        """The row as ``summary.json`` holds it (``avg_em``, ``ci_low`` and ``ci_high`` at the top)."""
        em = self.average["em"]
        return {"name": self.name, "role": self.role, "agent": self.agent, "avg_em": em["mean"], "ci_low": em["ci_low"],
                "ci_high": em["ci_high"], "average": self.average, "searches_per_episode": self.searches_per_episode,
                "no_search_share": self.no_search_share, "outcomes": self.outcomes, "per_set": self.per_set}


def set_scores(episodes: Iterable[Mapping[str, Any]], agent: str) -> dict[str, dict[str, list[float]]]:
    """``{set: {metric: [one value per question]}}`` for ``agent``'s episodes (the harness's
    ``episodes.jsonl`` rows), with ``searches`` among the metrics."""
    scores: dict[str, dict[str, list[float]]] = {}
    for episode in episodes:
        if episode["agent"] != agent:
            continue
        per_set = scores.setdefault(episode["dataset"], {name: [] for name in (*METRICS, "searches")})
        for name in (*METRICS, "searches"):
            per_set[name].append(float(episode["metrics"][name]))
    return scores


def episode_outcome(episode: Mapping[str, Any]) -> str:
    """Which of :data:`OUTCOMES` a harness episode had: ``right`` (EM 1); ``no answer`` (it ended without a
    closed answer: out of tokens, turns or context); ``no search``; ``not retrieved`` (no result its protocol
    wrapped in its result tags held a gold answer, by :func:`rewards.metrics.answer_in_text`); ``misread``
    (one did)."""
    metrics = episode["metrics"]
    if metrics["em"] == 1.0:
        return "right"
    if episode.get("end_reason") != "answer":
        return "no answer"
    if not metrics["searches"]:
        return "no search"
    protocol = get_protocol(episode["protocol"])
    results = [part.split(protocol.result_close, 1)[0] for part in episode["text"].split(protocol.result_open)[1:]]
    return "misread" if answer_in_text(" ".join(results), episode["golden_answers"]) else "not retrieved"


def bootstrap_average(values_by_set: Sequence[Sequence[float]], *, reps: int = REPS, seed: int = 0,
                      confidence: float = 0.95) -> dict[str, float]:
    """The mean of the sets' means and its percentile interval from a bootstrap that resamples each set's
    questions with replacement (see the module docstring).

    Raises:
        ValueError: no sets, or a set without questions.
    """
    if not values_by_set or any(len(values) == 0 for values in values_by_set):
        raise ValueError("every set needs at least one question")
    rng = np.random.default_rng(seed)
    resampled = np.zeros(reps)
    for values in values_by_set:
        array = np.asarray(values, dtype=float)
        picks = rng.integers(0, len(array), size=(reps, len(array)))
        resampled += array[picks].mean(axis=1)
    resampled /= len(values_by_set)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(resampled, [tail, 100 - tail])
    mean = float(np.mean([np.mean(values) for values in values_by_set]))
    return {"mean": mean, "ci_low": float(low), "ci_high": float(high)}


def _set_intervals(scores: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """``{metric_ci_low, metric_ci_high}``: each metric's 95% bootstrap interval over one set's questions."""
    intervals = {}
    for i, metric in enumerate(METRICS):
        one = bootstrap_average([scores[metric]], seed=i)
        intervals[f"{metric}_ci_low"], intervals[f"{metric}_ci_high"] = one["ci_low"], one["ci_high"]
    return intervals


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines file (the harness's ``episodes.jsonl``, a run's ``metrics.jsonl``), one dict per line."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def paired_difference(a: Iterable[Mapping[str, Any]], a_agent: str, b: Iterable[Mapping[str, Any]], b_agent: str,
                      sets: Sequence[str], metric: str = "em") -> dict[str, float]:
    """The average over ``sets`` of ``a_agent``'s ``metric`` minus ``b_agent``'s (episodes ``a`` and ``b``) on the
    questions both played, with its 95% interval from the stratified bootstrap over questions. Paired: a
    question's two scores are resampled together, so a gain is measured against the questions' own spread
    rather than two rows' intervals side by side (which overlap for a gain the pairing still resolves).

    Raises:
        ValueError: a set where no question was played by both.
    """
    def by_question(episodes: Iterable[Mapping[str, Any]], agent: str) -> dict[tuple[str, str], float]:
        return {(e["dataset"], e["example_id"]): float(e["metrics"][metric]) for e in episodes if e["agent"] == agent}

    mine, theirs = by_question(a, a_agent), by_question(b, b_agent)
    common = sorted(mine.keys() & theirs.keys())
    return bootstrap_average([[mine[k] - theirs[k] for k in common if k[0] == s] for s in sets])


def read_rows(episodes: Sequence[Mapping[str, Any]], systems: Sequence[tuple[str, str, str]], sets: Sequence[str]) -> list[Row]:
    """The table's rows for ``systems`` (``(name, role, agent spec)``) from one harness output's episodes
    (:func:`read_jsonl` of its ``episodes.jsonl``), over ``sets`` (the harness's dataset names). A system
    without episodes of every set is left out.
    """
    rows = []
    for name, role, agent in systems:
        scores = set_scores(episodes, agent)
        if any(not scores.get(s, {}).get("em") for s in sets):
            continue
        per_set = {s: {**{m: float(np.mean(scores[s][m])) for m in (*METRICS, "searches")},
                       **_set_intervals(scores[s]), "questions": float(len(scores[s]["em"]))} for s in sets}
        average = {m: bootstrap_average([scores[s][m] for s in sets], seed=i) for i, m in enumerate(METRICS)}
        searches = [v for s in sets for v in scores[s]["searches"]]
        outcomes = [episode_outcome(e) for e in episodes if e["agent"] == agent and e["dataset"] in sets]
        rows.append(Row(name, role, agent, per_set, average, float(np.mean(searches)),
                        float(np.mean([v == 0 for v in searches])),
                        {outcome: outcomes.count(outcome) / len(outcomes) for outcome in OUTCOMES}))
    return rows


def format_table(rows: Sequence[Row], sets: Sequence[str], metric: str = "em", *, intervals: bool = False) -> str:
    """A markdown table of ``metric`` per set (``sets``: the harness's names, shown without ``@held-out``; with
    ``intervals``, each with its 95% interval) and over the seven sets with its interval; the EM table also
    has the average F1 and cover-EM, the searches per episode and the share of episodes without one."""
    label = {"em": "EM", "f1": "F1", "cover_em": "cover-EM"}[metric]
    extra = ["avg F1", "avg cover-EM", "searches", "no search"] if metric == "em" else []
    header = ["system", "role", *(s.split("@")[0] for s in sets), f"avg {label} [95% CI]", *extra]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        average = row.average[metric]
        per_set = [f"{row.per_set[s][metric]:.3f}" + (f" [{row.per_set[s][metric + '_ci_low']:.2f}, "
                                                       f"{row.per_set[s][metric + '_ci_high']:.2f}]" if intervals else "")
                   for s in sets]
        cells = [row.name, row.role, *per_set, f"{average['mean']:.3f} [{average['ci_low']:.3f}, {average['ci_high']:.3f}]"]
        if metric == "em":
            cells += [f"{row.average['f1']['mean']:.3f}", f"{row.average['cover_em']['mean']:.3f}",
                      f"{row.searches_per_episode:.2f}", f"{row.no_search_share:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_outcomes(rows: Sequence[Row]) -> str:
    """A markdown table of where each system's episodes ended (:data:`OUTCOMES`, shares of its episodes)."""
    lines = ["| system | " + " | ".join(OUTCOMES) + " |", "|" + "---|" * (len(OUTCOMES) + 1)]
    lines += ["| " + " | ".join([row.name, *(f"{row.outcomes[o]:.2f}" for o in OUTCOMES)]) + " |" for row in rows]
    return "\n".join(lines)


def step_differences(record: Sequence[Mapping[str, Any]], run: Sequence[Mapping[str, Any]]) -> list[str]:
    """How ``run``'s ``metrics.jsonl`` records differ from the same records of ``record`` (a longer run of the
    same command), the keys that measure the machine aside (:data:`agents.training.metric_keys.MACHINE_KEYS`):
    one line per differing record or key, empty when every record of ``run`` is in ``record`` exactly (values
    compared with ``==``: a reproduction is bit-exact or it is not).
    """
    def key(entry: Mapping[str, Any]) -> tuple[Any, Any]:
        return entry.get("step"), entry.get("stage")

    kept = {key(entry): entry for entry in record}
    lines = []
    for entry in run:
        theirs = kept.get(key(entry))
        if theirs is None:
            lines.append(f"step {key(entry)[0]} ({key(entry)[1] or 'update'}): not in the record")
            continue
        for name in sorted((set(entry) | set(theirs)) - {"step", "stage"}):
            if not measures_the_machine(name) and entry.get(name) != theirs.get(name):
                lines.append(f"step {key(entry)[0]} ({key(entry)[1] or 'update'}) {name}: "
                             f"{entry.get(name)!r} here, {theirs.get(name)!r} in the record")
    return lines


def plot_training(metrics_file: Path, path: Path, *, title: str = "", rows: Sequence[Row] = ()) -> Path:
    """Held-out greedy EM at each evaluation of the run (the trainer's check on its first held-out questions)
    beside its training reward per step (``metrics.jsonl`` of the training run), in one figure. With the
    table's ``rows``, the cold start's and the trained policy's seven-set EM with their intervals are drawn at
    the first and the last step, and the best untrained baseline's as a level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_jsonl(metrics_file)
    evals = [(r.get("step", 0), r["eval/greedy/em"], r.get("stage")) for r in records if "eval/greedy/em" in r]
    steps = [(r["step"], r["reward"]) for r in records if "reward" in r and "step" in r and "stage" not in r]
    last = max((step for step, _ in steps), default=0)
    figure, axis = plt.subplots(figsize=(8, 5.5))
    if steps:
        axis.plot(*zip(*steps), color="tab:gray", alpha=0.4, label="training reward (per step)")
        rewards = [reward for _, reward in steps]
        trailing = [float(np.mean(rewards[max(0, i - 9):i + 1])) for i in range(len(rewards))]
        axis.plot([step for step, _ in steps], trailing, color="black", label="training reward (mean of the last 10 steps)")
    if evals:
        x = [step + (0.0 if stage != "warm start" else 0.001) for step, _, stage in evals]
        questions = next((int(r["eval/greedy/episodes"]) for r in records if "eval/greedy/episodes" in r), 0)
        axis.plot(x, [em for _, em, _ in evals], marker="o", color="tab:blue",
                  label=f"held-out greedy EM (the trainer's check, {questions} questions)")
    at = {"cold-start": (0, "tab:green", "s"), "trained": (last, "tab:red", "D"), "trained-empty-source": (last, "tab:purple", "v")}
    for row in rows:
        if row.role in at:
            step, color, marker = at[row.role]
            em = row.average["em"]
            axis.errorbar([step], [em["mean"]], yerr=[[em["mean"] - em["ci_low"]], [em["ci_high"] - em["mean"]]],
                          color=color, marker=marker, capsize=4, linestyle="none", label=f"{row.name}: table's avg EM, 95% CI")
    baselines = [row for row in rows if row.role == "baseline"]
    if baselines:
        best = max(baselines, key=lambda row: row.average["em"]["mean"])
        axis.axhline(best.average["em"]["mean"], color="tab:orange", linestyle=":",
                     label=f"best untrained baseline ({best.name}): table's avg EM")
    axis.set_xlabel("RL step (0: before RL, after the cold start)")
    axis.set_ylabel("EM / reward")
    axis.set_ylim(bottom=0)
    axis.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    axis.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
