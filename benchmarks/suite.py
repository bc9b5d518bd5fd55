"""One performance report: every speed benchmark, one after another in this process, with peer ratios.

The report gives the machine, the median and spread of every figure, and the ratios against peers
measured in the same run.

    python -m benchmarks.suite [--quick] [--only NAME ...] [--output-dir runs/suite] [--results-md benchmarks/RESULTS.md]

The benchmarks, in order (``--only`` picks some):

- ``env_overhead``: what SearchQA-v0 costs per step apart from the policy;
- ``gem_answer_turn``: the answer turn side by side with GEM (:mod:`benchmarks.answer_turn`), GEM from the
  virtualenv of its own that ``bash .ci/gem_venv.sh`` builds, where one is built (the suite never builds it);
- ``retrieval_throughput``: queries per second in-process and through the retrieval server, against the
  Search-R1 server stand-in (:mod:`benchmarks.peers.search_r1_server`) beside the dense server;
- ``dag_critical_path``: NL-DAG execution against its critical-path bound, and against running every
  node's search one after another (the reference systems' way);
- ``dag_parse_adversarial``: reading and validating hostile plans;
- ``rollout_overhead``: where the demo's rollout time goes;
- ``grpo_step_vs_trl``: one GRPO step against TRL's ``GRPOTrainer``;
- ``data_parallel``: one update on one process against 2-rank ZeRO-2 and ZeRO-3;
- ``rollout_throughput``: the HF sampler and the vLLM engine side by side, in a child process of the vLLM
  virtualenv's Python when this Python lacks vLLM and ``bash .ci/vllm_venv.sh`` has built it (the suite never builds it).

Each benchmark's own functions are called (its numbers, not its printed table), at the suite's settings. A
benchmark whose peer or extra is not installed, or that ``--quick`` leaves out as too heavy, is listed as
skipped with the reason; one that fails is listed as failed with its error, and the others still run.
Peers are optional extras (``trl``, ``bench``, ``vllm`` ...), never needed by the suite itself.

``--quick`` runs each benchmark at its smallest setting, BM25 only for retrieval (the Search-R1 stand-in
serves a dense index, whose corpus encoding takes minutes), and skips the heavy ones: ``rollout_overhead``,
``data_parallel`` and ``rollout_throughput``. Outside it, benchmarks run at their own defaults, and what
they cache (the dense index, the warm-started policies) is kept under ``--index-dir`` and ``--policy-cache``.

Writes ``report.json``, ``report.md`` and ``report.csv`` (one line per figure) into ``--output-dir`` after
each benchmark (so a stopped suite leaves the report of what ran); exits with 1 when a benchmark failed.

``--results-md PATH`` (off by default, so that test and CI runs never touch the measured history) also puts
the finished report into the generated section ``suite`` of that markdown file, usually
``benchmarks/RESULTS.md``: the text between ``<!-- generated section suite: begin ... -->`` and ``<!--
generated section suite: end -->`` is replaced (the section is appended where the file has none), with the
date, the command and the machine; every byte outside the markers is left as it was
(:func:`benchmarks.common.report_files.replace_generated_section`).

Not in the suite: ``retrieval_recall`` (retrieval quality, not speed), ``memory_soak`` (a leak hunt over
hundreds of training steps), and the learning and evaluation benchmarks (``learning``, ``algorithms``,
``classic_rl``, ``evaluate``).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmarks.common.peer_venvs import venv_dir
from benchmarks.common.perf_report import Comparison, Measure, Section, format_markdown, report_dict
from benchmarks.common.report_files import command_line, replace_generated_section, write_csv
from search_env.console import HelpFormatter

__all__ = ["BENCHMARKS", "NOT_IN_SUITE", "Options", "Skipped", "main", "run_section"]

_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
_CACHE = Path.home() / ".cache" / "searchqa_gym"

#: Benchmarks under ``benchmarks/`` the suite does not run, and why.
NOT_IN_SUITE = {
    "retrieval_recall": "retrieval quality (recall of gold passages), not speed",
    "memory_soak": "a leak hunt over hundreds of training steps; its figures are memory growth, not speed",
    "learning": "learning, not speed (the demo recipe per seed)",
    "algorithms": "learning, not speed (the RL algorithms side by side)",
    "classic_rl": "learning, not speed (Stable-Baselines3 on macro actions)",
    "evaluate": "agent quality on QA sets",
}


class Skipped(Exception):
    """A benchmark that cannot or should not run here; the message is the reason the report gives."""


@dataclass(frozen=True)
class Options:
    """What every benchmark of the suite may read.

    Attributes:
        quick: the smallest settings, heavy benchmarks skipped.
        corpus / questions: the retrieval benchmark's corpus and questions (jsonl).
        index_dir: where retrieval indexes are kept between runs.
        policy_cache: where warm-started policies are kept between runs, one folder per set of settings.
    """

    quick: bool
    corpus: Path
    questions: Path
    index_dir: Path
    policy_cache: Path


def _needs(extra: str, *modules: str) -> None:
    """Skip unless ``modules`` are installed (checked without importing them)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise Skipped(f"{', '.join(missing)} not installed (pip install 'searchqa-gym[{extra}]')")


