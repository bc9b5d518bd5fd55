"""Where a rollout's time goes: generation, environment stepping, search (target: env + search <= 5%).

The demo's rollout, as ``benchmarks/learning.py`` trains it (the demo recipe, ``agents/configs/demo.yaml``:
the tiny policy, the compact Search-R1 dialect, the large synthetic world, 8 questions x 8 samples),
with the policy warm-started as the demo warm-starts it, so that it searches and answers as the demo
does (an untrained model never searches and would make the environment look free; a half-trained one
loops on malformed calls and makes it look dear). ``--runs`` rollouts on fresh questions, each taken twice
side by side: with the environment stepped in-process, and in a worker process
(:class:`search_env.worker.EnvWorker`, as the demo trains: ``env_worker``) that steps each episode's chunk
while the policy decodes the others. The episodes of the two are checked to be identical. Each run's split
comes from :class:`~agents.rollout.collect.RolloutTimings`; the medians are reported, and the target is judged
on the way the demo steps its environment.

    python -m benchmarks.rollout_overhead --runs 9 --policy-cache ~/.cache/searchqa_gym/warm_starts --output-dir runs/rollout_overhead

The warm start takes about five minutes; ``--policy-cache DIR`` keeps its result for later runs, one
folder per set of settings (:mod:`benchmarks.common.warm_start_cache`). ``--output-dir DIR`` writes the
medians as ``rollout_overhead.md``, every run as ``rollout_overhead.csv``, and both with the settings as
``rollout_overhead.json`` there.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

from agents.rollout.collect import collect_rollouts
from agents.rollout.hf_sampler import HFSampler
from agents.training.build import build_trainer, env_options
from benchmarks.common.report_files import command_line, markdown_table, write_results
from benchmarks.common.warm_start_cache import warm_started
from benchmarks.learning import demo_config
from search_env import BatchSearchQAEnv
from search_env.worker import EnvWorker

TARGET = 0.05  #: the environment and search together, as a share of rollout time
_REPORTED = ("time_generation", "time_env", "time_search", "time_other", "reward_mean", "searches_mean",
             "agent_tokens_mean", "response_tokens_mean", "agent_tokens_per_s")
_MODES = ("in-process", "worker")


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rollout_overhead", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--runs", type=int, default=9, help="rollouts measured (the median is reported)")
    demo = demo_config()
    parser.add_argument("--warm-start-steps", type=int, default=demo.warm_start.steps,
                        help="warm-start steps of the demo policy, as the demo takes (0: untrained)")
    parser.add_argument("--warm-start-examples", type=int, default=demo.warm_start.examples, help="demonstrations for the warm start")
    parser.add_argument("--warm-start-copy-steps", type=int, default=demo.warm_start.copy_steps, help="copy warm-up steps before it")
    parser.add_argument("--policy-cache", type=Path, help="folder of warm-started policies kept between runs, one per set of settings")
    parser.add_argument("--cache-size", type=int, default=0, help="the environment's search cache (0: none, as the demo)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--output-dir", type=Path, help="write rollout_overhead.md, .csv and .json here")
    args = parser.parse_args(argv)
    config = demo.updated({
        "run.seed": args.seed, "run.num_threads": args.threads, "eval.questions": 0, "rollout.env_worker": False,
        "warm_start.examples": args.warm_start_examples, "warm_start.copy_steps": args.warm_start_copy_steps,
        "warm_start.steps": args.warm_start_steps, "run.report_to": [],
    })
    trainer = build_trainer(config)  # the policy, its backend and the training world; its own env is not stepped
    policy, first = trainer.policy, trainer.env.envs[0]
    examples = first.examples
    rollout, group_size = config.rollout, config.algorithm.group_size
    env = BatchSearchQAEnv(trainer.env.num_envs, dataset=examples, sources=first.sources, cache_size=args.cache_size,
                           **env_options(config, policy.codec))
    if config.warm_start.steps:
        started = time.perf_counter()
        try:
            warm_started(trainer.backend, config, trainer.env, args.policy_cache)
        except ValueError as exc:
            parser.error(f"--policy-cache: {exc}")
        print(f"warm start (or its cache): {time.perf_counter() - started:.0f} s", file=sys.stderr)

    worker = EnvWorker(env)
    runs: dict[str, list[dict]] = {mode: [] for mode in _MODES}
    for run in range(args.runs):
        start = run * rollout.questions_per_step
        questions = [(start + i) % len(examples) for i in range(rollout.questions_per_step)]
        episodes = {}
        for mode, stepped in zip(_MODES, (env, worker)):
            sampler = HFSampler(policy, temperature=rollout.temperature, top_p=rollout.top_p, seed=run)
            played = collect_rollouts(sampler, stepped, questions, group_size=group_size)
            episodes[mode] = [(t.token_ids, t.reward) for t in played.trajectories]
            stats = played.stats()
            t = played.timings
            runs[mode].append({"total_s": t.total_s, "env_plus_search": (t.env_s + t.search_s) / t.total_s,
                               "worker_busy": t.worker_s / t.total_s, **{key: stats[key] for key in _REPORTED}})
            r = runs[mode][-1]
            print(f"run {run} {mode:10s}: {r['total_s']:.2f} s  generation {r['time_generation']:.1%}  env {r['time_env']:.2%}  "
                  f"search {r['time_search']:.2%}  other {r['time_other']:.2%}  worker busy {r['worker_busy']:.1%}  | "
                  f"searches/ep {r['searches_mean']:.2f}  agent tokens/ep {r['agent_tokens_mean']:.0f}  reward {r['reward_mean']:.2f}")
        if episodes["in-process"] != episodes["worker"]:
            raise RuntimeError(f"run {run}: the worker's episodes differ from the in-process ones")
    worker.close()
    env.close()
    trainer.close_environments()
    median = {mode: {key: statistics.median(r[key] for r in runs[mode]) for key in runs[mode][0]} for mode in _MODES}
    judged = "worker" if demo.rollout.env_worker else "in-process"
    print(f"\nmedian of {args.runs} runs, {env.num_envs} episodes each ({rollout.questions_per_step} questions x "
          f"{group_size}, {config.env.protocol}, {args.threads} thread(s)); the episodes of both ways are identical:")
    for mode in _MODES:
        m = median[mode]
        print(f"  {mode:10s}: rollout {m['total_s']:.2f} s, {m['agent_tokens_per_s']:.0f} agent tokens/s | generation "
              f"{m['time_generation']:.1%} | env stepping {m['time_env']:.2%} | search {m['time_search']:.2%} | rollout "
              f"bookkeeping {m['time_other']:.2%} | env + search {m['env_plus_search']:.2%} (worker busy {m['worker_busy']:.1%})")
    overhead = median[judged]["env_plus_search"]
    verdict = (f"env + search = {overhead:.2%} of rollout time, {judged} as the demo steps it "
               f"(target <= {TARGET:.0%}: {'met' if overhead <= TARGET else 'NOT met'})")
    print(f"  {verdict}")
    report = {"args": vars(args), "runs": runs, "median": median, "judged": judged, "env_plus_search": overhead}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, default=str)
    if args.output_dir is not None:
        body = (f"Median of {args.runs} runs, {env.num_envs} episodes each ({rollout.questions_per_step} questions x {group_size}, "
                f"{config.env.protocol}, {args.threads} thread(s)); shares are fractions of the rollout's wall time.\n\n"
                + markdown_table([{"mode": mode, **median[mode]} for mode in _MODES],
                                 ["mode", "total_s", "agent_tokens_per_s", "time_generation", "time_env", "time_search", "time_other",
                                  "env_plus_search", "worker_busy"])
                + f"\n\n{verdict}.")
        write_results(args.output_dir, "rollout_overhead", title="Where the demo's rollout time goes",
                      command=command_line(parser.prog, argv), body=body, data=report,
                      rows=[{"mode": mode, "run": i, **r} for mode in _MODES for i, r in enumerate(runs[mode])])
    return report


if __name__ == "__main__":
    main()
