"""Recall of gold passages for BM25, dense and hybrid retrieval on the shared multi-hop QA sets.

It also times the build of the dense index of the shared corpus.

Recall@k of a question is the fraction of its gold passages (``contexts[i].corpus_id`` where
``is_supporting``) among the retrieved ones; the table reports its mean over questions, and "all@k"
the fraction of questions with every gold passage retrieved. Two ways of searching:

- ``single``: one search with the question, top k;
- ``decomposed`` (MuSiQue only): MuSiQue's gold decomposition run node by node, a reference ``#n`` to
  step n replaced by step n's gold answer, each node's top k retrieved and the results united. A
  question with n steps thus sees up to n*k passages, against k for ``single``.

``--retrievers`` picks the systems; only what they need is built (BM25 alone never loads an
encoder). The dense index is cached in ``--index-dir`` (one folder per corpus and encoder) so
repeated runs skip encoding; its build (encoding + indexing) is timed once, on a fresh build, and
set beside the time Search-R1's retrieval server took to build the index of the same corpus on this
machine when the target was set: 800 s (``--peer-build-seconds``), a recorded figure quoted as such,
not measured by this run. Recall is deterministic, so it is measured once; query latencies are
medians of ``--runs`` runs.

Run: ``python -m benchmarks.retrieval_recall`` (``--rebuild`` to time a fresh dense build;
``--retrievers bm25 --limit 20`` for a quick look; ``--output-dir DIR`` writes the recall table as
``retrieval_recall.md``, ``.csv`` and ``.json``, with the build times and latencies, there).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from benchmarks.common.report_files import command_line, markdown_table, write_results
from search_env.console import HelpFormatter

DATASETS = ("hotpotqa_dev", "2wikimultihopqa_dev", "musique_dev")
RETRIEVERS = ("bm25", "dense", "hybrid")
PEER_CORPUS_PASSAGES = 13_778  # the shared corpus.jsonl, on which the peer's build time was recorded
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@dataclass
class Query:
    """One question's searches: the query texts (one, or one per decomposition node) and its gold ids."""

    texts: list[str]
    gold: set[str]


def single_queries(examples: Sequence) -> list[Query]:
    return [Query([ex.question], set(ex.gold_passage_ids)) for ex in examples if ex.gold_passage_ids]


def decomposed_queries(examples: Sequence) -> list[Query]:
    """Each node's query with its parents' gold answers substituted for the ``{X}`` placeholders."""
    queries = []
    for ex in examples:
        if not ex.decomposition or not ex.gold_passage_ids:
            continue
        answers = {node.label: node.answer for node in ex.decomposition}
        texts = []
        for node in ex.decomposition:
            text = node.query
            for parent in node.parents:
                text = text.replace("{" + parent + "}", answers[parent])
            texts.append(text)
        queries.append(Query(texts, set(ex.gold_passage_ids)))
    return queries


def recall(source, queries: list[Query], ks: Sequence[int]) -> dict[str, float]:
    """Mean recall@k and all@k over ``queries``; every query text of every question in one batch."""
    flat = [text for q in queries for text in q.texts]
    results = source.search(flat, max(ks))
    row: dict[str, float] = {}
    for k in ks:
        fractions, complete, position = [], 0, 0
        for q in queries:
            found = {p.id for result in results[position : position + len(q.texts)] for p in result[:k]}
            position += len(q.texts)
            hits = len(q.gold & found)
            fractions.append(hits / len(q.gold))
            complete += hits == len(q.gold)
        row[f"R@{k}"] = statistics.fmean(fractions)
        row[f"all@{k}"] = complete / len(queries)
    return row