# -- the benchmarks ---------------------------------------------------------------------------------------


def env_overhead(options: Options, section: Section) -> None:
    from benchmarks import env_overhead as bench

    tokens, chunk, envs, repeats, episodes = (200, 64, 4, 3, 10) if options.quick else (1000, 256, 16, 7, 20)
    section.settings = {"tokens": tokens, "chunk": chunk, "envs": envs, "repeats": repeats}
    section.measures = bench.measures(tokens, chunk, envs, repeats, episodes)


def gem_answer_turn(options: Options, section: Section) -> None:
    if importlib.util.find_spec("benchmarks.answer_turn") is None:
        raise Skipped("no benchmark under benchmarks/ measures the answer turn against GEM (benchmarks/answer_turn.py)")
    from benchmarks import answer_turn as bench

    rounds, repeats = (2, 200) if options.quick else (7, 2000)
    section.settings = {"rounds": rounds, "repetitions per round": repeats, "text": bench.TEXT}
    # GEM runs in a virtualenv of its own; the suite uses one already built and never builds it (minutes, online)
    result = bench.measure(rounds=rounds, repeats=repeats, gem="existing")
    figures = {name: Measure(figure["label"], figure["unit"], figure["values"], True) for name, figure in result["figures"].items()}
    section.measures = list(figures.values())
    if "gem_answer_turn" in figures:
        version = result["gem"]["version"]
        section.comparisons = [Comparison("answer turn (gym.make env)", figures["answer_turn"], figures["gem_answer_turn"], f"GEM {version}"),
                               Comparison("answer turn (env.unwrapped)", figures["answer_turn_unwrapped"], figures["gem_answer_turn"],
                                          f"GEM {version}")]
    else:
        section.notes.append(f"no peer: {result['gem']['status']}")
    section.notes.append("each value is one round's median; a ratio here is of the medians over rounds, the module's own "
                         "per-round ratios are in the JSON details")
    section.details = {"ratio": result["ratio"], "ratio_unwrapped": result["ratio_unwrapped"], "gem": result["gem"]}


def _server_class() -> type:
    """:class:`benchmarks.retrieval_throughput.ServerProcess`, stopping its process when its start fails (a
    health check that times out on a loaded machine, a crash): the module's leaves it running, holding a
    port and the parent's output pipes."""
    from benchmarks.retrieval_throughput import ServerProcess

    class StoppedOnFailure(ServerProcess):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            try:
                super().__init__(*args, **kwargs)
            except BaseException:
                if getattr(self, "process", None) is not None and self.process.poll() is None:
                    self.stop()
                raise

    return StoppedOnFailure


