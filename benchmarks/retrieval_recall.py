"""Recall of gold passages for BM25, dense and hybrid retrieval on the shared multi-hop QA sets, and
the time to build the dense index of the shared corpus.

Recall@k of a question is the fraction of its gold passages (``contexts[i].corpus_id`` where
``is_supporting``) among the retrieved ones; the table reports its mean over questions, and "all@k"
the fraction of questions with every gold passage retrieved. Two ways of searching:

- ``single``: one search with the question, top k;
- ``decomposed`` (MuSiQue only): MuSiQue's gold decomposition run node by node, a reference ``#n`` to
  step n replaced by step n's gold answer, each node's top k retrieved and the results united. A
  question with n steps thus sees up to n*k passages, against k for ``single``.

The dense index is cached in ``--cache-dir`` (one folder per corpus and encoder) so repeated runs
skip encoding; its build (encoding + indexing) is timed once, on a fresh build, and compared with
Search-R1's retrieval server, which took 800 s to build the index of the same corpus on this machine
(``--peer-build-seconds``). Recall is deterministic, so it is measured once; query latencies are
medians of ``--runs`` runs.

Run: ``python -m benchmarks.retrieval_recall`` (``--rebuild`` to time a fresh dense build).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

DATASETS = ("hotpotqa_dev", "2wikimultihopqa_dev", "musique_dev")
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="folder with corpus.jsonl and the QA sets")
    parser.add_argument("--cache-dir", type=Path, default=Path("~/.cache/searchqa_gym"), help="where the dense index is kept between runs")
    parser.add_argument("--rebuild", action="store_true", help="re-encode the corpus even when the cache holds its index (to time the build)")
    parser.add_argument("--encoder", default=None, help="dense encoder folder or name (default: the offline all-MiniLM-L6-v2)")
    parser.add_argument("--index", choices=("flat", "hnsw", "ivf"), default="flat", help="faiss index type")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto")
    parser.add_argument("--batch-size", type=int, default=None, help="encoder batch size (default: the encoder's)")
    parser.add_argument("--backend", choices=("auto", "torch", "openvino"), default="auto",
                        help="encoder runtime (default auto: OpenVINO on a CPU when installed, else torch)")
    parser.add_argument("--workers", type=int, default=None,
                        help="torch: batches encoded at once; OpenVINO: threads per inference (default: one per available core)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker")
    parser.add_argument("--ks", default="1,5,10", help="comma-separated cut-offs")
    parser.add_argument("--limit", type=int, default=None, help="first N questions of each set")
    parser.add_argument("--runs", type=int, default=5, help="runs per latency figure (the median is reported)")
    parser.add_argument("--peer-build-seconds", type=float, default=800.0, help="Search-R1 retrieval server index build time for the same corpus")
    args = parser.parse_args(argv)
    ks = sorted({int(k) for k in args.ks.split(",")})

    import torch

    from search_env.data.loaders import load_flashrag_jsonl
    from search_env.sources.bm25 import BM25Source
    from search_env.sources.dense import DenseSource, as_passages
    from search_env.sources.encoders import TransformersEncoder
    from search_env.sources.hybrid import HybridSource

    torch.set_num_threads(args.threads)
    corpus_path = args.data_dir / "corpus.jsonl"
    passages = as_passages(corpus_path)

    start = time.perf_counter()
    bm25 = BM25Source(corpus_path, name="bm25")
    bm25_seconds = time.perf_counter() - start

    encoder = TransformersEncoder(args.encoder, precision=args.precision, batch_size=args.batch_size, workers=args.workers,
                                  backend=args.backend)
    key = hashlib.sha256(encoder.signature.encode()).hexdigest()[:10]
    index_dir = args.cache_dir.expanduser() / "dense" / f"{corpus_path.stem}-{encoder.model_name}-{key}"
    start = time.perf_counter()
    dense = DenseSource(passages, encoder, index=args.index, index_dir=index_dir, rebuild=args.rebuild, name="dense")
    dense_seconds = time.perf_counter() - start
    hybrid = HybridSource([bm25, dense], name="hybrid")
    systems = {"bm25": bm25, "dense": dense, "hybrid": hybrid}

    print(f"corpus: {corpus_path} ({len(passages)} passages); encoder: {encoder!r}; torch threads {torch.get_num_threads()}")
    print(f"BM25 index build: {bm25_seconds:.1f} s (one run)")
    if dense.stats.reused_embeddings:
        manifest = json.loads((index_dir / "manifest.json").read_text())
        print(f"dense index loaded from {index_dir} in {dense_seconds:.1f} s (no encoding); its build took "
              f"{manifest['encode_seconds']:.1f} s encoding + {manifest['index_seconds']:.1f} s indexing when it "
              f"was made (run with --rebuild to time a build now)")
    else:
        build = dense.stats.encode_seconds + dense.stats.index_seconds
        print(f"dense index build ({args.index}), one run: {build:.1f} s = {dense.stats.encode_seconds:.1f} s encoding "
              f"({len(passages) / dense.stats.encode_seconds:.0f} passages/s) + {dense.stats.index_seconds:.2f} s "
              f"indexing; Search-R1 peer {args.peer_build_seconds:.0f} s -> {args.peer_build_seconds / build:.1f}x "
              f"faster (target >= 5x); {dense_seconds:.1f} s including saving to {index_dir}")

    header = f"{'dataset':<22}{'mode':<12}{'system':<8}{'n':>5}" + "".join(f"{'R@%d' % k:>8}" for k in ks) + f"{'all@%d' % ks[-1]:>8}"
    print("\n" + header + "\n" + "-" * len(header))
    for dataset in DATASETS:
        examples = load_flashrag_jsonl(args.data_dir / f"{dataset}.jsonl", limit=args.limit)
        modes = {"single": single_queries(examples)}
        if any(ex.decomposition for ex in examples):
            modes["decomposed"] = decomposed_queries(examples)
        for mode, queries in modes.items():
            for system_name, source in systems.items():
                row = recall(source, queries, ks)
                print(f"{dataset:<22}{mode:<12}{system_name:<8}{len(queries):>5}"
                      + "".join(f"{row[f'R@{k}']:>8.3f}" for k in ks) + f"{row[f'all@{ks[-1]}']:>8.3f}")

    question = "Who is the spouse of the Green performer?"
    batch = [question] * 64
    print(f"\nlatency, median of {args.runs} runs (ms): "
          f"encode 1 query {median_latency_ms(lambda: encoder.encode_queries([question]), args.runs):.1f}; "
          f"encode 64 queries {median_latency_ms(lambda: encoder.encode_queries(batch), args.runs):.1f}; "
          + "; ".join(f"{name} search 1 query top-10 {median_latency_ms(lambda s=s: s.search([question], 10), args.runs):.1f}"
                      for name, s in systems.items()))
    hybrid.close()


if __name__ == "__main__":
    main()
