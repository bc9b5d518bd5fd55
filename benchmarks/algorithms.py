"""RL algorithm benchmark: PPO, GRPO, Dr. GRPO, DAPO, REINFORCE++ and REINFORCE++-baseline side by side
on the demo's synthetic 2-hop task, from the same warm-started policy, with the same sample budget and seeds.

    python -m benchmarks.algorithms [--algorithms ...] [--seeds 0 1 2] [--output-dir runs/algorithms] [--set GROUP.FIELD=VALUE ...]
    python -m benchmarks.algorithms --quick      # a few minutes: a small world, a short warm start, one seed

**The same for every algorithm.** The demo recipe (``agents/configs/demo.yaml``, or ``--config``, with
``--set`` changes) fixes the task, model, environment, sampling, optimiser and held-out evaluation. Per
seed, the recipe's warm start runs once and is cached as a model folder (:mod:`benchmarks.policy_cache`,
``--cache-dir``); every algorithm of that seed then trains from that folder (``model.name``, no warm start
of its own) with ``run.seed`` set to the seed. The sample budget is the recipe's episodes per step
(``rollout.questions_per_step`` x ``algorithm.group_size``) times ``run.steps``: the grouped algorithms
(GRPO, Dr. GRPO, DAPO, REINFORCE++-baseline) sample ``group_size`` answers to each of
``questions_per_step`` questions, the others (PPO, REINFORCE++) one answer to each of
``questions_per_step x group_size`` questions. The recipe's loss settings that are not what tells the
algorithms apart are shared too (:data:`SHARED_FIELDS`: the KL and entropy coefficients, the clip range
unless the variant changes it). The world, its indexes and the held-out world are built once and shared by
every run (:func:`agents.training.data.build_data`).

**What differs** is each algorithm's own definition, in :data:`VARIANTS`: its advantage estimator and
its loss settings (Dr. GRPO and DAPO as settings of GRPO, as :mod:`agents.learners.grpo` defines them).

**Recorded per step**, from the trainer's step metrics (``metrics.jsonl`` holds the same numbers):
training reward, searches and agent tokens per episode, and the policy's entropy on trained tokens
(``run.log_entropy``); and, measured by this benchmark's callback on each step's own episodes, the KL of
the policy that sampled them to the warm-started policy (k3 per trained token, at the sampling
temperature), the same measure for every algorithm whether or not its loss has a KL term. Held-out
greedy EM (all questions, and 2-hop questions) comes from the trainer's evaluations: before training
(the warm start's level, the same for all algorithms of a seed), every ``eval.every`` steps and at the
end.

**Collapse**: a run collapses when its training reward or its entropy falls off its peak and does not
recover (:mod:`benchmarks.common.collapse`): the rolling mean over ``--window`` steps stays below a fraction of
its peak (:data:`COLLAPSE_FRACTIONS`) from some step to the end, for at least ``--window`` steps.

**Outputs** in ``--output-dir``: one training run folder per algorithm and seed (``runs/<algorithm>/seed<n>``,
with its ``metrics.jsonl``); a PNG per metric (mean over seeds, with the min-max band over seeds);
``table.md`` and ``table.csv`` (per algorithm, mean ± standard deviation over seeds: final training
reward and other step metrics as means over the last ``--window`` steps, the final held-out EM, the
collapse steps, wall and CPU minutes of the run); ``runs.csv`` (the same per run); ``results.json``
(everything, with each run's curves and the machine). A run that finished (its record is in its folder,
:data:`RECORD_FILE`) with the same settings is not trained again: a stopped benchmark goes on where it was,
and the seeds may be run by separate commands side by side (``--seeds 1``, ``--seeds 2`` into the same
``--output-dir``) before one command with all of them writes the table; a run with other settings is
replaced. Wall minutes depend on the machine's load; the CPU minutes of the trainer's process (the
environment worker's left out) less so.
"""
from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from agents.training.callbacks import Callback
from benchmarks.common.collapse import collapse_step
from benchmarks.learning import DEMO_RECIPE, demo_config
from search_env.console import HelpFormatter