def retrieval_throughput(options: Options, section: Section) -> None:
    _needs("server", "starlette", "uvicorn", "requests")
    for path, flag in ((options.corpus, "--corpus"), (options.questions, "--questions")):
        if not path.is_file():
            raise Skipped(f"no file at {path} ({flag})")
    from benchmarks import retrieval_throughput as bench
    from search_env.server.build import build_source

    start_server = _server_class()
    retrievers = ["bm25"]
    if options.quick:
        section.notes.append("quick mode: BM25 only, so no peer ratio: the Search-R1 stand-in serves a dense index, "
                             "whose corpus encoding takes minutes")
    elif all(importlib.util.find_spec(m) for m in ("faiss", "torch", "transformers")):
        retrievers.append("dense")
    else:
        section.notes.append("dense retrieval and its peer skipped: the 'dense' extra is not installed")
    peer = "dense" in retrievers and importlib.util.find_spec("fastapi") is not None
    if "dense" in retrievers and not peer:
        section.notes.append("the Search-R1 stand-in skipped: fastapi not installed (pip install 'searchqa-gym[bench]')")
    repeats = 2 if options.quick else 5
    args = argparse.Namespace(queries=16 if options.quick else 200, runs=1, max_seconds=5.0 if options.quick else 20.0,
                              client="requests")
    section.settings = {"retrievers": "+".join(retrievers), "repeats": repeats, "queries": args.queries, "top-k": bench.TOPK,
                        "corpus": options.corpus.name}
    section.notes.append("retrieval_throughput's functions return the median of their timed runs; the suite calls them once "
                         "per repeat with one timed run each (after their own warm-up run), so each value is one run")
    questions = bench.load_questions(options.questions, 10_000)
    values: dict[str, dict[str, list[float]]] = {}

    def publish() -> None:
        """The section's figures from what was measured so far (kept if a later part fails)."""
        measures = {(name, label): Measure(f"{name}: {label}", "queries/s", runs, False)
                    for name, figures in values.items() for label, runs in figures.items()}
        section.measures = [m for (name, _), m in measures.items() if name != bench.PEER]
        section.comparisons = [Comparison(f"dense, {label}", measures[("dense", label)], measures[(bench.PEER, label)],
                                          "Search-R1 stand-in") for label in values.get(bench.PEER, {})]

    for retriever in retrievers:
        # In-process first: building the source saves its index in index_dir, which the servers then load
        # instead of building it while their health check waits.
        print(f"  [{retriever}] in-process", flush=True)
        source = build_source(retriever, corpus=options.corpus, index_dir=options.index_dir, threads=1)
        try:
            for _ in range(repeats):
                for label, qps in bench.bench_in_process(source, questions, args).items():
                    values.setdefault(retriever, {}).setdefault(label, []).append(qps)
        finally:
            source.close()
        publish()
        beside = " and the Search-R1 stand-in" if peer and retriever == "dense" else ""
        print(f"  [{retriever}] through the server{beside}", flush=True)
        server_args = ["--corpus", str(options.corpus), "--retriever", retriever, "--index-dir", str(options.index_dir),
                       "--threads", "1", "--log-level", "warning"]
        servers = {retriever: start_server(server_args, 1800.0)}
        try:
            if peer and retriever == "dense":
                peer_args = ["--index-dir", str(options.index_dir / "dense"), "--corpus", str(options.corpus)]
                servers[bench.PEER] = start_server(peer_args, 1800.0, module="benchmarks.peers.search_r1_server", quiet=True)
            for _ in range(repeats):
                for name, figures in bench.bench_server({n: s.url for n, s in servers.items()}, questions, args).items():
                    for label, qps in figures.items():
                        values.setdefault(name, {}).setdefault(label, []).append(qps)
        finally:
            for server in servers.values():
                server.stop()
        publish()


def dag_critical_path(options: Options, section: Section) -> None:
    from benchmarks import dag_critical_path as bench

    dags, low, high, latency, repeats = (4, 5, 10, 0.005, 1) if options.quick else (40, 5, 30, 0.05, 3)
    section.settings = {"DAGs": dags, "nodes": f"{low}-{high}", "latency ms": latency * 1000, "runs per DAG": repeats}
    rows = bench.run_dags(dags=dags, min_nodes=low, max_nodes=high, sources=3, latency=latency, k=3, repeats=repeats,
                          seq_repeats=1, seed=0)
    ratios = [row["wall_over_bound"] for row in rows]
    ours = Measure("DAG wall time (one value per DAG)", "ms", [row["wall_ms"] for row in rows], True)
    section.measures = [Measure("wall / critical-path bound (one value per DAG)", "ratio", ratios, True), ours]
    sequential = Measure("one after another", "ms", [row["sequential_ms"] for row in rows], True)
    section.comparisons = [Comparison("wall time per DAG", ours, sequential, "one search after another")]
    section.notes.append(f"target: wall / bound <= 1.1 (median {statistics.median(ratios):.3f})")


