"""How close NL-DAG execution comes to the critical-path bound.

Random DAGs of 5–30 nodes over a few sources that sleep for a fixed latency L per call. No schedule
can beat ``(nodes on the longest path) × L``; the target is a median wall time within 1.1× of it. The
baseline is the reference systems' way: every node's search one after another. (How fast hostile
plans are read: ``benchmarks.dag_parse_adversarial``.)

Run: ``python -m benchmarks.dag_critical_path`` (``--help`` for options). Every figure is a median
over ``--repeats`` runs per DAG (the sequential baseline: ``--seq-repeats``). ``--output-dir DIR`` writes
``dag_critical_path.md`` (the table), ``.csv`` and ``.json`` (one row per DAG) and ``.png`` (each DAG's wall
time against its critical-path bound) there.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import networkx as nx

from benchmarks.common.report_files import command_line, markdown_table, write_results
from search_env.console import HelpFormatter
from search_env.dag import execute_plan, parse_plan, validate_plan
from search_env.sources.base import Passage, Source

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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


def run_dags(*, dags: int, min_nodes: int, max_nodes: int, sources: int, latency: float, k: int, repeats: int,
             seq_repeats: int, seed: int) -> list[dict[str, Any]]:
    """Execute ``dags`` random DAGs over ``sources`` sleeping sources; one row per DAG: its nodes and
    critical-path depth, the median wall time of its ``repeats`` runs against the bound (depth x
    latency), the median of ``seq_repeats`` one-after-another runs, and search calls per node."""
    rng = random.Random(seed)
    known: dict[str, Source] = {name: SleepingSource(name, latency) for name in SOURCE_NAMES[:sources]}
    rows = []
    for index in range(dags):
        n_nodes = rng.randint(min_nodes, max_nodes)
        plan = parse_plan(random_plan_text(rng, n_nodes, sources))
        problems = validate_plan(plan, known_sources=known, max_nodes=max_nodes)
        if problems:
            raise RuntimeError(f"generated plan is invalid: {problems}")
        depth = critical_path_nodes(plan.edges, list(plan.nodes))
        walls, calls = [], 0
        for _ in range(repeats):
            began = time.perf_counter()
            run = execute_plan(plan, known, k=k)
            walls.append(time.perf_counter() - began)
            calls = run.calls
            if any(node.error for node in run.nodes):
                raise RuntimeError(f"a node failed: {[node.error for node in run.nodes if node.error]}")
        sequential = statistics.median(run_sequentially(plan, known, k) for _ in range(seq_repeats))
        wall = statistics.median(walls)
        rows.append({"dag": index, "nodes": n_nodes, "depth": depth, "wall_ms": wall * 1000, "bound_ms": depth * latency * 1000,
                     "wall_over_bound": wall / (depth * latency), "sequential_ms": sequential * 1000,
                     "speedup": sequential / wall, "calls_per_node": calls / n_nodes})
    return rows


def summary_rows(rows: Sequence[dict[str, Any]], min_nodes: int, max_nodes: int) -> list[dict[str, Any]]:
    """The per-DAG rows by size (5-10, 11-20 and 21-30 nodes, then all): medians, and the 90th percentile
    and the largest wall / bound."""
    summary = []
    for low, high in [(5, 10), (11, 20), (21, 30), (min_nodes, max_nodes)]:
        chosen = [row for row in rows if low <= row["nodes"] <= high]
        if not chosen:
            continue
        ratios = sorted(row["wall_over_bound"] for row in chosen)
        summary.append({"nodes": "all" if (low, high) == (min_nodes, max_nodes) else f"{low}-{high}", "DAGs": len(chosen),
                        "depth": statistics.median(row["depth"] for row in chosen),
                        "wall ms": statistics.median(row["wall_ms"] for row in chosen), "wall/bound": statistics.median(ratios),
                        "p90": ratios[int(0.9 * (len(ratios) - 1))], "max": ratios[-1],
                        "speed-up": statistics.median(row["speedup"] for row in chosen),
                        "calls/node": statistics.median(row["calls_per_node"] for row in chosen)})
    return summary


LEGEND = ("wall/bound: wall time / (nodes on the critical path x latency), target <= 1.1; speed-up: one-after-"
          "another wall time / DAG wall time; calls/node: search calls per node (batching)")


def print_summary(summary: Sequence[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\nExecuting {args.dags} random DAGs ({args.min_nodes}-{args.max_nodes} nodes, {args.sources} sources, "
        f"latency {args.latency * 1000:g} ms per call); per DAG the median of {args.repeats} runs"
    )
    print(
        f"{'nodes':<8}{'DAGs':>5}{'depth':>7}{'wall ms':>9}{'wall/bound':>12}{'p90':>7}{'max':>7}"
        f"{'speed-up':>10}{'calls/node':>12}"
    )
    for row in summary:
        print(
            f"{row['nodes']:<8}{row['DAGs']:>5}{row['depth']:>7g}{row['wall ms']:>9.1f}{row['wall/bound']:>12.3f}"
            f"{row['p90']:>7.3f}{row['max']:>7.3f}{row['speed-up']:>9.2f}x{row['calls/node']:>12.2f}"
        )
    print(LEGEND)


def plot(rows: Sequence[dict[str, Any]], figure: Figure) -> None:
    """Each DAG's wall time against its critical-path bound, beside the bound itself, the 1.1x target and
    the one-after-another baseline."""
    ax = figure.subplots()
    bounds = [row["bound_ms"] for row in rows]
    ax.scatter(bounds, [row["sequential_ms"] for row in rows], marker="x", color="C3", label="one search after another")
    ax.scatter(bounds, [row["wall_ms"] for row in rows], color="C0", label="DAG execution")
    top = max(bounds)
    ax.plot([0, top], [0, top], color="black", linewidth=1, label="critical-path bound")
    ax.plot([0, top], [0, 1.1 * top], color="black", linestyle="--", linewidth=1, label="target: 1.1x the bound")
    ax.set(xlabel="critical-path bound (nodes on the longest path x latency), ms", ylabel="wall time, ms",
           title="NL-DAG execution against its critical-path bound")
    ax.legend(fontsize=8)


def main(argv: Sequence[str] | None = None) -> int:
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
    parser.add_argument("--output-dir", type=Path, default=None, help="write dag_critical_path.md, .csv, .json and .png here")
    args = parser.parse_args(argv)
    rows = run_dags(dags=args.dags, min_nodes=args.min_nodes, max_nodes=args.max_nodes, sources=args.sources,
                    latency=args.latency, k=args.k, repeats=args.repeats, seq_repeats=args.seq_repeats, seed=args.seed)
    summary = summary_rows(rows, args.min_nodes, args.max_nodes)
    print_summary(summary, args)
    if args.output_dir is not None:
        body = (f"{args.dags} random DAGs of {args.min_nodes}-{args.max_nodes} nodes over {args.sources} sources, "
                f"{args.latency * 1000:g} ms per search call; per DAG the median of {args.repeats} runs.\n\n"
                f"{markdown_table(summary)}\n\n{LEGEND}.")
        write_results(args.output_dir, "dag_critical_path", title="NL-DAG execution against its critical-path bound",
                      command=command_line(parser.prog, argv), body=body, rows=rows,
                      data={"settings": vars(args), "summary": summary, "dags": rows}, plot=lambda figure: plot(rows, figure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
