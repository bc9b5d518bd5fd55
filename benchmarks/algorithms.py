"""PPO, GRPO, Dr. GRPO, DAPO, REINFORCE++ and REINFORCE++-baseline side by side on the demo's 2-hop task.

Every algorithm trains on the demo's synthetic 2-hop task from the same warm-started policy, with the same
sample budget and seeds.

    python -m benchmarks.algorithms [--algorithms ...] [--seeds 0 1 2] [--output-dir runs/algorithms] [--set GROUP.FIELD=VALUE ...]
    python -m benchmarks.algorithms --quick      # a few minutes: a small world, a short warm start, one seed
    python -m benchmarks.algorithms --import my_module --algorithms grpo mine   # an algorithm of your own

**The same for every algorithm.** The demo recipe (``agents/configs/demo.yaml``, or ``--config``, with
``--set`` changes) fixes the task, model, environment, sampling, optimiser and held-out evaluation. Per
seed, the recipe's warm start runs once and is cached as a model folder (:mod:`benchmarks.common.warm_start_cache`,
``--policy-cache``); every algorithm of that seed then trains from that folder (``model.name``, no warm start
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
Any other registered algorithm (``agents.learners.register_algorithm``, in a module ``--import`` loads
first) runs by its name with its own defaults and the shared fields, sampling ``group_size`` answers per
question like the grouped ones (:func:`registered_variant`).

**Recorded per step**, from the trainer's step metrics (``metrics.jsonl`` holds the same numbers):
training reward, searches and agent tokens per episode, and the policy's entropy on trained tokens
(``run.log_entropy``); and, measured by this benchmark's callback on each step's own episodes, the KL of
the policy that sampled them to the warm-started policy (k3 per trained token, at the sampling
temperature), the same measure for every algorithm whether or not its loss has a KL term. Held-out
greedy EM (all questions, and 2-hop questions) comes from the trainer's evaluations: before training
(the warm start's level, the same for all algorithms of a seed), every ``eval.every`` steps and at the
end.

**Collapse**: a run collapses when its training reward or its entropy falls off its peak and does not
recover (:mod:`benchmarks.common.collapse`): the rolling mean over ``--window`` steps stays below a
fraction of its peak (:data:`benchmarks.common.algorithm_runs.COLLAPSE_FRACTIONS`) from some step to the
end, for at least ``--window`` steps.

**Outputs** in ``--output-dir``: one training run folder per algorithm and seed (``runs/<algorithm>/seed<n>``,
with its ``metrics.jsonl``); a PNG per metric (mean over seeds, with the min-max band over seeds);
``table.md`` and ``table.csv`` (per algorithm, mean ± standard deviation over seeds: final training
reward and other step metrics as means over the last ``--window`` steps, the final held-out EM, the
area under the held-out EM curve (trapezoids over the evaluations, divided by their step span), the
collapse steps, wall and CPU minutes of the run; the interquartile mean of the final held-out EM and of
the area with stratified-bootstrap 95% intervals, after Agarwal et al. 2021
(:mod:`benchmarks.common.rl_statistics`, ``--bootstrap-reps`` resamples, seed 0); each seed's step to
held-out EM 0.5 and 0.8; and, with two seeds or more, a second table of the probability of improvement
``P(X > Y)`` between every pair); ``runs.csv`` (the same per run, with the training episodes each
threshold took); ``heldout_em_profile.png``, the performance profiles of the final held-out EM (the
fraction of seeds above each EM, with bootstrap bands); ``results.json`` (everything, with each run's
curves and the machine). A run that finished (its record is in its folder,
:data:`benchmarks.common.algorithm_runs.RECORD_FILE`) with the same settings is not trained again: a
stopped benchmark goes on where it was, and the seeds may be run by separate commands side by side (``--seeds 1``, ``--seeds 2`` into the same
``--output-dir``) before one command with all of them writes the table; a run with other settings is
replaced. Wall minutes depend on the machine's load; the CPU minutes of the trainer's process (the
environment worker's left out) less so.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from benchmarks.common.algorithm_runs import COLLAPSE_FRACTIONS, METRICS, AlgorithmCurve, RunRecord, finished_run, save_finished_run
from benchmarks.common.algorithm_tables import (
    format_improvements, format_table, improvements, plot_metric, plot_profiles, profiles, summarize, write_csvs,
)
from benchmarks.common.collapse import collapse_step
from benchmarks.common.rl_statistics import DEFAULT_REPS
from benchmarks.learning import DEMO_RECIPE, demo_config
from search_env.console import HelpFormatter

if TYPE_CHECKING:
    from agents.training.config import TrainConfig
    from agents.training.data import RunData

__all__ = ["QUICK", "SHARED_FIELDS", "VARIANTS", "Variant", "main", "registered_variant", "run_algorithm", "variant_config"]

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

#: ``--quick``'s recipe changes (before ``--set``): a smaller world, a short warm start, 16 steps of
#: 4 questions x 4 answers, one seed (``--seeds`` may give more). A few minutes on two CPU cores. The warm
#: start is long enough for the policy to answer some questions right, so that the algorithms have rewards
#: to learn from (a shorter one tried left every reward at 0: ``benchmarks/RESULTS.md``).
QUICK = {
    "data.world_size": 6000, "data.world_scale": 100, "warm_start.steps": 600, "warm_start.copy_steps": 150,
    "warm_start.examples": 6000, "run.steps": 16, "eval.every": 4, "eval.questions": 30,
    "rollout.questions_per_step": 4, "algorithm.group_size": 4,
}


def registered_variant(name: str) -> Variant:
    """The variant that runs a registered algorithm :data:`VARIANTS` does not name: the algorithm's own
    defaults (plus :data:`SHARED_FIELDS`), ``group_size`` answers per question (a group is what the newer
    estimators compare; an algorithm that needs none still gets the same sample budget).

    Raises:
        ValueError: no algorithm is registered as ``name`` (one line, with the names that are).
    """
    from agents.learners.registry import ALGORITHMS

    if name not in ALGORITHMS:
        raise ValueError(f"--algorithms {name}: not a benchmark variant or a registered algorithm; known: "
                         f"{', '.join([*_BY_NAME, *sorted(set(ALGORITHMS) - set(_BY_NAME))])} (--import MODULE registers more)")
    return Variant(name, name, True, {}, f"the registered algorithm {name!r} with its own defaults, group_size answers per question")


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


# -- the command ----------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.algorithms", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--algorithms", nargs="+", default=[v.name for v in VARIANTS], metavar="NAME",
                        help=f"the algorithms to run: {', '.join(_BY_NAME)}, or any registered algorithm's name")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first, so the algorithms it registers can be named in --algorithms")
    parser.add_argument("--seeds", type=int, nargs="+", help="model seeds (run.seed), one warm start each (default: 0 1 2; --quick: 0)")
    parser.add_argument("--config", type=Path, default=DEMO_RECIPE, help="the shared recipe")
    parser.add_argument("--set", nargs="*", default=[], metavar="GROUP.FIELD=VALUE",
                        help="change the shared recipe (YAML values; after --quick's changes), e.g. --set run.steps=100")
    parser.add_argument("--quick", action="store_true", help="a few minutes: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    parser.add_argument("--window", type=int, help="steps of the rolling mean of the collapse rule and of the final step "
                        "metrics (default: run.steps / 20, at least 3)")
    parser.add_argument("--policy-cache", type=Path, default=DEFAULT_CACHE,
                        help="where the warm-started policies are kept between runs, one folder per set of settings")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/algorithms"), help="runs, tables, plots and results.json")
    parser.add_argument("--bootstrap-reps", type=int, default=DEFAULT_REPS,
                        help="stratified-bootstrap resamples of the confidence intervals (seeded, so tables are reproducible)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    if len(set(seeds)) != len(seeds):
        parser.error(f"--seeds repeats a seed: {' '.join(map(str, seeds))}")
    if args.bootstrap_reps < 1:
        parser.error(f"--bootstrap-reps must be >= 1, got {args.bootstrap_reps}")
    quick = [f"{k}={v}" for k, v in QUICK.items()] if args.quick else []
    runs_dir = args.output_dir / "runs"
    try:
        for module in args.imports:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ValueError(f"--import {module}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        variants = [_BY_NAME[name] if name in _BY_NAME else registered_variant(name) for name in dict.fromkeys(args.algorithms)]
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
    from benchmarks.common.warm_start_cache import WarmStart, cached_warm_start

    machine = machine_info()
    started = time.perf_counter()
    warm_starts: dict[int, WarmStart] = {}
    records: list[RunRecord] = []
    data: RunData | None = None  # every run trains and evaluates on the same worlds: built once, at the first run
    try:
        for i, (variant, seed, config) in enumerate(planned, 1):
            if seed not in warm_starts:
                warm = warm_starts[seed] = cached_warm_start(base.updated({"run.seed": seed}), args.policy_cache)
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
    rows = summarize(records, window, reps=args.bootstrap_reps)
    pairs = improvements(records, window, reps=args.bootstrap_reps)
    table = format_table(rows) + (f"\n\n{format_improvements(pairs)}" if pairs else "")
    print()
    print(table)
    out = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table + "\n", encoding="utf-8")
    write_csvs(rows, records, window, out)
    plots = [str(plot_metric(records, metric, out / f"{metric}.png")) for metric in METRICS]
    profile_curves = profiles(records, window, reps=args.bootstrap_reps)
    if profile_curves:
        plots.append(str(plot_profiles(profile_curves, out / "heldout_em_profile.png")))
    results = {
        "recipe": str(args.config), "quick": args.quick, "set": args.set, "seeds": seeds, "window": window,
        "collapse_fractions": COLLAPSE_FRACTIONS, "config": base.as_dict(),
        "variants": {v.name: {"algo": v.algo, "grouped": v.grouped, "why": v.why,
                              "algorithm": next(asdict(c.algorithm) for vv, _, c in planned if vv is v)} for v in variants},
        "warm_starts": {str(seed): {**asdict(w), "policy_dir": str(w.policy_dir)} for seed, w in warm_starts.items()},
        "bootstrap_reps": args.bootstrap_reps, "summary": rows, "improvements": pairs, "profiles": profile_curves,
        "runs": [asdict(r) for r in records], "machine": machine,
        "load_average_end": list(os.getloadavg()),
        "minutes": (time.perf_counter() - started) / 60,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"table: {out / 'table.md'}, {out / 'table.csv'}, {out / 'runs.csv'}; plots: {', '.join(plots)}; results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