def dag_parse_adversarial(options: Options, section: Section) -> None:
    from benchmarks import dag_parse_adversarial as bench

    size, repeats = (5_000, 3) if options.quick else (100_000, 7)
    section.settings = {"characters per plan": size, "runs per plan": repeats}
    plans = bench.adversarial_plans(size, 0)
    times = {name: bench.run_ms(text, repeats) for name, text in plans.items()}
    medians = {name: statistics.median(t) for name, t in times.items()}
    slowest = max(medians, key=medians.__getitem__)
    section.measures = [Measure(f"slowest plan: {slowest}", "ms", times[slowest], True),
                        Measure(f"every plan's median ({len(plans)} plans)", "ms", list(medians.values()), True)]
    over = sum(m >= bench.TARGET_MS for m in medians.values())
    scale = "" if size == 100_000 else f" (the target is for 100 KB plans; these are {size // 1000} KB)"
    section.notes.append(f"{over} of {len(plans)} plans at or over the {bench.TARGET_MS:g} ms target{scale}")
    section.details = {"plans": {name: {"chars": len(plans[name]), "median_ms": medians[name], "min_ms": min(times[name]),
                                        "max_ms": max(times[name])} for name in plans}}


def rollout_overhead(options: Options, section: Section) -> None:
    if options.quick:
        raise Skipped("quick mode: it builds the demo's 60,000-question world and warm-starts the demo policy "
                      "(minutes), and has no option for a smaller one")
    _needs("agents", "torch", "transformers", "yaml")
    from benchmarks import rollout_overhead as bench

    report = bench.main(["--runs", "5", "--policy-cache", str(options.policy_cache)])
    section.settings = {"runs": 5, "policy cache": str(options.policy_cache)}
    for mode, runs in report["runs"].items():
        section.measures += [Measure(f"{mode}: rollout", "s", [r["total_s"] for r in runs], True),
                             Measure(f"{mode}: env + search share", "%", [100 * r["env_plus_search"] for r in runs], True),
                             Measure(f"{mode}: agent tokens/s", "tokens/s", [r["agent_tokens_per_s"] for r in runs], False)]
    verdict = "met" if report["env_plus_search"] <= bench.TARGET else "NOT met"
    section.notes.append(f"target: env + search <= {bench.TARGET:.0%} of rollout time as the demo steps it ({report['judged']}): {verdict}")


def grpo_step_vs_trl(options: Options, section: Section) -> None:
    _needs("trl", "trl")
    _needs("agents", "torch", "transformers", "yaml")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import trl

    from benchmarks import grpo_step_vs_trl as bench

    if options.quick:
        argv = ["--task", "search-r1", "--steps", "2", "--warmup", "1", "--prompts", "2", "--group", "2", "--max-new-tokens", "16",
                "--micro-batch", "2", "--warm-start-steps", "0"]
    else:
        argv = ["--policy-cache", str(options.policy_cache)]
    args = bench.parse_args(argv)
    section.settings = {"task": args.task, "questions x group": f"{args.prompts} x {args.group}", "agent tokens": args.max_new_tokens,
                        "warm-start steps": args.warm_start_steps, "timed steps": args.steps, "warm-up steps": args.warmup}
    trl_records, our_records = bench.run(args)
    sides = {"ours": our_records[args.warmup:], "TRL": trl_records[args.warmup:]}
    for part, field in (("rollout", "rollout_s"), ("update", "update_s"), ("whole step", "total_s")):
        ours, peer = (Measure(f"{side}: {part}", "s", [getattr(r, field) for r in records], True) for side, records in sides.items())
        section.measures += [ours, peer]
        section.comparisons.append(Comparison(f"GRPO step, {part}", ours, peer, f"TRL {trl.__version__} GRPOTrainer"))
    for side, records in sides.items():
        section.measures.append(Measure(f"{side}: agent tokens/s", "tokens/s", [r.agent_tokens / r.total_s for r in records], False))
    step = section.comparisons[-1].advantage
    section.notes.append(f"target: ours >= {bench.TARGET_X}x faster per step than TRL: {'met' if step >= bench.TARGET_X else 'NOT met'} "
                         f"({step:.2f}x)")