if TYPE_CHECKING:
    from agents.policies.policy import HFPolicy
    from agents.training.config import TrainConfig
    from agents.training.data import RunData
    from agents.training.evaluation import EvalResult
    from agents.training.result import TrainResult
    from agents.training.trainer import Trainer
    from search_env.trajectory import Trajectory

__all__ = ["COLLAPSE_FRACTIONS", "METRICS", "QUICK", "SHARED_FIELDS", "VARIANTS", "AlgorithmCurve", "RunRecord", "Variant",
           "format_table", "kl_to_reference", "main", "plot_metric", "run_algorithm", "summarize", "variant_config"]

Setting = Any
"""A variant's value for an ``algorithm`` field: a plain value, or a function of the shared recipe's
config (for a value that follows the recipe, such as a learning rate ratio)."""


@dataclass(frozen=True)
class Variant:
    """One algorithm as the benchmark runs it.

    Attributes:
        name: its name in the tables and plots (and ``--algorithms``).
        algo: the registered algorithm that runs it (``algo``).
        grouped: samples ``group_size`` answers per question (else one answer to each of as many questions).
        settings: ``algorithm`` fields it sets on top of the algorithm's defaults and :data:`SHARED_FIELDS`.
        why: what the settings are, and where they come from.
    """

    name: str
    algo: str
    grouped: bool
    settings: Mapping[str, Setting]
    why: str


#: Critic learning rate over the policy's in PPO: Search-R1 trains its critic at 10x the actor's rate.
CRITIC_LR_RATIO = 10.0

#: DAPO's soft overlong punishment covers the last fifth of the agent-token budget (DAPO: 4,096 of 20,480).
OVERLONG_SHARE = 0.2

VARIANTS: tuple[Variant, ...] = (
    Variant("ppo", "ppo", False, {"critic": "separate", "critic_lr": lambda c: CRITIC_LR_RATIO * c.optim.learning_rate},
            "GAE (gamma = lambda = 1) with a separate critic, a copy of the policy's backbone with a value head, at "
            "10x the policy's learning rate (Search-R1's PPO); whitened advantages, clipped values"),
    Variant("grpo", "grpo", True, {}, "group-normalised scores (divided by the group's std), token-mean loss"),
    Variant("dr-grpo", "grpo", True, {"scale_rewards": False, "loss_agg_mode": "seq-mean-token-sum-norm"},
            "Dr. GRPO: group-centred scores without the std division, no length normalisation"),
    Variant("dapo", "grpo", True, {"clip_high": 0.28, "dynamic_sampling": True, "dynamic_sampling_rounds": 1,
                                   "overlong_buffer": lambda c: int(OVERLONG_SHARE * c.env.max_new_tokens),
                                   "loss_agg_mode": "token-mean"},
            "DAPO: clip-higher (0.28), dynamic sampling (groups whose answers all scored alike are dropped; one "
            "rollout per step, no refill, so the sample budget stays the others'), soft overlong punishment over "
            "the last fifth of the token budget, token-mean loss"),
    Variant("reinforce++", "reinforce++", False, {},
            "REINFORCE++: the outcome's return whitened over the whole batch, PPO's clipped surrogate, no groups"),
    Variant("reinforce++-baseline", "reinforce++-baseline", True, {},
            "REINFORCE++-baseline: the group's mean score subtracted first, then whitened over the batch (R1-Searcher)"),
)
_BY_NAME = {v.name: v for v in VARIANTS}

#: ``algorithm`` fields every variant takes from the shared recipe (a variant's own settings win).
SHARED_FIELDS = ("kl_coef", "entropy_coef", "clip_low", "clip_high", "dual_clip", "kl_clamp", "tis_cap", "seq_mask_delta")

#: A run collapses when the rolling mean of the metric stays below this share of its peak to the end
#: (:mod:`benchmarks.common.collapse`): reward halved; entropy down to a fifth, a nearly deterministic policy
#: (entropy falls as any policy learns, so its rule is stricter).
COLLAPSE_FRACTIONS = {"reward": 0.5, "entropy": 0.2}

