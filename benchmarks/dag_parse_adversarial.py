"""Reading and validating hostile NL-DAG plans: every shape of 100 KB block we could think of.

A model under RL can put anything inside a call tag, and the environment parses and validates it on
the step path, so the cost must stay linear in the text and small: the target is under 50 ms for a
100 KB plan of any shape. The set below covers long label groups (whose edge product once made the
reader quadratic), many edges and nodes, deep nesting, long lines, text without newlines, runs of
separators and arrows, full-width and other Unicode text, and random text; each is built to about
``--size`` characters.

For each plan the table gives the median of ``--repeats`` runs of ``parse_plan`` + ``validate_plan``,
and ``x4``: the fastest run divided by the fastest run at a quarter of the size (about 4 when linear,
16 when quadratic; below 4 where a reading limit stops work early; the fastest run is the least
disturbed by other load, and still noisy for plans that take well under a millisecond).

Run: ``python -m benchmarks.dag_parse_adversarial`` (``--help`` for options); ``--output-dir DIR`` writes
``dag_parse_adversarial.md``, ``.csv`` and ``.json`` (one row per plan) and ``.png`` (each plan's median
against the target) there.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.common.report_files import command_line, markdown_table, write_results
from search_env.console import HelpFormatter
from search_env.dag import parse_plan, validate_plan

if TYPE_CHECKING:
    from matplotlib.figure import Figure

KNOWN_SOURCES = ("news", "general", "academy")
TARGET_MS = 50.0


def _labels(count: int, prefix: str = "") -> list[str]:
    """``count`` distinct labels (``A``, ``B``, … ``Z``, ``A0`` … ``Z999``), optionally all on one letter."""
    if prefix:
        return [prefix] + [f"{prefix}{i}" for i in range(min(count, 1000) - 1)]
    plain = [chr(65 + i) for i in range(26)]
    numbered = [f"{chr(65 + i % 26)}{i // 26}" for i in range(26 * 1000)]
    return (plain + numbered)[:count]


def _repeat(unit: str, size: int) -> str:
    return unit * max(1, size // len(unit))


def _fit(size: int, lines: Iterable[str]) -> str:
    """As many of ``lines`` as fit in ``size`` characters."""
    out, used = [], 0
    for line in lines:
        if used + len(line) > size:
            break
        out.append(line)
        used += len(line)
    return "".join(out)


def _per_label(size: int, line: Callable[[str], str]) -> str:
    """``line(label)`` for distinct labels, as many as fit in ``size`` characters."""
    return _fit(size, map(line, _labels(size)))


def _random_text(size: int, alphabet: str, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(size))


def _group_block(size: int, width: int, separator: str) -> str:
    """Lines of ``width`` distinct parents -> ``width`` distinct children, repeated: all edges known
    after the first line, so each later line is pure re-statement."""
    parents, children = _labels(width, "P"), _labels(width, "C")
    return "Edges:\n" + _repeat(f"{separator.join(parents)} -> {separator.join(children)}\n", size)


def adversarial_plans(size: int, seed: int = 0) -> dict[str, str]:
    """The adversarial set, each plan about ``size`` characters, keyed by a short description."""
    half = size // 2
    distinct_nodes = _per_label(size - 7, lambda label: f"{label}: sub-question {label} (News)\n")
    cycle_labels = _labels(1024)
    shapes: dict[str, Callable[[], str]] = {
        # label groups: the product of the two sides
        "group A A .. -> B B ..": lambda: "Edges:\n" + "A " * (half // 2) + "-> " + "B " * (half // 2),
        "group A,A,.. -> B,B,..": lambda: "Edges:\n" + "A," * (half // 2) + " -> " + "B," * (half // 2),
        "group A&A&.. -> B&B&..": lambda: "A&" * (half // 2) + "->" + "B&" * (half // 2),
        "group distinct labels": lambda: "Edges:\n" + (group := _fit(half - 6, (f"{label} " for label in _labels(size)))) + "-> "
        + " ".join(group.split()[::-1]),
        "group 32x32 per line": lambda: _group_block(size, 32, " "),
        "group 8x8 per line": lambda: _group_block(size, 8, ", "),
        "group chain A B -> C D ->": lambda: "Edges:\n" + _repeat("A B -> C D -> ", size) + "E",
        "groups with fillers": lambda: "Edges:\n" + _repeat("Node A and node B & C + D -> nodes E, F ; ", size),
        # many edges
        "chain distinct labels": lambda: "Edges:\n" + _fit(size - 3, (f"{label} -> " for label in _labels(size)))[:-4],
        "chain A -> B -> A ..": lambda: "Edges:\n" + _repeat("A -> B -> ", size) + "A",
        "edge lines repeated": lambda: "Edges:\n" + _repeat("A -> B\n", size),
        "edge lines distinct": lambda: "Edges:\n" + _fit(size - 7, (f"{a} -> {b}\n" for a, b in zip(_labels(size), _labels(size)[1:]))),
        "edge lines no spaces": lambda: _repeat("A->B\n", size),
        "statements a->b, c->d;": lambda: _repeat("a -> b, c -> d; ", size),
        "many small cycles": lambda: "Edges:\n" + _fit(size - 7, (f"{a} -> {b} -> {a}\n" for a, b in zip(_labels(size)[::2], _labels(size)[1::2]))),
        "one 1024-node cycle": lambda: "Nodes:\n" + "".join(f"{label}: q (News)\n" for label in cycle_labels)
        + "Edges:\n" + " -> ".join(cycle_labels + cycle_labels[:1]) + "\n" + _repeat("x", max(0, size - 30_000)),
        # many nodes
        "node lines repeated": lambda: "Nodes:\n" + _repeat("A: q (News)\n", size),
        "node lines distinct": lambda: "Nodes:\n" + distinct_nodes,
        "nodes unknown sources": lambda: "Nodes:\n" + _per_label(size - 7, lambda label: f"{label}: sub-question {label} (Elsewhere)\n"),
        "nodes without headers": lambda: distinct_nodes,
        "nodes missing sources": lambda: "Nodes:\n" + _per_label(size - 7, lambda label: f"{label}: q\n"),
        # long lines, no newlines
        "one huge query": lambda: "Nodes:\nA: " + _repeat("why ", size) + "(News)\nEdges:\nA -> A",
        "whole plan on one line": lambda: _repeat("Nodes: A: x (News) B: y {A} (General) Edges: A -> B ; ", size),
        "label soup no arrow": lambda: "Edges:\n" + _repeat("A1 ", size),
        "label soup then arrow": lambda: _repeat("A1 ", size) + "-> B",
        "prose one line": lambda: _repeat("the model thinks aloud about its plan ", size),
        # nesting and brackets
        "nested parentheses": lambda: "A: " + "(" * half + "x" + ")" * half + " (News)",
        "open brackets": lambda: "A: " + "(" * size + ")",
        "nested mixed brackets": lambda: "Nodes:\nA: " + "([{（【" * (size // 10) + "x" + "】）}])" * (size // 10) + " [News]",
        "braces {A{A{A": lambda: "A: " + "{A" * half + " (News)",
        # separators and arrows
        "dash run in a node": lambda: "A: " + "-" * size,
        "dash run in edges": lambda: "Edges:\nA " + "-" * size + " B",
        "arrow soup ->->->": lambda: "Edges:\n" + _repeat("->", size),
        "mixed arrow runs": lambda: "Edges:\nA " + _repeat("-=—－>⟶⇒→", size) + " B",
        "colons": lambda: ":" * size,
        "semicolons in edges": lambda: "Edges:\nA -> B" + ";" * size,
        "commas in edges": lambda: "Edges:\nA" + "," * size + "-> B",
        "ampersands": lambda: "Edges:\n" + "& " * half + "-> B",
        # whitespace and lines
        "blank lines": lambda: "\n" * size,
        "CRLF and unicode breaks": lambda: _repeat("A: q (News)\r\n\u2028B -> A\x85\u2029", size),
        "space run": lambda: "Edges:" + " " * size + "x",
        "tabs and ideographic spaces": lambda: "Nodes:\n" + _repeat("\t\u3000 ", size) + "A: x (News)",
        "prose lines": lambda: _repeat("x\n", size),
        "prose lines distinct": lambda: _fit(size, (f"w{i}\n" for i in range(size))),
        "bad node lines": lambda: "Nodes:\n" + _repeat("x\n", size),
        "bad edge statements": lambda: "Edges:\n" + _repeat("A -> ; ", size),
        "empty-edge markers": lambda: "Edges:\n" + _repeat("none\n", size),
        "headers repeated": lambda: _repeat("Nodes:\nEdges:\n", size),
        "markdown headers": lambda: _repeat("**Nodes:**\n### Edges\n", size),
        "code fences": lambda: _repeat("```\n", size),
        "bullets and numbering": lambda: _per_label(size, lambda label: f"- 1. Node {label}: q (News)\n"),
        "bullet run": lambda: "Nodes:\n" + "- " * half + "A: x (News)",
        "numbering run": lambda: "Nodes:\n" + "1. " * (size // 3) + "A: x (News)",
        # unicode
        "full-width plan": lambda: _repeat("Ａ：", size),
        "full-width punctuation": lambda: "Nodes：\n" + _per_label(size - 16, lambda label: f"{label}：問題（News）\n") + "Edges：\nA → B；",
        "CJK queries": lambda: "Nodes:\n" + _per_label(size - 7, lambda label: f"{label}: 美国关税对消费者价格指数的影响 (新闻)\n"),
        "emoji and combining marks": lambda: "Nodes:\nA: " + _repeat("🙂e\u0301\u200d", size) + " (News)",
        "right-to-left text": lambda: "Nodes:\n" + _repeat("A: ما هو تأثير الرسوم (News)\n", size),
        # random text
        "random printable": lambda: _random_text(size, "".join(map(chr, range(32, 127))) + "\n", seed),
        "random plan alphabet": lambda: _random_text(size, "AaBbZz019 :;,.-=>()[]{}（）【】：；，、→⟶#*\n\t&+", seed + 1),
        "random labels and arrows": lambda: _random_text(size, "AB1 ->,;\n", seed + 2),
    }
    return {name: make() for name, make in shapes.items()}


def parse_and_validate(text: str) -> int:
    """What the environment does with a call's content; returns the number of violations."""
    return len(validate_plan(parse_plan(text), known_sources=KNOWN_SOURCES))