def data_parallel(options: Options, section: Section) -> None:
    if options.quick:
        raise Skipped("quick mode: three updates of a 50M-parameter policy, two of them in 2-rank DeepSpeed runs under torchrun (minutes)")
    _needs("deepspeed", "deepspeed")
    from benchmarks import data_parallel as bench

    common = ["--hidden", "640", "--layers", "10", "--steps", "3"]
    section.settings = {"hidden": 640, "layers": 10, "updates": 3}
    with tempfile.TemporaryDirectory(prefix="suite-dp-") as folder:
        for label, tag, ranks, extra in bench.SETUPS:
            print(f"  [{label}] running", flush=True)
            rows = bench.run(tag, ranks, extra, Path(folder), common)
            section.measures += [
                Measure(f"{label}: update", "s", [max(r["step_s"] for r in rows)], True),
                Measure(f"{label}: parameters + optimiser state per rank", "MiB", [max(r["held_bytes"] for r in rows) / 2**20], True),
                Measure(f"{label}: peak resident memory per rank", "MiB", [max(r["peak_rss_bytes"] for r in rows) / 2**20], True)]
    section.notes.append("the suite calls data_parallel's run() for each of its setups in turn, so that what was measured before a "
                         "failing setup is kept; each figure is what its workers report (the update time a median of their "
                         "updates, the slowest rank's), one value")


def rollout_throughput(options: Options, section: Section) -> None:
    if options.quick:
        raise Skipped("quick mode: it starts a vLLM engine and rolls out batches of 8 and 64 episodes (minutes)")
    argv = ["--model", "scripted", "--batch-sizes", "8", "64", "--repeats", "3"]
    section.settings = {"model": "scripted", "batch sizes": "8, 64", "repeats": 3}
    if importlib.util.find_spec("vllm") is not None:
        from benchmarks import rollout_throughput as bench

        result = bench.main(argv)
    else:  # vLLM lives in a virtualenv of its own: the benchmark runs there, in a child process
        python = vllm_venv_python()
        if python is None:
            raise Skipped("vLLM is not installed in this Python, and its virtualenv is not built (bash .ci/vllm_venv.sh "
                          "builds it; the suite never does)")
        result = _in_child(python, "benchmarks.rollout_throughput", argv)
        section.notes.append(f"run by the vLLM virtualenv's Python, {python}")
    rates = {(row["engine"], row["batch"]): Measure(f"{row['engine']}, batch {row['batch']}: agent tokens/s", "tokens/s",
                                                   [row["tokens_per_s"]], False) for row in result["rows"]}
    section.measures = list(rates.values())
    for batch in sorted({b for _, b in rates}):
        if ("hf", batch) in rates and ("vllm", batch) in rates:
            ratio = rates[("vllm", batch)].median / rates[("hf", batch)].median
            section.notes.append(f"batch {batch}: vLLM {ratio:.2f}x the HF sampler's agent tokens/s")
    section.notes.append("rollout_throughput returns the median of its repeats per engine and batch size, one value each")


def vllm_venv_python() -> str | None:
    """The Python of the vLLM virtualenv ``.ci/vllm_venv.sh`` builds (at ``$SEARCHQA_VLLM_VENV``, else its
    default place), or None when none is built there."""
    python = venv_dir("SEARCHQA_VLLM_VENV", "vllm-venv") / "bin" / "python"
    return str(python) if python.is_file() else None


