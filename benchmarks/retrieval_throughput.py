"""Retrieval throughput (queries per second): in-process and through the retrieval server.

Sources: BM25 and dense (MiniLM encoder, faiss flat index) over the shared corpus.jsonl, queried with
real questions (HotpotQA dev by default), top-k 3 as in Search-R1. For each source:

- in-process, one query per ``search`` call and 16 per call;
- through the server (a ``python -m search_env.server`` subprocess on 127.0.0.1): one client sending
  1 query per request, one client sending 16 per request, 8 concurrent clients sending 1 per request
  (each with its own keep-alive session, the way Search-R1-style clients post: ``requests`` by
  default, ``--client urllib3`` for the lighter layer under it), and 16 concurrent environments (16
  threads sharing one RemoteSource, whose client-side batching merges their calls). The clients run
  on the same machine as the server and share its cores, as they did when the peer was measured.

The peer is Search-R1's own retrieval server with the same encoder and a flat index on the same
corpus, measured on this machine when the targets were set: 52 q/s at 1 query per request, 161 q/s
at 16 per request, 58 q/s with 8 clients. Targets: at least 2x the peer at 1 query per request, 3x
with 8 clients. This machine's speed drifts, so ``--peer`` also runs a stand-in for that server
(:mod:`benchmarks.peers.search_r1_server`) beside ours and alternates their runs, one of ours then
one of the peer's, for each of the three client figures: the side-by-side ratio is the one to trust.

Every figure is the median of ``--runs`` timed runs after one warm-up run; each run is bounded in
query count (``--queries``) and wall time (``--max-seconds``). Only 127.0.0.1 is contacted.

Run: ``python -m benchmarks.retrieval_throughput`` (``--help`` for options). The first dense run
encodes the corpus once and caches the index under ``--index-dir``. ``--output-dir DIR`` writes the table
as ``retrieval_throughput.md``, ``.csv`` and ``.json`` there.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import requests
import urllib3

from benchmarks.common.report_files import command_line, markdown_table, write_results
from search_env.console import HelpFormatter
from search_env.server.build import build_source
from search_env.sources.base import Source
from search_env.sources.remote import RemoteSource

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
PEER_QPS = {"1/request": 52.0, "16/request": 161.0, "8 clients": 58.0}
TARGET_X = {"1/request": 2.0, "8 clients": 3.0}
TOPK = 3
PEER = "peer now"  # the Search-R1 stand-in, measured beside ours
RATIOS = ("dense/then", "dense/peer")  #: the table's columns that are multiples, not queries/s


def load_questions(path: Path, limit: int) -> list[str]:
    with path.open(encoding="utf-8") as handle:
        questions = [json.loads(line)["question"] for line in handle if line.strip()]
    return questions[:limit]


class Clock:
    """Counts queries done until a query budget or a deadline is reached (whichever first)."""

    def __init__(self, budget: int, max_seconds: float) -> None:
        self.budget = budget
        self.deadline = time.perf_counter() + max_seconds
        self.taken = 0
        self.lock = threading.Lock()

    def take(self, n: int) -> tuple[int, int]:
        """Claim up to ``n`` queries of the budget: (index of the first, count); count 0 means stop."""
        with self.lock:
            if time.perf_counter() > self.deadline:
                return self.taken, 0
            n = max(min(n, self.budget - self.taken), 0)
            self.taken += n
            return self.taken - n, n


def timed(workers: int, per_call: int, budget: int, max_seconds: float, questions: list[str], call: Callable[[int, list[str]], None]) -> float:
    """Queries per second of ``workers`` threads, each repeatedly taking ``per_call`` queries and
    passing them to ``call(worker, queries)``."""
    clock = Clock(budget, max_seconds)
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            while True:
                start, n = clock.take(per_call)
                if not n:
                    return
                call(w, [questions[(start + i) % len(questions)] for i in range(n)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max_seconds + 120)
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"a benchmark worker failed: {errors[0]!r}") from errors[0]
    return clock.taken / elapsed


def alternating_median_qps(runs: int, measures: dict[str, Callable[[], float]]) -> dict[str, float]:
    """Median queries/s of each measure, their runs alternated (one of each in turn) so that every
    measure sees the same drift of the machine's speed."""
    for measure in measures.values():
        measure()  # warm-up: first calls pay for lazy initialisation and cold caches
    samples: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(runs):
        for name, measure in measures.items():
            samples[name].append(measure())
    return {name: statistics.median(values) for name, values in samples.items()}


