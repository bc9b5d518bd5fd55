"""Environment overhead: what SearchQA-v0 itself costs per step, apart from the policy.

Measures, each as the median over ``--repeats`` runs:
  * µs per token step where no tag completes (the hot path of token-level stepping);
  * µs for the step that closes an answer (reward computed), the figure peers quote;
  * µs for a step that closes a search call, with the in-process BM25 source over the synthetic world;
  * tokens/s in chunk mode (chunks of ``--chunk`` ids, no tags);
  * batched steps/s for ``--envs`` episodes stepped together with one token each.

Run: ``python -m benchmarks.env_overhead`` (add ``--repeats 7`` for steadier medians).
"""
from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym

import search_env  # noqa: F401  (registers SearchQA-v0)
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.env_overhead", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--tokens", type=int, default=1000, help="tokens per timed episode (below max_new_tokens)")
    parser.add_argument("--chunk", type=int, default=256, help="ids per chunk in chunk mode")
    parser.add_argument("--envs", type=int, default=16, help="episodes stepped together in the batched figure")
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (the median is reported)")
    args = parser.parse_args(argv)

    made = gym.make("SearchQA-v0", max_new_tokens=1_000_000, max_context=1_000_000)
    raw = made.unwrapped
    rows: list[tuple[str, list[float], str]] = []

    def measure(label: str, fn, unit: str) -> None:
        fn()  # warm-up
        rows.append((label, [fn() for _ in range(args.repeats)], unit))

    measure("token step, raw env", lambda: per_token_us(raw, args.tokens), "µs")
    measure("token step, via gym.make wrappers", lambda: per_token_us(made, args.tokens), "µs")
    measure("step closing </answer> (reward)", lambda: closing_step_us(raw, "<think> done </think><answer> Zarbo </answer>", 20), "µs")
    measure("step closing </search> (BM25 search)", lambda: closing_step_us(raw, "<search> who founded the company </search>", 20), "µs")
    measure(f"chunk mode ({args.chunk} ids/chunk)", lambda: chunk_tokens_per_s(raw, args.tokens * 20, args.chunk), "tokens/s")
    measure(f"batched, {args.envs} envs x 1 token", lambda: batched_steps_per_s(args.envs, args.tokens // 4), "env-steps/s")

    print(f"{'measure':42s} {'median':>14s}  unit      (runs: {args.repeats})")
    for label, values, unit in rows:
        median = statistics.median(values)
        shown = f"{median:,.0f}" if median >= 1000 else f"{median:.2f}"
        print(f"{label:42s} {shown:>14s}  {unit}")


if __name__ == "__main__":
    main()