def _in_child(python: str, module: str, argv: Sequence[str]) -> dict[str, Any]:
    """Run ``python -m module argv`` from the repository (its log lines pass through to stderr) and return
    the JSON object it prints last on stdout."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([python, "-m", module, *argv], cwd=repo, env=env, stdout=subprocess.PIPE, text=True, timeout=3600)
    if run.returncode != 0:
        raise RuntimeError(f"{module} in {python} exited with status {run.returncode}")
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{module} in {python} printed no JSON result")
    return json.loads(lines[-1])


#: name -> (what it measures, the function filling its section), in the report's order.
BENCHMARKS: dict[str, tuple[str, Callable[[Options, Section], None]]] = {
    "env_overhead": ("What SearchQA-v0 costs per step apart from the policy (benchmarks/env_overhead.py).", env_overhead),
    "gem_answer_turn": ("The answer turn (the step that closes an answer and scores it) side by side with GEM's.", gem_answer_turn),
    "retrieval_throughput": ("Queries per second in-process and through the retrieval server, beside the Search-R1 server "
                             "stand-in (benchmarks/retrieval_throughput.py).", retrieval_throughput),
    "dag_critical_path": ("NL-DAG execution against its critical-path bound and against one search after another "
                          "(benchmarks/dag_critical_path.py).", dag_critical_path),
    "dag_parse_adversarial": ("Parsing and validating hostile NL-DAG plans (benchmarks/dag_parse_adversarial.py).", dag_parse_adversarial),
    "rollout_overhead": ("Where the demo's rollout time goes: generation, environment, search (benchmarks/rollout_overhead.py).",
                         rollout_overhead),
    "grpo_step_vs_trl": ("One GRPO step, ours against TRL's GRPOTrainer (benchmarks/grpo_step_vs_trl.py).", grpo_step_vs_trl),
    "data_parallel": ("One update on one process against 2-rank ZeRO-2 and ZeRO-3 (benchmarks/data_parallel.py).", data_parallel),
    "rollout_throughput": ("Rollout throughput of the HF sampler and the vLLM engine (benchmarks/rollout_throughput.py).",
                           rollout_throughput),
}


def run_section(name: str, options: Options) -> Section:
    """Run one benchmark of :data:`BENCHMARKS` into its section: ``skipped`` with the reason it gave,
    ``failed`` with its error in one line (what it measured before failing is kept), else ``ok``."""
    title, fill = BENCHMARKS[name]
    section = Section(name, title)
    started = time.perf_counter()
    try:
        fill(options, section)
    except Skipped as exc:
        section.status, section.reason = "skipped", str(exc)
    except (Exception, SystemExit) as exc:  # a benchmark's command may exit with its error message
        section.status, section.reason = "failed", " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
    section.seconds = time.perf_counter() - started
    return section


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="each benchmark at its smallest setting; the heavy ones skipped")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), metavar="NAME", help="run only these benchmarks (default: all)")
    parser.add_argument("--corpus", type=Path, default=_DATA / "corpus.jsonl", help="the retrieval benchmark's corpus (jsonl)")
    parser.add_argument("--questions", type=Path, default=_DATA / "hotpotqa_dev.jsonl",
                        help="the retrieval benchmark's queries (jsonl with a 'question' field)")
    parser.add_argument("--index-dir", type=Path, default=_CACHE / "throughput", help="where retrieval indexes are kept between runs")
    parser.add_argument("--policy-cache", type=Path, default=_CACHE / "suite",
                        help="where warm-started policies are kept between runs, one folder per set of settings")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/suite"), help="report.json, report.md and report.csv")
    parser.add_argument("--results-md", type=Path, default=None, metavar="PATH",
                        help="also rewrite the generated section 'suite' of this markdown file (e.g. benchmarks/RESULTS.md) "
                             "with the finished report; off by default")
    args = parser.parse_args(argv)
    if args.results_md is not None and not args.results_md.parent.is_dir():
        parser.error(f"--results-md: no folder {args.results_md.parent}")
    from benchmarks.common.machine import machine_info

    options = Options(args.quick, args.corpus, args.questions, args.index_dir, args.policy_cache)
    names = [name for name in BENCHMARKS if args.only is None or name in args.only]
    args.output_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    started = time.perf_counter()
    sections: list[Section] = []
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name}", flush=True)
        section = run_section(name, options)
        sections.append(section)
        state = f"ok, {section.seconds:.1f} s" if section.status == "ok" else f"{section.status}: {section.reason}"
        print(f"[{i}/{len(names)}] {name}: {state}", flush=True)
        report = report_dict(sections, machine, quick=args.quick, started_at=started_at, seconds=time.perf_counter() - started,
                             not_in_suite=NOT_IN_SUITE)
        (args.output_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        (args.output_dir / "report.md").write_text(format_markdown(report), encoding="utf-8")
        write_csv(args.output_dir / "report.csv", [{"benchmark": part["name"], **measure} for part in report["benchmarks"]
                                                   for measure in part["measures"]])
    failed = [s.name for s in sections if s.status == "failed"]
    print(f"report: {args.output_dir / 'report.md'}, {args.output_dir / 'report.json'}, {args.output_dir / 'report.csv'}"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    if args.results_md is not None:
        replace_generated_section(args.results_md, "suite", format_markdown(report, level=2), command=command_line(parser.prog, argv),
                                  machine=machine)
        print(f"the generated section 'suite' of {args.results_md} now holds this report")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
