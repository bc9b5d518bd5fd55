"""Nine RL algorithms side by side on the demo's 2-hop task, or on a ladder of tasks from easy to hard.

PPO, GRPO, Dr. GRPO, DAPO, REINFORCE++, REINFORCE++-baseline, RLOO, GSPO and GiGPO, and any algorithm a user
registers.

Every algorithm trains on the demo's synthetic 2-hop task (or each rung's) from the same warm-started
policy, with the same sample budget and seeds.

    python -m benchmarks.algorithms [--algorithms ...] [--seeds 0 1 2] [--output-dir runs/algorithms] [--set GROUP.FIELD=VALUE ...]
    python -m benchmarks.algorithms --quick      # a few minutes, one seed: checks the machinery, does not rank
    python -m benchmarks.algorithms --import my_module --algorithms grpo mine   # an algorithm of your own
    python -m benchmarks.algorithms --ladder quick    # 3hop and noisy, 3 seeds, about 30 min (benchmarks/common/ladder.py)
    python -m benchmarks.algorithms --ladder full --rungs 3hop    # 5 seeds, a warm start each

**The ladder** (``--ladder quick|full``, ``--rungs`` to select, ``--rungs all`` for every rung): named
rungs, each a change of the demo's task (1-hop only, 2-hop, up to 3 hops, one passage per search, a third
of the queries finding nothing), all trained from the same warm start; the rungs, the two sizes, their
default rungs (quick: the two that separated algorithms; full: all) and their budgets are in
:mod:`benchmarks.common.ladder`. Each rung writes the outputs below into its own sub-folder of
``--output-dir``; ``ladder.md``, ``ladder_auc.png`` and ``ladder.json`` there summarise across rungs (per
rung and algorithm the interquartile mean of the area under the held-out EM curve, of the steps and of the
process CPU minutes to EM 0.5 and 0.8, with 95% intervals: :mod:`benchmarks.common.algorithm_report`). ``--jobs N`` runs N at a time
(by default as many as the cores other work leaves free when the command starts),
each in a spawned process with one torch thread (a rung's runs are split into N equal shares, each
sharing one process and the rung's data, built once per share); the records are the same as with one job.

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
training reward, searches and agent tokens per episode, the share of episodes without a search (a run whose
policy stopped searching: ``rollout/zero_search_frac``), and the policy's entropy on trained tokens
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
``table.md`` and ``table.csv`` (every finished run of the task in the folder, this command's and those of earlier
commands, with a header naming any of other settings left out; per algorithm, mean ± standard deviation over seeds: final training
reward and other step metrics as means over the last ``--window`` steps, the final held-out EM, the
area under the held-out EM curve (trapezoids over the evaluations, divided by their step span), the
collapse steps, wall and CPU minutes of the run; the interquartile mean of the final held-out EM and of
the area with stratified-bootstrap 95% intervals, after Agarwal et al. 2021
(:mod:`benchmarks.common.rl_statistics`, ``--bootstrap-reps`` resamples, seed 0); each seed's step and
process CPU minutes to held-out EM 0.5 and 0.8; and, with two seeds or more, a second table of the probability of improvement
``P(X > Y)`` between every pair); ``runs.csv`` (the same per run, with the training episodes and CPU
minutes each threshold took); ``heldout_em_band.png``, the held-out EM curve's mean over seeds with the 95% bootstrap
interval of that mean; ``heldout_em_profile.png``, the performance profiles of the final held-out EM (the
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
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from benchmarks.common.algorithm_report import format_ladder_table, ladder_summary, plot_ladder_summary, write_report
from benchmarks.common.algorithm_runs import COLLAPSE_FRACTIONS, AlgorithmCurve, RunRecord, finished_run, save_finished_run
from benchmarks.common.collapse import collapse_step
from benchmarks.common.folder_runs import folder_runs
from benchmarks.common.ladder import LADDERS, RUNGS, Probe, Rung, probed_data, select_rungs
from benchmarks.common.rl_statistics import DEFAULT_REPS
from benchmarks.learning import DEMO_RECIPE, demo_config
from search_env.console import CommandParser, HelpFormatter

if TYPE_CHECKING:
    from agents.training.config import TrainConfig
    from agents.training.data import RunData

__all__ = ["QUICK", "QUICK_NOTE", "SHARED_FIELDS", "VARIANTS", "Task", "Variant", "main", "registered_variant", "run_algorithm", "run_task",
           "variant_config"]

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
    Variant("rloo", "rloo", True, {},
            "RLOO: each answer's score less the mean of its group's other answers (TRL / OpenRLHF), PPO's clipped "
            "surrogate; group_size is its k; the shared KL coefficient (the recipe's) replaces TRL's 0.05"),
    Variant("gspo", "gspo", True, {"clip_low": 3e-4, "clip_high": 4e-4, "dual_clip": None},
            "GSPO: GRPO's advantages with one importance ratio per answer (the geometric mean of its tokens'), "
            "clipped per answer at the paper's 3e-4 / 4e-4 (not the shared token clip range), no dual clip"),
    Variant("gigpo", "gigpo", True, {},
            "GiGPO: GRPO's episode advantage plus a turn-level one from step groups of equal observations inside "
            "a question's group, weight 1 and turn discount 0.95 (verl-agent's defaults)"),
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
#: The first line of ``--quick``'s table: what it can show, and the smallest command that ranks the algorithms.
QUICK_NOTE = ("--quick checks the machinery (a small world, a short warm start, 16 steps, one seed): its numbers do not "
              "rank the algorithms. The smallest command that does is the quick ladder, python -m benchmarks.algorithms "
              "--ladder quick (3 seeds, two rungs, about 30 minutes on two cores).")


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
        else:  # the worker and the engine (with any servers it launched), not the sources: the next run's too
            trainer.close()
            trainer.engine.close()
    steps = [p["step"] for p in record.steps]
    record.collapse = {name: collapse_step(steps, [p[name] for p in record.steps], fraction=fraction, window=window)
                       for name, fraction in COLLAPSE_FRACTIONS.items()}
    return record


@dataclass(frozen=True)
class Task:
    """Runs that share their task's data (built once, in one process): a rung's runs, or with several jobs
    an equal share of them per job (a share per seed would leave a core idle with three seeds and two jobs).

    Attributes:
        rung: the rung's name (``""``: the single task of a command without ``--ladder``).
        runs: (algorithm name, config) of each run, in order; each config names its warm start's folder.
        probe: the rung's retrieval noise, wrapping the data's sources (``None``: none).
        window: the collapse rule's window.
        imports: the ``--import`` modules, imported again in a job's own process.
    """

    rung: str
    runs: tuple[tuple[str, Any], ...]
    probe: Probe | None
    window: int
    imports: tuple[str, ...] = ()


def run_task(task: Task, log: Callable[[str], Any] = print) -> list[RunRecord]:
    """Train the task's runs that have not finished already (:func:`finished_run`) and return every run's
    record, printing a line as each run starts and ends."""
    from agents.training.data import build_data

    prefix = f"[{task.rung}] " if task.rung else ""
    records: list[RunRecord] = []
    data: RunData | None = None
    try:
        for name, config in task.runs:
            seed, folder = config.run.seed, config.run.output_dir
            finished = finished_run(config, task.window)
            if finished is not None:
                log(f"{prefix}{name} seed {seed} finished already ({folder})")
                records.append(finished)
                continue
            if data is None:
                built = time.perf_counter()
                data = build_data(config)
                if task.probe is not None:
                    data = probed_data(data, task.probe, config.data.world_seed)
                log(f"{prefix}data: the world, its indexes and the held-out world built in {time.perf_counter() - built:.1f} s, "
                    f"for the runs of this {'rung' if task.rung else 'command'}")
            log(f"{prefix}{name} seed {seed}: starts, {config.rollout.questions_per_step} questions x {config.algorithm.group_size} "
                f"per step, {config.run.steps} steps -> {folder}")
            record = run_algorithm(config, name, window=task.window, log=lambda line: log(prefix + line), data=data)
            save_finished_run(config, record, task.window)
            final = next((p["heldout_em"] for p in reversed(record.evaluations) if p["stage"] == "final"), None)
            log(f"{prefix}{name} seed {seed}: done in {record.wall_s / 60:.1f} min, final held-out EM "
                f"{'-' if final is None else f'{final:.3f}'}")
            records.append(record)
    finally:
        if data is not None:
            data.close()
    return records


def _job_setup(imports: Sequence[str]) -> None:
    """A job process's start: one torch thread (the jobs share the cores), the ``--import`` modules, and
    transformers' progress bars off (as the command turns them off without a bar of its own)."""
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    for module in imports:
        importlib.import_module(module)


