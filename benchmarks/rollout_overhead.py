"""Where a rollout's time goes: generation, environment stepping, search (target: env + search <= 5%).

The demo policy (the tiny model over the built-in tokenizer, warm-started on scripted demonstrations so
that it searches and answers as the trained demo does; an untrained model never searches and would
make the environment look free) runs ``--episodes`` episodes of the synthetic world at once with
:class:`~agents.sampler.HFSampler`, ``--runs`` times on fresh questions. Each run's time split comes from
:class:`~agents.rollout.RolloutTimings`; the medians are reported.

    python -m benchmarks.rollout_overhead --episodes 64 --runs 5 --policy-cache /tmp/demo_policy.pt

The warm start takes minutes on a busy CPU; ``--policy-cache`` keeps its result for later runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from agents.config import TrainConfig
from agents.models import load_policy
from agents.rollout import collect_rollouts
from agents.sampler import HFSampler
from agents.sft import warm_start
from search_env import BatchSearchQAEnv

TARGET = 0.05  #: the environment and search together, as a share of rollout time


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--episodes", type=int, default=64, help="episodes per rollout (run at once)")
    parser.add_argument("--group-size", type=int, default=8, help="samples per question (as GRPO rolls out)")
    parser.add_argument("--runs", type=int, default=5, help="rollouts measured (the median is reported)")
    parser.add_argument("--protocol", default="search-r1")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--cache-size", type=int, default=0, help="the environment's search cache (0: none)")
    parser.add_argument("--sft-steps", type=int, default=150, help="warm-start steps of the demo policy (0: untrained)")
    parser.add_argument("--sft-examples", type=int, default=256)
    parser.add_argument("--policy-cache", help="load the warm-started policy from this file, or warm start and save it there")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.group_size < 1 or args.episodes % args.group_size:
        parser.error("--episodes must be a multiple of --group-size")
    torch.set_num_threads(args.threads)

    policy = load_policy("tiny", seed=args.seed)
    env = BatchSearchQAEnv(args.episodes, protocol=args.protocol, tokenizer=policy.codec, max_new_tokens=args.max_new_tokens,
                           cache_size=args.cache_size)
    if args.policy_cache and os.path.exists(args.policy_cache):
        policy.load_state_dict(torch.load(args.policy_cache))
    elif args.sft_steps:
        started = time.perf_counter()
        config = TrainConfig(sft_steps=args.sft_steps, sft_examples=args.sft_examples, sft_lr=3e-3, micro_batch_size=16,
                             seed=args.seed, progress=False)
        result = warm_start(policy, config, env)
        print(f"warm start: {args.sft_steps} steps in {time.perf_counter() - started:.0f} s, loss {result.losses[0]:.2f} -> {result.losses[-1]:.2f}",
              file=sys.stderr)
        if args.policy_cache:
            torch.save(policy.state_dict(), args.policy_cache)

    runs = []
    n = len(env.envs[0].examples)
    for run in range(args.runs):
        per_run = args.episodes // args.group_size
        questions = [(run * per_run + i) % n for i in range(per_run)]
        rollout = collect_rollouts(HFSampler(policy, temperature=args.temperature, seed=run), env, questions, group_size=args.group_size)
        stats = rollout.stats()
        runs.append({"total_s": rollout.timings.total_s, **{k: stats[k] for k in (
            "time_generation", "time_env", "time_search", "time_other", "reward_mean", "searches_mean",
            "agent_tokens_mean", "response_tokens_mean", "agent_tokens_per_s")}})
        r = runs[-1]
        print(f"run {run}: {r['total_s']:.2f} s  generation {r['time_generation']:.1%}  env {r['time_env']:.2%}  "
              f"search {r['time_search']:.2%}  other {r['time_other']:.2%}  | searches/ep {r['searches_mean']:.2f}  "
              f"agent tokens/ep {r['agent_tokens_mean']:.0f}  reward {r['reward_mean']:.2f}")
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    overhead = statistics.median(r["time_env"] + r["time_search"] for r in runs)
    print(f"\nmedian of {args.runs} runs, {args.episodes} episodes each ({args.episodes // args.group_size} questions x "
          f"{args.group_size}, {args.protocol}, {args.threads} thread(s)):")
    print(f"  rollout {median['total_s']:.2f} s, {median['agent_tokens_per_s']:.0f} agent tokens/s")
    print(f"  generation {median['time_generation']:.1%} | env stepping {median['time_env']:.2%} | search "
          f"{median['time_search']:.2%} | rollout bookkeeping {median['time_other']:.2%}")
    print(f"  env + search = {overhead:.2%} of rollout time (target <= {TARGET:.0%}: {'met' if overhead <= TARGET else 'NOT met'})")
    report = {"args": vars(args), "runs": runs, "median": median, "env_plus_search": overhead}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