#: The metrics plotted and tabled: name -> (label, whether it is read from the held-out evaluations).
METRICS: dict[str, tuple[str, bool]] = {
    "reward": ("training reward (episode mean)", False),
    "heldout_em": ("held-out greedy EM", True),
    "heldout_em_2hop": ("held-out greedy EM, 2-hop questions", True),
    "searches": ("searches per episode", False),
    "response_tokens": ("agent tokens per episode", False),
    "kl": ("KL to the warm start (k3 per trained token)", False),
    "entropy": ("policy entropy (nats per trained token)", False),
}
#: Step metrics read from the trainer's metrics (the KL is the callback's own).
_TRAINER_METRICS = ("reward", "searches", "response_tokens", "entropy")

#: ``--quick``'s recipe changes (before ``--set``): a smaller world, a short warm start, 16 steps of
#: 4 questions x 4 answers, one seed (``--seeds`` may give more). A few minutes on two CPU cores. The warm
#: start is long enough for the policy to answer some questions right, so that the algorithms have rewards
#: to learn from (a shorter one tried left every reward at 0: ``benchmarks/RESULTS.md``).
QUICK = {
    "data.world_size": 6000, "data.world_scale": 100, "warm_start.steps": 600, "warm_start.copy_steps": 150,
    "warm_start.examples": 6000, "run.steps": 16, "eval.every": 4, "eval.questions": 30,
    "rollout.questions_per_step": 4, "algorithm.group_size": 4,
}
DEFAULT_CACHE = Path.home() / ".cache" / "searchqa_gym" / "warm_starts"


def variant_config(base: TrainConfig, variant: Variant, *, seed: int, policy_dir: str | Path, output_dir: str | Path) -> TrainConfig:
    """The run of ``variant`` at ``seed``: the shared recipe ``base`` with the variant's algorithm and
    settings, its budget split into questions and answers per step, trained from ``policy_dir`` (no warm
    start of its own), entropy logged, writing into ``output_dir`` (replacing an earlier run there).

    Raises:
        ValueError: a setting the algorithm refuses (one line), e.g. a group of 1 for a grouped algorithm.
    """
    group, questions = base.algorithm.group_size, base.rollout.questions_per_step
    algorithm = {f"algorithm.{name}": getattr(base.algorithm, name) for name in SHARED_FIELDS}
    algorithm.update({f"algorithm.{name}": value(base) if callable(value) else value for name, value in variant.settings.items()})
    return base.updated({
        "algo": variant.algo, **algorithm,
        "algorithm.group_size": group if variant.grouped else 1,
        "rollout.questions_per_step": questions if variant.grouped else questions * group,
        "model.name": str(policy_dir), "warm_start.steps": 0, "warm_start.copy_steps": 0,
        "run.seed": seed, "run.output_dir": str(output_dir), "run.overwrite": True, "run.resume": False,
        "run.log_entropy": True,
    })


# -- measuring a run ------------------------------------------------------------------------------------


