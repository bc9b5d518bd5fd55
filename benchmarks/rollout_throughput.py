"""Rollout throughput: the HF sampler and the vLLM engine side by side, at several batch sizes.

Both run the same model, questions and protocol; the figures are agent tokens per second and the shares
of rollout time spent generating, in the environment and in search.

Run it with the vLLM virtualenv's Python (``bash .ci/vllm_venv.sh`` prints its folder)::

    VENV=$(bash .ci/vllm_venv.sh) && PYTHONPATH=. $VENV/bin/python -m benchmarks.rollout_throughput --batch-sizes 8 64 \\
        --output-dir runs/rollout_throughput

Each (engine, batch size) is rolled out ``--repeats`` times on the same questions (sampled, seeded per
repeat); the medians are printed as a table and one JSON line, and with ``--output-dir DIR`` written as
``rollout_throughput.md``, ``.csv`` and ``.json`` there. The vLLM engine's start-up is not timed.

The shares are :class:`~agents.rollout.collect.RolloutTimings`': generation is the time inside the agent,
environment the time inside the batch environment's ``reset``/``step`` less search, search the time the
steps' search rounds took. Untrained SmolLM2 seldom searches, so ``--model scripted`` gives the searching
workload: a model whose weights write one search call and, once the results are in, a short answer
(``tests/agents/rollout/scripted_lm.py``), so every episode searches once.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from benchmarks.common.report_files import command_line, markdown_table, write_results
from search_env.console import HelpFormatter

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build_policy(model: str, protocol: str, questions: int) -> Any:
    """The policy ``--model`` names; ``scripted`` is the searching model, built for the protocol and for
    the prompts of the first ``questions`` questions (none of which may hold its marker)."""
    from agents.policies.loading import load_policy
    from agents.policies.policy import HFPolicy
    from search_env import BatchSearchQAEnv
    from search_env.tokenization import as_codec

    if model != "scripted":
        return load_policy(model)
    from tests.agents.rollout.scripted_lm import script_episode, scripted_lm

    codec = as_codec(None)
    env = BatchSearchQAEnv(1, protocol=protocol, tokenizer=codec)
    prompts = [env.envs[0].first_observation(env.examples[q])[0]["token_ids"] for q in range(questions)]
    episode = script_episode(env.protocol, codec, prompts)
    env.close()
    return HFPolicy(scripted_lm(episode, codec), codec)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rollout_throughput", description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--model", default="smollm2", help="'smollm2', 'tiny', 'scripted' or a local model folder")
    parser.add_argument("--protocol", default="search-r1", help="the environment's protocol")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 64], help="episodes rolled out together")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="agent tokens per episode at most")
    parser.add_argument("--repeats", type=int, default=3, help="rollouts per engine and batch size (medians reported)")
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"], help="engines to compare")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--output-dir", type=Path, default=None, help="write rollout_throughput.md, .csv and .json here")
    args = parser.parse_args(argv)

    import torch

    from agents.rollout.collect import collect_rollouts
    from agents.rollout.hf_sampler import HFSampler
    from search_env import BatchSearchQAEnv

    torch.set_num_threads(args.threads)
    policy = build_policy(args.model, args.protocol, max(args.batch_sizes))
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
                shares = rollout.timings.shares()
                tokens = sum(sum(t.producers[t.prompt_length:]) for t in rollout.trajectories)
                runs.append({"tokens_per_s": tokens / wall, "generation": shares["generation"], "env": shares["env"],
                             "search": shares["search"], "tokens": tokens, "wall_s": wall,
                             "searches": rollout.stats()["searches_mean"]})
            row = {"engine": name, "batch": batch,
                   **{key: statistics.median(r[key] for r in runs) for key in runs[0]}}
            rows.append(row)
            print(f"{name:5s} batch {batch:3d}: {row['tokens_per_s']:8.1f} agent tokens/s  generation {row['generation']:.2%}  "
                  f"env {row['env']:.2%}  search {row['search']:.2%}  ({row['tokens']:.0f} tokens in {row['wall_s']:.2f} s, "
                  f"{row['searches']:.2f} searches/episode)", flush=True)
        env.close()
    if engine is not None:
        engine.close()
    result = {"model": args.model, "protocol": args.protocol, "max_new_tokens": args.max_new_tokens,
              "repeats": args.repeats, "threads": args.threads, "machine": f"{platform.machine()} {os.cpu_count()} cpus",
              "rows": rows}
    print(json.dumps(result))
    if args.output_dir is not None:
        body = (f"Model {args.model}, protocol {args.protocol}, at most {args.max_new_tokens} agent tokens per episode, "
                f"{args.threads} torch threads; medians of {args.repeats} rollouts per engine and batch size. generation, "
                f"env, search: shares of rollout time.\n\n{markdown_table(rows)}")
        write_results(args.output_dir, "rollout_throughput", title="Rollout throughput: the HF sampler and the vLLM engine",
                      command=command_line(parser.prog, argv), body=body, rows=rows, data={"settings": vars(args), **result})
    return result


if __name__ == "__main__":
    main()