def _task_job(task: Task) -> list[RunRecord]:
    _job_setup(task.imports)
    return run_task(task, log=lambda line: print(line, flush=True))


def _warm_start_job(config: TrainConfig, cache: Path, imports: Sequence[str]) -> Any:
    from benchmarks.common.warm_start_cache import cached_warm_start

    _job_setup(imports)
    return cached_warm_start(config, cache, log=lambda line: print(line, flush=True))


def _in_jobs(function: Callable[..., Any], calls: Sequence[tuple[Any, ...]], jobs: int) -> list[Any]:
    """``function(*call)`` of every call, in order: here with one job, else in ``jobs`` spawned processes
    (nothing of one run's state reaches another), each started afresh per call."""
    if jobs == 1:
        return [function(*call) for call in calls]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
        return list(pool.map(function, *zip(*calls)))


# -- the command ----------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m benchmarks.algorithms", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--algorithms", nargs="+", default=[v.name for v in VARIANTS], metavar="NAME",
                        help=f"the algorithms to run: {', '.join(_BY_NAME)}, or any registered algorithm's name")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first, so the algorithms it registers can be named in --algorithms")
    parser.add_argument("--seeds", type=int, nargs="+", help="model seeds (run.seed), one warm start each (default: 0 1 2; "
                        "--quick: 0; --ladder: the size's)")
    parser.add_argument("--config", type=Path, default=DEMO_RECIPE, help="the shared recipe")
    parser.add_argument("--set", nargs="*", action="extend", default=[], metavar="GROUP.FIELD=VALUE",
                        help="change the shared recipe (YAML values; after the recipe and --quick's or the ladder's changes, "
                        "wherever --config stands; every --set counts), e.g. --set run.steps=100")
    parser.add_argument("--quick", action="store_true", help="a few minutes: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    parser.add_argument("--ladder", choices=sorted(LADDERS), help="run the ladder of tasks (benchmarks/common/ladder.py) at "
                        "this size, each rung in its own sub-folder, with a summary across rungs")
    parser.add_argument("--rungs", nargs="+", metavar="RUNG",
                        help=f"the ladder's rungs to run: {', '.join(r.name for r in RUNGS)}, or all (default: the size's, "
                        f"{'; '.join(f'{s.name}: ' + ' '.join(s.rungs) for s in LADDERS.values())})")
    parser.add_argument("--jobs", type=int, help="runs in this many processes at a time (spawned, one torch thread each; "
                        "default: the cores other work leaves free when the command starts, 1 where unknown)")
    parser.add_argument("--window", type=int, help="steps of the rolling mean of the collapse rule and of the final step "
                        "metrics (default: run.steps / 20, at least 3)")
    parser.add_argument("--policy-cache", type=Path, default=DEFAULT_CACHE,
                        help="where the warm-started policies are kept between runs, one folder per set of settings")
    parser.add_argument("--output-dir", type=Path, help="runs, tables, plots and results.json (default: runs/algorithms, "
                        "--ladder: runs/ladder_SIZE)")
    parser.add_argument("--bootstrap-reps", type=int, default=DEFAULT_REPS,
                        help="stratified-bootstrap resamples of the confidence intervals (seeded, so tables are reproducible)")
    return parser