def kl_to_reference(policy: HFPolicy, reference: HFPolicy, trajectories: Sequence[Trajectory], *, temperature: float,
                    rows_per_pass: int = 16) -> float | None:
    """Mean k3 estimate of KL(policy || reference) over the trained tokens of ``trajectories``, which
    ``policy`` sampled (log-probs at the sampling ``temperature``); ``None`` when no token is trained."""
    import torch

    from agents.learners.core import kl_estimate
    from agents.rollout.batch import build_batch

    batch = build_batch(trajectories, [str(i) for i in range(len(trajectories))], policy.codec.pad_id)
    device = next(policy.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for part in batch.micro_batches(rows_per_pass):
            keep = part.trained_mask.bool().to(device)
            if not keep.any():
                continue
            args = (part.input_ids.to(device), part.attention_mask.to(device), part.position_ids.to(device))
            options = {"temperature": temperature, "from_column": part.first_trained_column}
            kl = kl_estimate(policy(*args, **options).logprobs, reference(*args, **options).logprobs, "k3")
            total += float(kl[keep].sum())
            count += int(keep.sum())
    return total / count if count else None


@dataclass
class RunRecord:
    """One algorithm's run at one seed.

    Attributes:
        steps: per training step, ``step`` and the step metrics of :data:`METRICS` (``None`` where the step
            had none, e.g. no entropy in a step whose update had no trained tokens).
        evaluations: per held-out evaluation, ``step``, ``stage`` (``"start"``, ``"final"`` or ``None``),
            ``heldout_em`` and ``heldout_em_2hop`` (greedy).
        episodes: episodes rolled out for training, all steps together.
        wall_s / cpu_s: the run's wall time and its process's CPU time, evaluations included.
        eval_wall_s: the wall time of its held-out evaluations.
        collapse: per metric of :data:`COLLAPSE_FRACTIONS`, the step it collapsed at (``None``: it did not).
    """

    algorithm: str
    seed: int
    output_dir: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    episodes: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    eval_wall_s: float = 0.0
    collapse: dict[str, int | None] = field(default_factory=dict)


class AlgorithmCurve(Callback):
    """A trainer callback filling a :class:`RunRecord`: the step metrics, the KL of each step's sampling
    policy to the policy the run started from (a frozen copy made when the run starts), the held-out
    evaluations and the run's times; it prints a progress line at each evaluation."""

    def __init__(self, record: RunRecord, log: Callable[[str], Any] = print) -> None:
        self.record = record
        self.log = log
        self._reference: HFPolicy | None = None
        self._kl: float | None = None
        self._started = (0.0, 0.0)
        self._eval_started = 0.0

    def on_run_start(self, trainer: Trainer) -> None:
        from agents.policies.policy import HFPolicy

        self._started = (time.perf_counter(), time.process_time())
        self._reference = HFPolicy(copy.deepcopy(trainer.policy.model), trainer.policy.codec).eval().requires_grad_(False)

    def on_rollout(self, trainer: Trainer, trajectories: Sequence[Trajectory]) -> None:
        assert self._reference is not None, "on_run_start makes the reference"
        self.record.episodes += len(trajectories)
        self._kl = kl_to_reference(trainer.policy, self._reference, trajectories, temperature=trainer.config.rollout.temperature)

    def on_update(self, trainer: Trainer, metrics: Mapping[str, Any]) -> None:
        point = {"step": trainer.step, **{name: _number(metrics.get(name)) for name in _TRAINER_METRICS}, "kl": self._kl}
        self.record.steps.append(point)

    def on_evaluation_start(self, trainer: Trainer, stage: str | None) -> None:
        self._eval_started = time.perf_counter()

    def on_evaluation(self, trainer: Trainer, stage: str | None, results: Mapping[str, EvalResult]) -> None:
        self.record.eval_wall_s += time.perf_counter() - self._eval_started
        greedy = {mode: r for mode, r in results.items() if mode == "greedy" or mode.startswith("greedy ")}
        episodes = sum(r.episodes for r in greedy.values())
        em = sum(r.em * r.episodes for r in greedy.values()) / episodes if episodes else None
        two_hop = greedy.get("greedy 2-hop")
        point = {"step": trainer.step, "stage": stage, "heldout_em": em, "heldout_em_2hop": two_hop.em if two_hop else None}
        self.record.evaluations.append(point)
        last = self.record.steps[-1] if self.record.steps and trainer.step > 0 else {}
        shown = (("reward", 3), ("entropy", 3), ("kl", 5)) if last else ()
        training = "".join(f", {name} {_fmt(last.get(name), digits)}" for name, digits in shown)
        self.log(f"[{self.record.algorithm} seed {self.record.seed}] step {trainer.step}/{trainer.config.run.steps}"
                 f"{' (' + stage + ')' if stage else ''}{training}, held-out greedy EM {_fmt(em)} (2-hop "
                 f"{_fmt(point['heldout_em_2hop'])}), {(time.perf_counter() - self._started[0]) / 60:.1f} min")

    def on_run_end(self, trainer: Trainer, result: TrainResult) -> None:
        self.record.wall_s = time.perf_counter() - self._started[0]
        self.record.cpu_s = time.process_time() - self._started[1]
        self._reference = None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def run_algorithm(config: TrainConfig, algorithm: str, *, window: int, log: Callable[[str], Any] = print,
                  data: RunData | None = None) -> RunRecord:
    """Train ``config`` (a :func:`variant_config`) and return its record, with its collapse steps. ``data``:
    the questions and sources built already for the recipe (:func:`agents.training.data.build_data`),
    shared with the other runs, which this run leaves open; by default they are built for this run."""
    from agents.training.build import build_trainer

    record = RunRecord(algorithm, config.run.seed, config.run.output_dir)
    trainer = build_trainer(config, callbacks=[AlgorithmCurve(record, log)], data=data)
    try:
        trainer.train()
    finally:
        if data is None:
            trainer.close_environments()
        else:  # the environment worker only: the sources are the next run's too
            trainer.close()
    steps = [p["step"] for p in record.steps]
    record.collapse = {name: collapse_step(steps, [p[name] for p in record.steps], fraction=fraction, window=window)
                       for name, fraction in COLLAPSE_FRACTIONS.items()}
    return record


#: A finished run's record, in its run folder: a later command with the same settings takes it instead of
#: training again (a stopped benchmark goes on where it was; seeds may be run by separate commands).
RECORD_FILE = "algorithm_record.json"


def finished_run(config: TrainConfig, window: int) -> RunRecord | None:
    """The record :func:`save_finished_run` left in ``config``'s run folder, when it was made with the same
    settings (the whole config, the warm start's folder included, and the collapse window); else ``None``."""
    path = Path(config.run.output_dir) / RECORD_FILE
    if not path.is_file():
        return None
    saved = json.loads(path.read_text(encoding="utf-8"))
    if saved.get("config") != json.loads(json.dumps(config.as_dict())) or saved.get("window") != window:
        return None
    return RunRecord(**saved["record"])


def save_finished_run(config: TrainConfig, record: RunRecord, window: int) -> Path:
    """Write ``record`` into its run folder with the settings it was made with (for :func:`finished_run`)."""
    path = Path(config.run.output_dir) / RECORD_FILE
    path.write_text(json.dumps({"config": config.as_dict(), "window": window, "record": asdict(record)}, indent=1) + "\n",
                    encoding="utf-8")
    return path


# -- summaries, tables and plots --------------------------------------------------------------------------


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


# -- the command ----------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.algorithms", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--algorithms", nargs="+", default=[v.name for v in VARIANTS], choices=[v.name for v in VARIANTS],
                        metavar="NAME", help=f"the algorithms to run, of: {', '.join(_BY_NAME)}")
    parser.add_argument("--seeds", type=int, nargs="+", help="model seeds (run.seed), one warm start each (default: 0 1 2; --quick: 0)")
    parser.add_argument("--config", type=Path, default=DEMO_RECIPE, help="the shared recipe")
    parser.add_argument("--set", nargs="*", default=[], metavar="GROUP.FIELD=VALUE",
                        help="change the shared recipe (YAML values; after --quick's changes), e.g. --set run.steps=100")
    parser.add_argument("--quick", action="store_true", help="a few minutes: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    parser.add_argument("--window", type=int, help="steps of the rolling mean of the collapse rule and of the final step "
                        "metrics (default: run.steps / 20, at least 3)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where the warm-started policies are kept between runs")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/algorithms"), help="runs, tables, plots and results.json")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    if len(set(seeds)) != len(seeds):
        parser.error(f"--seeds repeats a seed: {' '.join(map(str, seeds))}")
    quick = [f"{k}={v}" for k, v in QUICK.items()] if args.quick else []
    variants = [_BY_NAME[name] for name in dict.fromkeys(args.algorithms)]
    runs_dir = args.output_dir / "runs"
    try:
        base = demo_config([*quick, *args.set], recipe=args.config)
        if base.eval.questions < 1:
            raise ValueError("held-out EM needs held-out questions: eval.questions must be >= 1")
        if base.warm_start.steps < 1:
            raise ValueError("the algorithms start from a shared warm start: warm_start.steps must be >= 1")
        # every run's config is built (and checked) before anything trains; its policy folder is set once
        # the seed's warm start exists
        planned = [(v, seed, variant_config(base, v, seed=seed, policy_dir="tiny", output_dir=runs_dir / v.name / f"seed{seed}"))
                   for seed in seeds for v in variants]
    except ValueError as exc:
        parser.error(str(exc))
    window = args.window if args.window is not None else max(3, base.run.steps // 20)
    if window < 1:
        parser.error(f"--window must be >= 1, got {window}")
    from search_env.console import progress_enabled

    if not progress_enabled(base.run.progress):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # the policy export's bar would bury the progress lines
    from agents.training.data import build_data
    from benchmarks.common.machine import machine_info
    from benchmarks.policy_cache import WarmStart, cached_warm_start

    machine = machine_info()
    started = time.perf_counter()
    warm_starts: dict[int, WarmStart] = {}
    records: list[RunRecord] = []
    data: RunData | None = None  # every run trains and evaluates on the same worlds: built once, at the first run
    try:
        for i, (variant, seed, config) in enumerate(planned, 1):
            if seed not in warm_starts:
                warm = warm_starts[seed] = cached_warm_start(base.updated({"run.seed": seed}), args.cache_dir)
                made = "reused from the cache" if warm.reused else "made"
                loss = [warm.stats.get(f"warm_start/loss_{end}", float("nan")) for end in ("first", "last")]
                print(f"seed {seed}: warm start {made} ({warm.policy_dir}; {warm.seconds / 60:.1f} min when made, loss "
                      f"{loss[0]:.3f} -> {loss[1]:.3f})", flush=True)
            config = config.updated({"model.name": str(warm_starts[seed].policy_dir)})
            finished = finished_run(config, window)
            if finished is not None:
                print(f"run {i}/{len(planned)}: {variant.name} seed {seed} finished already ({config.run.output_dir})", flush=True)
                records.append(finished)
                continue
            if data is None:
                built = time.perf_counter()
                data = build_data(config)
                print(f"data: the world, its indexes and the held-out world built once, in {time.perf_counter() - built:.1f} s, "
                      f"for the runs of this command", flush=True)
            print(f"run {i}/{len(planned)}: {variant.name} seed {seed}, {config.rollout.questions_per_step} questions x "
                  f"{config.algorithm.group_size} per step, {config.run.steps} steps -> {config.run.output_dir}", flush=True)
            record = run_algorithm(config, variant.name, window=window, log=lambda line: print(line, flush=True), data=data)
            save_finished_run(config, record, window)
            records.append(record)
    finally:
        if data is not None:
            data.close()
    rows = summarize(records, window)
    table = format_table(rows)
    print()
    print(table)
    out = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table + "\n", encoding="utf-8")
    write_csvs(rows, records, window, out)
    plots = [str(plot_metric(records, metric, out / f"{metric}.png")) for metric in METRICS]
    results = {
        "recipe": str(args.config), "quick": args.quick, "set": args.set, "seeds": seeds, "window": window,
        "collapse_fractions": COLLAPSE_FRACTIONS, "config": base.as_dict(),
        "variants": {v.name: {"algo": v.algo, "grouped": v.grouped, "why": v.why,
                              "algorithm": next(asdict(c.algorithm) for vv, _, c in planned if vv is v)} for v in variants},
        "warm_starts": {str(seed): {**asdict(w), "policy_dir": str(w.policy_dir)} for seed, w in warm_starts.items()},
        "summary": rows, "runs": [asdict(r) for r in records], "machine": machine,
        "load_average_end": list(os.getloadavg()),
        "minutes": (time.perf_counter() - started) / 60,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"table: {out / 'table.md'}, {out / 'table.csv'}, {out / 'runs.csv'}; plots: {', '.join(plots)}; results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