def median_qps(runs: int, measure: Callable[[], float]) -> float:
    return alternating_median_qps(runs, {"": measure})[""]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``python -m <module>`` (by default our server) in a subprocess on 127.0.0.1, stopped on exit."""

    def __init__(self, args: list[str], startup_s: float, module: str = "search_env.server", quiet: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        repo = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}
        command = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.process = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL if quiet else None)
        deadline = time.monotonic() + startup_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with code {self.process.returncode}")
            try:
                requests.get(f"{self.url}/health", timeout=1.0).raise_for_status()
                return
            except (requests.ConnectionError, requests.HTTPError, requests.Timeout):  # not up yet, building (503), or slow to answer
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"the server did not start within {startup_s} s") from None
                time.sleep(0.2)

    def health(self) -> dict:
        return requests.get(f"{self.url}/health", timeout=10).json()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)


def bench_in_process(source: Source, questions: list[str], args: argparse.Namespace) -> dict[str, float]:
    results = {}
    for label, per_call, budget in (("in-process 1/call", 1, args.queries), ("in-process 16/call", 16, args.queries * 4)):
        results[label] = median_qps(args.runs, lambda: timed(1, per_call, budget, args.max_seconds, questions, lambda _, q: source.search(q, TOPK)))
    return results


def poster(url: str, client: str, workers: int) -> tuple[Callable[[int, list[str]], None], Callable[[], None]]:
    """``post(worker, queries)`` sending one ``/retrieve`` request on that worker's own keep-alive
    connection, and a function closing them. ``requests`` is what Search-R1-style clients use;
    ``urllib3`` is the layer under it, which costs the client about a third of the CPU per request."""
    retrieve = f"{url}/retrieve"

    def check(status: int, payload: dict, queries: list[str]) -> None:
        if status != 200 or len(payload["result"]) != len(queries):
            raise RuntimeError(f"the server answered HTTP {status} with {len(payload.get('result', []))} result lists for {len(queries)} queries")

    if client == "requests":
        sessions = [requests.Session() for _ in range(workers)]

        def post(worker: int, queries: list[str]) -> None:
            reply = sessions[worker].post(retrieve, json={"queries": queries, "topk": TOPK, "return_scores": True}, timeout=60)
            check(reply.status_code, reply.json(), queries)

        return post, lambda: [session.close() for session in sessions]
    pools = [urllib3.connection_from_url(retrieve, maxsize=1, retries=False, timeout=60.0) for _ in range(workers)]

    def post_urllib3(worker: int, queries: list[str]) -> None:
        body = json.dumps({"queries": queries, "topk": TOPK, "return_scores": True}).encode("utf-8")
        reply = pools[worker].urlopen("POST", "/retrieve", body=body, headers={"Content-Type": "application/json"})
        check(reply.status, json.loads(reply.data), queries)

    return post_urllib3, lambda: [pool.close() for pool in pools]


CLIENT_FIGURES = (("1/request", 1, 1, 1), ("16/request", 1, 16, 4), ("8 clients", 8, 1, 2))  # label, clients, queries/request, budget x


def bench_server(urls: dict[str, str], questions: list[str], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The client figures for every server in ``urls`` (name -> base URL), runs alternated between
    servers; then the 16-environment figure for the first one."""
    posters = {name: poster(url, args.client, 8) for name, url in urls.items()}
    results: dict[str, dict[str, float]] = {name: {} for name in urls}
    try:
        for label, clients, per_request, scale in CLIENT_FIGURES:
            measures = {
                name: (lambda post=post, c=clients, n=per_request, b=args.queries * scale: timed(c, n, b, args.max_seconds, questions, post))
                for name, (post, _) in posters.items()
            }
            for name, qps in alternating_median_qps(args.runs, measures).items():
                results[name][label] = qps
    finally:
        for _, close in posters.values():
            close()
    name, url = next(iter(urls.items()))
    remote = RemoteSource(f"{url}/retrieve", name="bench", timeout_s=60)
    try:
        results[name]["16 envs (RemoteSource)"] = median_qps(
            args.runs, lambda: timed(16, 1, args.queries * 2, args.max_seconds, questions, lambda _, q: remote.search(q, TOPK))
        )
    finally:
        remote.close()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.retrieval_throughput", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DATA / "corpus.jsonl", help="jsonl corpus the servers search")
    parser.add_argument("--questions", type=Path, default=DATA / "hotpotqa_dev.jsonl", help="jsonl with a 'question' field")
    parser.add_argument("--retrievers", default="bm25,dense", help="comma-separated: bm25, dense, hybrid")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per figure (median reported)")
    parser.add_argument("--queries", type=int, default=200, help="query budget of a 1-query-per-call run (scaled for the others)")
    parser.add_argument("--max-seconds", type=float, default=20.0, help="wall-time bound of one run")
    parser.add_argument("--index-dir", type=Path, default=Path.home() / ".cache" / "searchqa_gym" / "throughput",
                        help="where indexes are kept between runs")
    parser.add_argument("--startup-seconds", type=float, default=1800.0, help="bound on server start (a first dense start encodes the corpus)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the dense encoder, in the server and in-process")
    parser.add_argument("--client", choices=("requests", "urllib3"), default="requests",
                        help="HTTP client of the 1/request, 16/request and 8-client figures (requests: as Search-R1's clients)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the dense encoder (server and in-process)")
    parser.add_argument("--backend", choices=("auto", "torch", "openvino"), default="auto",
                        help="dense encoder runtime, server and in-process (auto: OpenVINO when installed)")
    parser.add_argument("--skip-in-process", action="store_true", help="only the figures through the server")
    parser.add_argument("--peer", action="store_true",
                        help="also run the Search-R1 stand-in (benchmarks.peers.search_r1_server) beside the dense server, runs alternated")
    parser.add_argument("--output-dir", type=Path, default=None, help="write retrieval_throughput.md, .csv and .json here")
    args = parser.parse_args(argv)

    questions = load_questions(args.questions, 10_000)
    table: dict[str, dict[str, float]] = {}
    for retriever in [r.strip() for r in args.retrievers.split(",") if r.strip()]:
        print(f"[{retriever}] starting the server (index cache: {args.index_dir})", flush=True)
        server_args = ["--corpus", str(args.corpus), "--retriever", retriever, "--index-dir", str(args.index_dir),
                       "--threads", str(args.threads), "--backend", args.backend, "--log-level", "warning"] + (["--compile"] if args.compile else [])
        servers = {retriever: ServerProcess(server_args, args.startup_seconds)}
        try:
            if args.peer and retriever == "dense":  # after ours: its start builds the index the peer reads
                print("[peer] starting the Search-R1 stand-in beside it", flush=True)
                peer_args = ["--index-dir", str(args.index_dir / "dense"), "--corpus", str(args.corpus)]
                servers[PEER] = ServerProcess(peer_args, args.startup_seconds, module="benchmarks.peers.search_r1_server", quiet=True)
            figures = bench_server({name: server.url for name, server in servers.items()}, questions, args)
            health = servers[retriever].health()
            print(f"[{retriever}] server: {health['queries']} queries in {health['source_calls']} source calls "
                  f"({health['inline_calls']} on the event-loop thread)", flush=True)
        finally:
            for server in servers.values():
                server.stop()
        table.update(figures)
        if not args.skip_in_process:
            source = build_source(retriever, corpus=args.corpus, index_dir=args.index_dir, threads=args.threads,
                                  compile_encoder=args.compile, backend=args.backend)
            try:
                table[retriever].update(bench_in_process(source, questions, args))
            finally:
                source.close()
        print(f"[{retriever}] done: " + ", ".join(f"{k} {v:.1f}" for k, v in table[retriever].items()), flush=True)
    rows = table_rows(table)
    print_table(rows, args)
    if args.output_dir is not None:
        beside = f"; {PEER}: its stand-in, runs alternated with ours (dense/peer)" if PEER in table else ""
        body = (f"{_setting_line(args)}. Queries per second, the median of {args.runs} runs; peer then: Search-R1's server "
                f"when the targets were set (dense/then: ours against it){beside}.\n\n{markdown_table(rows)}")
        write_results(args.output_dir, "retrieval_throughput", title="Retrieval throughput: in-process and through the server",
                      command=command_line(parser.prog, argv), body=body, rows=rows,
                      data={"settings": vars(args), "top_k": TOPK, "queries_per_s": table, "table": rows})
    return 0