def run_ms(text: str, repeats: int) -> list[float]:
    """Wall time of each of ``repeats`` runs, in milliseconds."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        parse_and_validate(text)
        times.append((time.perf_counter() - began) * 1000)
    return times


def plot(rows: Sequence[dict[str, Any]], figure: Figure) -> None:
    """Each plan's median time, slowest at the top, against the target."""
    ordered = sorted(rows, key=lambda row: row["median_ms"])
    figure.set_size_inches(6.4, 0.16 * len(rows) + 1.5)
    ax = figure.subplots()
    ax.barh([row["plan"] for row in ordered], [row["median_ms"] for row in ordered], color="C0")
    ax.axvline(TARGET_MS, color="C3", linestyle="--", label=f"target: {TARGET_MS:g} ms")
    ax.set(xlabel="parse_plan + validate_plan, median ms (log scale)", xscale="log", title="Hostile NL-DAG plans")
    ax.tick_params(axis="y", labelsize=6)
    ax.legend(fontsize=8)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dag_parse_adversarial", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--size", type=int, default=100_000, help="characters per plan (about)")
    parser.add_argument("--repeats", type=int, default=7, help="runs per plan (median taken)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random-text plans")
    parser.add_argument("--output-dir", type=Path, default=None, help="write dag_parse_adversarial.md, .csv, .json and .png here")
    args = parser.parse_args(argv)

    plans = adversarial_plans(args.size, args.seed)
    quarter = adversarial_plans(args.size // 4, args.seed)
    heading = (f"parse_plan + validate_plan on {len(plans)} adversarial plans of about {args.size // 1000} KB; "
               f"median of {args.repeats} runs; target < {TARGET_MS:g} ms")
    print(heading)
    print(f"{'plan':<28}{'chars':>8}{'lines':>7}{'violations':>11}{'median ms':>11}{'x4':>7}")
    rows = []
    for name, text in plans.items():
        times = run_ms(text, args.repeats)
        median = statistics.median(times)
        growth = min(times) / max(min(run_ms(quarter[name], args.repeats)), 1e-6)
        rows.append({"plan": name, "chars": len(text), "lines": text.count(chr(10)) + 1, "violations": parse_and_validate(text),
                     "median_ms": median, "min_ms": min(times), "max_ms": max(times), "x4": growth})
        flag = "" if median < TARGET_MS else "  over target"
        print(f"{name:<28}{len(text):>8}{rows[-1]['lines']:>7}{rows[-1]['violations']:>11}{median:>11.2f}{growth:>7.1f}{flag}")
    medians = [row["median_ms"] for row in rows]
    over = sum(median >= TARGET_MS for median in medians)
    verdict = (f"slowest {max(medians):.2f} ms, median of the medians {statistics.median(medians):.2f} ms, "
               f"{over} of {len(medians)} plans at or over {TARGET_MS:g} ms")
    print(verdict)
    if args.output_dir is not None:
        body = (f"{heading}.\n\n{markdown_table(rows)}\n\n{verdict}. x4: the fastest run over the fastest run at a quarter "
                "of the size (about 4 when linear, 16 when quadratic).")
        write_results(args.output_dir, "dag_parse_adversarial", title="Reading and validating hostile NL-DAG plans",
                      command=command_line(parser.prog, argv), body=body, rows=rows,
                      data={"settings": vars(args), "target_ms": TARGET_MS, "over_target": over, "plans": rows},
                      plot=lambda figure: plot(rows, figure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