def median_latency_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def parse_retrievers(text: str) -> list[str]:
    """``bm25,dense`` -> the names, in the order given; an unknown name is a clear error."""
    names = list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in RETRIEVERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(RETRIEVERS)}, got {text!r}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.retrieval_recall", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="folder with corpus.jsonl and the QA sets")
    parser.add_argument("--retrievers", type=parse_retrievers, default=",".join(RETRIEVERS),
                        help=f"comma-separated subset of {','.join(RETRIEVERS)} (hybrid needs both others built)")
    parser.add_argument("--index-dir", type=Path, default=Path("~/.cache/searchqa_gym"), help="where the dense index is kept between runs")
    parser.add_argument("--rebuild", action="store_true", help="re-encode the corpus even when the cache holds its index (to time the build)")
    parser.add_argument("--encoder", default=None, help="dense encoder folder or name (unset: the offline all-MiniLM-L6-v2)")
    parser.add_argument("--index", choices=("flat", "hnsw", "ivf"), default="flat", help="faiss index type")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto", help="dense encoder precision")
    parser.add_argument("--batch-size", type=int, default=None, help="encoder batch size (unset: the encoder's)")
    parser.add_argument("--backend", choices=("auto", "torch", "openvino"), default="auto",
                        help="encoder runtime (auto: OpenVINO on a CPU when installed, else torch)")
    parser.add_argument("--workers", type=int, default=None,
                        help="torch: batches encoded at once; OpenVINO: threads per inference (unset: one per available core)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker")
    parser.add_argument("--ks", default="1,5,10", help="comma-separated cut-offs")
    parser.add_argument("--limit", type=int, default=None, help="first N questions of each set (unset: all)")
    parser.add_argument("--runs", type=int, default=5, help="runs per latency figure (the median is reported)")
    parser.add_argument("--peer-build-seconds", type=float, default=800.0,
                        help="Search-R1 retrieval server's index build time for the same corpus, as recorded on this machine (quoted, not measured)")
    parser.add_argument("--output-dir", type=Path, default=None, help="write retrieval_recall.md, .csv and .json here")
    args = parser.parse_args(argv)
    ks = sorted({int(k) for k in args.ks.split(",")})
    wanted = set(args.retrievers)
    need_dense = bool(wanted & {"dense", "hybrid"})
    need_bm25 = bool(wanted & {"bm25", "hybrid"})

    from search_env.data.corpus import load_corpus
    from search_env.data.loaders import load_flashrag_jsonl
    from search_env.sources.bm25 import BM25Source

    corpus_path = args.data_dir / "corpus.jsonl"
    rows = load_corpus(corpus_path)
    built: dict = {}
    lines = []
    if need_bm25:
        start = time.perf_counter()
        built["bm25"] = BM25Source(rows, name="bm25")
        lines.append(f"BM25 index build: {time.perf_counter() - start:.1f} s (one run)")
    encoder = None
    if need_dense:
        import torch

        from search_env.sources.dense import DenseSource
        from search_env.sources.encoders import TransformersEncoder

        torch.set_num_threads(args.threads)
        encoder = TransformersEncoder(args.encoder, precision=args.precision, batch_size=args.batch_size, workers=args.workers,
                                      backend=args.backend)
        key = hashlib.sha256(encoder.signature.encode()).hexdigest()[:10]
        index_dir = args.index_dir.expanduser() / "dense" / f"{corpus_path.stem}-{encoder.model_name}-{key}"
        start = time.perf_counter()
        dense = built["dense"] = DenseSource(rows, encoder, index=args.index, index_dir=index_dir, rebuild=args.rebuild, name="dense")
        dense_seconds = time.perf_counter() - start
        lines.append(f"encoder: {encoder!r}; torch threads {torch.get_num_threads()}")
        lines.append(dense_build_line(dense, index_dir, dense_seconds, args))
    if "hybrid" in wanted:
        from search_env.sources.hybrid import HybridSource

        built["hybrid"] = HybridSource([built["bm25"], built["dense"]], name="hybrid")
    systems = {name: built[name] for name in args.retrievers}

    print(f"corpus: {corpus_path} ({len(rows)} passages); retrievers: {', '.join(systems)}")
    for line in lines:
        print(line)

    header = f"{'dataset':<22}{'mode':<12}{'system':<8}{'n':>5}" + "".join(f"{'R@%d' % k:>8}" for k in ks) + f"{'all@%d' % ks[-1]:>8}"
    print("\n" + header + "\n" + "-" * len(header))
    table: list[dict[str, Any]] = []
    for dataset in DATASETS:
        examples = load_flashrag_jsonl(args.data_dir / f"{dataset}.jsonl", limit=args.limit)
        modes = {"single": single_queries(examples)}
        if any(ex.decomposition for ex in examples):
            modes["decomposed"] = decomposed_queries(examples)
        for mode, queries in modes.items():
            if not queries:
                continue
            for system_name, source in systems.items():
                row = recall(source, queries, ks)
                table.append({"dataset": dataset, "mode": mode, "system": system_name, "n": len(queries), **row})
                print(f"{dataset:<22}{mode:<12}{system_name:<8}{len(queries):>5}"
                      + "".join(f"{row[f'R@{k}']:>8.3f}" for k in ks) + f"{row[f'all@{ks[-1]}']:>8.3f}")

    question = "Who is the spouse of the Green performer?"
    batch = [question] * 64
    latency_ms = {}
    if encoder is not None:
        latency_ms["encode 1 query"] = median_latency_ms(lambda: encoder.encode_queries([question]), args.runs)
        latency_ms["encode 64 queries"] = median_latency_ms(lambda: encoder.encode_queries(batch), args.runs)
    for name, s in systems.items():
        latency_ms[f"{name} search 1 query top-10"] = median_latency_ms(lambda s=s: s.search([question], 10), args.runs)
    latencies = f"latency, median of {args.runs} runs (ms): " + "; ".join(f"{label} {ms:.1f}" for label, ms in latency_ms.items())
    print("\n" + latencies)
    for source in {id(s): s for s in built.values()}.values():
        source.close()
    if args.output_dir is not None:
        body = "\n".join([f"Corpus {corpus_path} ({len(rows)} passages); recall@k: the mean over questions of the fraction of "
                           "their gold passages retrieved; all@k: the fraction of questions with all of them.", "",
                           *(f"- {line}" for line in lines), "", markdown_table(table), "", f"{latencies}."])
        write_results(args.output_dir, "retrieval_recall", title="Recall of gold passages", command=command_line(parser.prog, argv),
                      body=body, rows=table, data={"settings": vars(args), "passages": len(rows), "builds": lines,
                                                   "recall": table, "latency_ms": latency_ms})
    return 0


