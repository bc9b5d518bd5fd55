"""Rollout throughput: the HF sampler and the vLLM engine side by side on the same model, questions and
protocol, at several batch sizes: agent tokens per second and the share of rollout time spent in the
environment and in search.

Run it with the vLLM virtualenv's Python (``bash .ci/vllm_venv.sh`` prints its folder)::

    VENV=$(bash .ci/vllm_venv.sh) && $VENV/bin/python -m benchmarks.rollout_throughput --batch-sizes 8 64

Each (engine, batch size) is rolled out ``--repeats`` times on the same questions (sampled, seeded per
repeat); the medians are printed as a table and one JSON line. The vLLM engine's start-up is not timed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="'smollm2', 'tiny' or a local model folder")
    parser.add_argument("--protocol", default="search-r1")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    from agents.policies.loading import load_policy
    from agents.rollout.collect import collect_rollouts
    from agents.rollout.hf_sampler import HFSampler
    from search_env import BatchSearchQAEnv

    torch.set_num_threads(args.threads)
    policy = load_policy(args.model)
    engine = None
    if "vllm" in args.engines:
        from agents.rollout.vllm_engine import VLLMEngine

        engine = VLLMEngine(policy, memory_fraction=0.08, max_model_len=4096)
    rows = []
    for batch in args.batch_sizes:
        env = BatchSearchQAEnv(batch, protocol=args.protocol, tokenizer=policy.codec, max_new_tokens=args.max_new_tokens,
                               max_context=4096)
        questions = list(range(batch))
        for name in args.engines:
            runs = []
            for repeat in range(args.repeats):
                agent = HFSampler(policy, seed=repeat) if name == "hf" else engine.agent(seed=repeat)
                started = time.perf_counter()
                rollout = collect_rollouts(agent, env, questions)
                wall = time.perf_counter() - started
                stats = rollout.stats()
                tokens = sum(sum(t.producers[t.prompt_length:]) for t in rollout.trajectories)
                runs.append({"tokens_per_s": tokens / wall, "env": stats["time_env"], "search": stats["time_search"],
                             "tokens": tokens, "wall_s": wall, "searches": stats["searches_mean"]})
            row = {"engine": name, "batch": batch,
                   **{key: statistics.median(r[key] for r in runs) for key in runs[0]}}
            rows.append(row)
            print(f"{name:5s} batch {batch:3d}: {row['tokens_per_s']:8.1f} agent tokens/s  env {row['env']:.1%}  "
                  f"search {row['search']:.1%}  ({row['tokens']:.0f} tokens in {row['wall_s']:.1f} s, "
                  f"{row['searches']:.2f} searches/episode)", flush=True)
        env.close()
    if engine is not None:
        engine.close()
    result = {"model": args.model, "protocol": args.protocol, "max_new_tokens": args.max_new_tokens,
              "repeats": args.repeats, "threads": args.threads, "machine": f"{platform.machine()} {os.cpu_count()} cpus",
              "rows": rows}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
