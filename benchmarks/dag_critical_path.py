"""How close NL-DAG execution comes to the critical-path bound.

Random DAGs of 5–30 nodes over a few sources that sleep for a fixed latency L per call. No schedule
can beat ``(nodes on the longest path) × L``; the target is a median wall time within 1.1× of it. The
baseline is the reference systems' way: every node's search one after another. (How fast hostile
plans are read: ``benchmarks.dag_parse_adversarial``.)

Run: ``python -m benchmarks.dag_critical_path`` (``--help`` for options). Every figure is a median
over ``--repeats`` runs per DAG (the sequential baseline: ``--seq-repeats``).
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence

import networkx as nx

from search_env.console import HelpFormatter
from search_env.dag import execute_plan, parse_plan, validate_plan
from search_env.sources.base import Passage, Source

SOURCE_NAMES = ("general", "news", "academy", "papers", "forums")


class SleepingSource(Source):
    """A fake source with a fixed latency per call, whatever the batch size."""

    def __init__(self, name: str, latency: float) -> None:
        self.name = name
        self.latency = latency

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        time.sleep(self.latency)
        return [[Passage(f"{self.name}-{i}", f"{query} title {i}", "text") for i in range(k)] for query in queries]


def random_plan_text(rng: random.Random, n_nodes: int, n_sources: int) -> str:
    """A random DAG written in the plan syntax. Parents come from a window of recent nodes whose
    width varies per DAG, so the set mixes deep chains and wide, shallow fans."""
    labels = [chr(65 + i % 26) + (str(i // 26) if i >= 26 else "") for i in range(n_nodes)]
    window = rng.choice([2, 4, 8, n_nodes])
    lines = ["Nodes:"]
    edges = []
    for i, label in enumerate(labels):
        source = SOURCE_NAMES[rng.randrange(n_sources)]
        lines.append(f"{label}: sub-question {i} about {{{labels[i - 1]}}} ({source})" if i else f"{label}: first sub-question ({source})")
        candidates = labels[max(0, i - window) : i]
        count = min(len(candidates), rng.choice([0, 1, 1, 2, 2, 3]))
        edges += [f"{parent} -> {label}" for parent in rng.sample(candidates, count)]
    lines += ["Edges:", " ; ".join(edges)]
    return "\n".join(lines)


def critical_path_nodes(plan_edges: list[tuple[str, str]], labels: Sequence[str]) -> int:
    graph = nx.DiGraph()
    graph.add_nodes_from(labels)
    graph.add_edges_from(plan_edges)
    return nx.dag_longest_path_length(graph) + 1


def run_sequentially(plan, sources: dict[str, Source], k: int) -> float:  # type: ignore[no-untyped-def]
    """The baseline: each node's search alone, in declaration (a topological) order."""
    began = time.perf_counter()
    for node in plan.nodes.values():
        sources[node.source.lower()].search([node.query], k)
    return time.perf_counter() - began


def bench_execution(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    sources: dict[str, Source] = {name: SleepingSource(name, args.latency) for name in SOURCE_NAMES[: args.sources]}
    rows = []
    for _ in range(args.dags):
        n_nodes = rng.randint(args.min_nodes, args.max_nodes)
        plan = parse_plan(random_plan_text(rng, n_nodes, args.sources))
        problems = validate_plan(plan, known_sources=sources, max_nodes=args.max_nodes)
        if problems:
            raise RuntimeError(f"generated plan is invalid: {problems}")
        depth = critical_path_nodes(plan.edges, list(plan.nodes))
        walls, calls = [], 0
        for _ in range(args.repeats):
            began = time.perf_counter()
            run = execute_plan(plan, sources, k=args.k)
            walls.append(time.perf_counter() - began)
            calls = run.calls
            if any(node.error for node in run.nodes):
                raise RuntimeError(f"a node failed: {[node.error for node in run.nodes if node.error]}")
        sequential = statistics.median(run_sequentially(plan, sources, args.k) for _ in range(args.seq_repeats))
        wall = statistics.median(walls)
        rows.append((n_nodes, depth, wall, wall / (depth * args.latency), sequential / wall, calls / n_nodes))

    print(
        f"\nExecuting {args.dags} random DAGs ({args.min_nodes}-{args.max_nodes} nodes, {args.sources} sources, "
        f"latency {args.latency * 1000:g} ms per call); per DAG the median of {args.repeats} runs"
    )
    print(
        f"{'nodes':<8}{'DAGs':>5}{'depth':>7}{'wall ms':>9}{'wall/bound':>12}{'p90':>7}{'max':>7}"
        f"{'speed-up':>10}{'calls/node':>12}"
    )
    buckets = [(5, 10), (11, 20), (21, 30), (args.min_nodes, args.max_nodes)]
    for low, high in buckets:
        chosen = [row for row in rows if low <= row[0] <= high]
        if not chosen:
            continue
        ratios = sorted(row[3] for row in chosen)
        name = "all" if (low, high) == (args.min_nodes, args.max_nodes) else f"{low}-{high}"
        print(
            f"{name:<8}{len(chosen):>5}{statistics.median(r[1] for r in chosen):>7g}"
            f"{statistics.median(r[2] for r in chosen) * 1000:>9.1f}{statistics.median(ratios):>12.3f}"
            f"{ratios[int(0.9 * (len(ratios) - 1))]:>7.3f}{ratios[-1]:>7.3f}"
            f"{statistics.median(r[4] for r in chosen):>9.2f}x{statistics.median(r[5] for r in chosen):>12.2f}"
        )
    print(
        "wall/bound: wall time / (nodes on the critical path x latency), target <= 1.1; speed-up: one-after-"
        "another wall time / DAG wall time; calls/node: search calls per node (batching)"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dag_critical_path", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--dags", type=int, default=40, help="random DAGs to execute")
    parser.add_argument("--min-nodes", type=int, default=5, help="fewest nodes of a random DAG")
    parser.add_argument("--max-nodes", type=int, default=30, help="most nodes of a random DAG")
    parser.add_argument("--sources", type=int, default=3, choices=range(1, len(SOURCE_NAMES) + 1), help="sources the nodes pick from")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds each search call sleeps")
    parser.add_argument("--k", type=int, default=3, help="passages per node")
    parser.add_argument("--repeats", type=int, default=3, help="DAG runs per plan (median taken)")
    parser.add_argument("--seq-repeats", type=int, default=1, help="one-after-another runs per plan (median taken)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random DAGs")
    args = parser.parse_args(argv)
    bench_execution(args)


if __name__ == "__main__":
    main()
