"""Environment overhead: what SearchQA-v0 itself costs per step, apart from the policy.

Measures, each as the median over ``--repeats`` runs:
  * µs per token step where no tag completes (the hot path of token-level stepping);
  * µs for the step that closes an answer (reward computed), the figure peers quote;
  * µs for a step that closes a search call, with the in-process BM25 source over the synthetic world;
  * tokens/s in chunk mode (chunks of ``--chunk`` ids, no tags);
  * batched steps/s for ``--envs`` episodes stepped together with one token each.

Run: ``python -m benchmarks.env_overhead`` (add ``--repeats 7`` for steadier medians; ``--output-dir DIR``
writes ``env_overhead.md``, ``.json`` and ``.csv`` there, every run's value in the JSON).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

import gymnasium as gym

import search_env  # noqa: F401  (registers SearchQA-v0)
from benchmarks.common.perf_report import Measure
from benchmarks.common.report_files import command_line, markdown_table, write_results
from search_env import BatchSearchQAEnv
from search_env.console import HelpFormatter


def _plain_ids(env, n: int) -> list[int]:
    """Ids of ordinary text (no tag can complete): what most of a rollout is."""
    words = env.unwrapped.codec.encode(" the city of the company was founded by a person who studied at a university")
    return (words * (n // len(words) + 1))[:n]


def per_token_us(env, n: int) -> float:
    ids = _plain_ids(env, n)
    env.reset(seed=0)
    step = env.step
    start = time.perf_counter()
    for t in ids:
        step(t)
    return (time.perf_counter() - start) / n * 1e6


def chunk_tokens_per_s(env, n: int, chunk: int) -> float:
    ids = _plain_ids(env, n)
    chunks = [ids[i : i + chunk] for i in range(0, n, chunk)]
    env.reset(seed=0)
    start = time.perf_counter()
    for c in chunks:
        env.step(c)
    return n / (time.perf_counter() - start)


def closing_step_us(env, text: str, episodes: int) -> float:
    """Median µs of the single step whose token completes ``text``'s last tag."""
    ids = env.codec.encode(text)
    times = []
    for e in range(episodes):
        env.reset(seed=e)
        for t in ids[:-1]:
            env.step(t)
        start = time.perf_counter()
        env.step(ids[-1])
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def batched_steps_per_s(num_envs: int, steps: int) -> float:
    batch = BatchSearchQAEnv(num_envs)
    batch.reset(seed=0)
    ids = _plain_ids(batch.envs[0], steps)
    start = time.perf_counter()
    for t in ids:
        batch.step([t] * num_envs)
    return steps * num_envs / (time.perf_counter() - start)


def measures(tokens: int, chunk: int, envs: int, repeats: int, episodes: int = 20) -> list[Measure]:
    """Every figure of the benchmark, each over ``repeats`` runs after one untimed warm-up run (lazy
    initialisation, cold caches); ``episodes`` closing steps make one run of a closing-step figure."""
    made = gym.make("SearchQA-v0", max_new_tokens=1_000_000, max_context=1_000_000)
    raw = made.unwrapped
    answer, search = "<think> done </think><answer> Zarbo </answer>", "<search> who founded the company </search>"
    figures = [
        ("token step, raw env", lambda: per_token_us(raw, tokens), "µs", True),
        ("token step, via gym.make wrappers", lambda: per_token_us(made, tokens), "µs", True),
        ("step closing </answer> (reward)", lambda: closing_step_us(raw, answer, episodes), "µs", True),
        ("step closing </search> (BM25 search)", lambda: closing_step_us(raw, search, episodes), "µs", True),
        (f"chunk mode ({chunk} ids/chunk)", lambda: chunk_tokens_per_s(raw, tokens * 20, chunk), "tokens/s", False),
        (f"batched, {envs} envs x 1 token", lambda: batched_steps_per_s(envs, tokens // 4), "env-steps/s", False),
    ]
    measured = []
    for label, fn, unit, lower in figures:
        fn()
        measured.append(Measure(label, unit, [fn() for _ in range(repeats)], lower))
    made.close()
    return measured


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.env_overhead", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--tokens", type=int, default=1000, help="tokens per timed episode (below max_new_tokens)")
    parser.add_argument("--chunk", type=int, default=256, help="ids per chunk in chunk mode")
    parser.add_argument("--envs", type=int, default=16, help="episodes stepped together in the batched figure")
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (the median is reported)")
    parser.add_argument("--output-dir", type=Path, default=None, help="write env_overhead.md, .json and .csv here")
    args = parser.parse_args(argv)

    figures = measures(args.tokens, args.chunk, args.envs, args.repeats)
    print(f"{'measure':42s} {'median':>14s}  unit      (runs: {args.repeats})")
    for figure in figures:
        median = figure.median
        shown = f"{median:,.0f}" if median >= 1000 else f"{median:.2f}"
        print(f"{figure.name:42s} {shown:>14s}  {figure.unit}")
    if args.output_dir is not None:
        rows = [figure.as_dict() for figure in figures]
        write_results(args.output_dir, "env_overhead", title="Environment overhead: what SearchQA-v0 costs per step",
                      command=command_line(parser.prog, argv), rows=rows, data={"settings": vars(args), "measures": rows},
                      body=markdown_table(rows, ["name", "unit", "median", "min", "max", "runs"])
                      + f"\n\nEach figure over {args.repeats} runs after one warm-up run.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