def dense_build_line(dense, index_dir: Path, seconds: float, args: argparse.Namespace) -> str:  # type: ignore[no-untyped-def]
    """What the dense index cost: loaded from the cache (with what its build took then), or built now;
    set beside the peer's recorded build time, which this run does not measure and which holds only
    for the shared corpus."""
    if dense.stats.reused_embeddings:
        manifest = json.loads((index_dir / "manifest.json").read_text())
        build = manifest["encode_seconds"] + manifest["index_seconds"]
        told = (f"dense index loaded from {index_dir} in {seconds:.1f} s (no encoding); its build took "
                f"{manifest['encode_seconds']:.1f} s encoding + {manifest['index_seconds']:.1f} s indexing when it was made "
                f"(--rebuild times a build now)")
    else:
        build = dense.stats.encode_seconds + dense.stats.index_seconds
        told = (f"dense index build ({args.index}), one run: {build:.1f} s = {dense.stats.encode_seconds:.1f} s encoding "
                f"({len(dense.passages) / dense.stats.encode_seconds:.0f} passages/s) + {dense.stats.index_seconds:.2f} s "
                f"indexing, {seconds:.1f} s including saving to {index_dir}")
    if len(dense.passages) != PEER_CORPUS_PASSAGES:
        return told + f"; the quoted peer build time is for the {PEER_CORPUS_PASSAGES}-passage shared corpus, so no ratio here"
    return (told + f"; {args.peer_build_seconds / build:.1f}x less than Search-R1's server, which took "
            f"{args.peer_build_seconds:.0f} s on this corpus and machine (a recorded figure, quoted, not measured in this "
            f"run; target >= 5x)")


if __name__ == "__main__":
    sys.exit(main())