def _sized_seeds(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Any, list[int]]:
    """The ladder size (``None``: no ladder) and the seeds the arguments ask for, ``args.jobs`` set to the free
    cores when not given; a usage error (one line) for arguments that do not go together."""
    size = LADDERS[args.ladder] if args.ladder else None
    if size is not None and args.quick:
        parser.error("--quick and --ladder are two sizes: give one")
    if args.rungs is not None and size is None:
        parser.error("--rungs selects rungs of --ladder quick|full")
    seeds = args.seeds if args.seeds is not None else list(size.seeds) if size else ([0] if args.quick else [0, 1, 2])
    if len(set(seeds)) != len(seeds):
        parser.error(f"--seeds repeats a seed: {' '.join(map(str, seeds))}")
    if args.bootstrap_reps < 1:
        parser.error(f"--bootstrap-reps must be >= 1, got {args.bootstrap_reps}")
    if args.jobs is None:
        from agents.training.cpu_threads import free_cpu_cores

        args.jobs = free_cpu_cores() or 1
    elif args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    return size, seeds


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    size, seeds = _sized_seeds(parser, args)
    sized = [f"{k}={v}" for k, v in (size.changes if size else QUICK if args.quick else {}).items()]
    warm_sized = [f"{k}={v}" for k, v in (size.warm_start_changes if size else QUICK if args.quick else {}).items()]
    warm_seed = size.warm_start_seed if size else None
    out = args.output_dir or Path(f"runs/ladder_{size.name}" if size else "runs/algorithms")
    try:
        for module in args.imports:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ValueError(f"--import {module}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        variants = [_BY_NAME[name] if name in _BY_NAME else registered_variant(name) for name in dict.fromkeys(args.algorithms)]
        rungs = select_rungs(args.rungs, size) if size else [Rung("", {}, "")]
        base = demo_config([*warm_sized, *args.set], recipe=args.config)  # the warm start's recipe: every rung's
        if base.warm_start.steps < 1:
            raise ValueError("the algorithms start from a shared warm start: warm_start.steps must be >= 1")
        # every run's config is built (and checked) before anything trains; its policy folder is set once
        # the seed's warm start exists
        planned: dict[str, list[tuple[Variant, int, TrainConfig]]] = {}
        changes = {rung.name: {**rung.changes, **(size.rung_changes.get(rung.name, {}) if size else {})} for rung in rungs}
        for rung in rungs:
            config = demo_config([*sized, *(f"{k}={v}" for k, v in changes[rung.name].items()), *args.set], recipe=args.config)
            if config.eval.questions < 1:
                raise ValueError("held-out EM needs held-out questions: eval.questions must be >= 1")
            folder = out / rung.name / "runs"
            planned[rung.name] = [(v, seed, variant_config(config, v, seed=seed, policy_dir="tiny",
                                                           output_dir=folder / v.name / f"seed{seed}"))
                                  for seed in seeds for v in variants]
    except ValueError as exc:
        parser.error(str(exc))
    if args.window is not None and args.window < 1:
        parser.error(f"--window must be >= 1, got {args.window}")
    windows = {name: args.window if args.window is not None else max(3, runs[0][2].run.steps // 20) for name, runs in planned.items()}
    from search_env.console import progress_enabled

    if not progress_enabled(base.run.progress):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # the policy export's bar would bury the progress lines
    from benchmarks.common.machine import machine_info

    machine = machine_info()
    started = time.perf_counter()
    warm_seeds = [warm_seed] if warm_seed is not None else seeds
    print(f"{len(rungs) * len(seeds) * len(variants)} runs ({len(rungs)} task{'s' if len(rungs) > 1 else ''} x {len(seeds)} seeds x "
          f"{len(variants)} algorithms) after {len(warm_seeds)} warm start{'s' if len(warm_seeds) > 1 else ''} of "
          f"{base.warm_start.steps} steps{' (seed %d, shared by every seed)' % warm_seed if warm_seed is not None else ''}, "
          f"in {args.jobs} job{'s' if args.jobs > 1 else ''} -> {out}", flush=True)
    warm_list = _in_jobs(_warm_start_job, [(base.updated({"run.seed": s}), args.policy_cache, tuple(args.imports)) for s in warm_seeds],
                         min(args.jobs, len(warm_seeds)))
    for seed, warm in zip(warm_seeds, warm_list):
        loss = [warm.stats.get(f"warm_start/loss_{end}", float("nan")) for end in ("first", "last")]
        print(f"seed {seed}: warm start {'reused from the cache' if warm.reused else 'made'} ({warm.policy_dir}; "
              f"{warm.seconds / 60:.1f} min when made, loss {loss[0]:.3f} -> {loss[1]:.3f})", flush=True)
    warm_starts = {seed: warm_list[0] for seed in seeds} if warm_seed is not None else dict(zip(seeds, warm_list))
    tasks = []
    for rung in rungs:
        runs = [(v.name, seed, c.updated({"model.name": str(warm_starts[seed].policy_dir)})) for v, seed, c in planned[rung.name]]
        share = -(-len(runs) // args.jobs)
        groups = [runs[i:i + share] for i in range(0, len(runs), share)]
        tasks += [Task(rung.name, tuple((name, c) for name, _, c in group), rung.probe, windows[rung.name], tuple(args.imports))
                  for group in groups]
    done = _in_jobs(_task_job, [(t,) for t in tasks], min(args.jobs, len(tasks)))
    records_by_rung: dict[str, list[RunRecord]] = {}
    for task, records in zip(tasks, done):
        records_by_rung.setdefault(task.rung, []).extend(records)
    common = {"recipe": str(args.config), "quick": args.quick, "ladder": args.ladder, "set": args.set, "seeds": seeds,
              "jobs": args.jobs, "collapse_fractions": COLLAPSE_FRACTIONS, "machine": machine,
              "warm_starts": {str(seed): {**asdict(w), "policy_dir": str(w.policy_dir)} for seed, w in warm_starts.items()}}
    for rung in rungs:
        rung_out = out / rung.name
        first = planned[rung.name][0][2]
        found = folder_runs(rung_out / "runs", first.updated({"model.name": str(warm_starts[seeds[0]].policy_dir)}),
                            windows[rung.name], records_by_rung[rung.name])
        records_by_rung[rung.name] = found.shown  # the table covers every finished run of the task in the folder
        results = {**common, "window": windows[rung.name], "rung": {"name": rung.name, "changes": changes[rung.name], "why": rung.why,
                                      "probe": asdict(rung.probe) if rung.probe else None},
                   "config": first.as_dict(), "minutes": (time.perf_counter() - started) / 60,
                   "variants": {v.name: {"algo": v.algo, "grouped": v.grouped, "why": v.why,
                                         "algorithm": next(asdict(c.algorithm) for vv, _, c in planned[rung.name] if vv is v)}
                                for v in variants}}
        table = write_report(found.shown, windows[rung.name], args.bootstrap_reps, rung_out, results, title=rung.name,
                             header=[*([QUICK_NOTE] if args.quick else []), *found.header()])
        print(f"\n{rung.name or 'table'}:\n{table}\n(tables, plots and results.json in {rung_out})", flush=True)
    if size is not None:
        rows = ladder_summary(records_by_rung, reps=args.bootstrap_reps)
        summary = format_ladder_table(rows)
        (out / "ladder.md").write_text(summary + "\n", encoding="utf-8")
        plot_ladder_summary(rows, out / "ladder_auc.png")
        (out / "ladder.json").write_text(json.dumps({**common, "rungs": [asdict(r) for r in rungs], "summary": rows,
                                                     "minutes": (time.perf_counter() - started) / 60}, indent=2) + "\n", encoding="utf-8")
        print(f"\nladder:\n{summary}\n(ladder.md, ladder_auc.png and ladder.json in {out})", flush=True)
    print(f"done in {(time.perf_counter() - started) / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