def table_rows(table: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """One row per figure: our retrievers' queries/s; for the client figures, dense against the peer's
    figures from when the targets were set and, where it ran, against the stand-in measured beside it."""
    ours = [name for name in table if name != PEER]
    rows = []
    for label in dict.fromkeys(label for name in ours for label in table[name]):
        row: dict[str, Any] = {"queries/s": label, **{name: table[name].get(label) for name in ours}}
        dense = table.get("dense", {}).get(label)
        then = PEER_QPS.get(label)
        row["peer then"], row["dense/then"] = (then, dense / then) if then is not None and dense is not None else (None, None)
        if PEER in table:
            now = table[PEER].get(label)
            row[PEER], row["dense/peer"] = (now, dense / now) if now is not None and dense is not None else (None, None)
        row["target"] = f">={TARGET_X[label]:.0f}x" if label in TARGET_X else None
        rows.append(row)
    return rows


def _setting_line(args: argparse.Namespace) -> str:
    return (f"top-k {TOPK}; corpus {args.corpus}; questions {args.questions.name}; encoder backend {args.backend}, torch threads "
            f"{args.threads}{' (compiled)' if args.compile else ''}; client {args.client}, on the same machine as the server: "
            f"{os.cpu_count()} CPU cores")


def print_table(rows: Sequence[dict[str, Any]], args: argparse.Namespace) -> None:
    """The rows of :func:`table_rows`: queries/s to one decimal, ratios as multiples."""
    columns = list(rows[0])[1:] if rows else []
    header = f"{'queries/s (median of %d runs)' % args.runs:<28}" + "".join(f"{c:>13}" for c in columns)
    print()
    print(_setting_line(args))
    print(header)
    print("-" * len(header))
    for row in rows:
        cells = ["" if row[c] is None else row[c] if c == "target" else f"{row[c]:.2f}x" if c in RATIOS else f"{row[c]:.1f}"
                 for c in columns]
        print(f"{row['queries/s']:<28}" + "".join(f"{cell:>13}" for cell in cells))


if __name__ == "__main__":
    sys.exit(main())
