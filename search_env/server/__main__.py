"""``python -m search_env.server``: serve a corpus (or the synthetic world) over the Search-R1 API.

Examples::

    python -m search_env.server --corpus corpus.jsonl --retriever bm25 --port 8000
    python -m search_env.server --corpus corpus.jsonl --retriever dense --index-dir ~/.cache/searchqa_gym/corpus
    python -m search_env.server --synthetic --synthetic-source news --port 8001
    python -m search_env.server --import my_module --corpus corpus.jsonl --retriever mine

Binds 127.0.0.1 unless ``--host`` says otherwise: the API has no authentication.

The server listens at once and builds (or loads) its index on a background thread: until the index is
ready ``GET /health`` answers HTTP 503 ``{"status": "building", ...}`` and ``POST /retrieve`` answers 503
(see :mod:`search_env.server.readiness`). If the build fails, the server stops with status 1.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# Before torch is imported (build_source imports it lazily): OpenMP workers that spin after each
# encode would starve the event loop thread that reads the next requests (benchmarks/RESULTS.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from rewards.name_registry import UnknownNameError
from search_env.console import HelpFormatter
from search_env.server.app import ServerLimits
from search_env.server.build import build_source, retrievers, synthetic_passages
from search_env.server.readiness import SourceBuild, SourceBuildFailed
from search_env.server.runner import LOOPBACK, serve
from search_env.sources.base import Source
from search_env.sources.encoders import available_cores


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m search_env.server",
        description="Serve a Source over the retrieval API of Search-R1 / FlashRAG (POST /retrieve, GET /health).",
        formatter_class=HelpFormatter,
    )
    data = parser.add_argument_group("passages (one of)")
    data.add_argument("--corpus", help="JSON-lines corpus: {id, title, text} or wiki-18 {id, contents} rows")
    data.add_argument("--synthetic", action="store_true", help="serve the built-in synthetic world")
    data.add_argument("--synthetic-source", help="serve only this source of the synthetic world (wiki, news, papers)")
    data.add_argument("--seed", type=int, default=0, help="synthetic world seed")
    data.add_argument("--difficulty", type=int, default=1, help="synthetic world difficulty")

    retrieval = parser.add_argument_group("retrieval")
    retrieval.add_argument("--retriever", default="bm25",
                           help=f"how passages are found: {', '.join(retrievers())}, or one --import registers")
    retrieval.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                           help="import MODULE first (the retrievers it registers with search_env.sources.register_source "
                                "can then be named)")
    retrieval.add_argument("--index-dir", help="save indexes here and reuse them on the next start")
    retrieval.add_argument("--encoder", help="dense encoder model folder or name (unset: the offline MiniLM)")
    retrieval.add_argument("--rebuild", action="store_true", help="re-index even if --index-dir holds an index")
    retrieval.add_argument("--threads", type=int, default=1,
                           help="torch threads for query encoding (more pays off only for large batches on idle cores)")
    retrieval.add_argument("--backend", choices=("auto", "torch", "openvino"), default="auto",
                           help="dense encoder runtime (auto: OpenVINO on a CPU when installed, else torch)")
    retrieval.add_argument("--compile", action="store_true", help="torch.compile the dense encoder at start (torch backend; 10-50 s on 2 CPU cores)")
    retrieval.add_argument("--name", default=None, help="source name reported by /health (unset: wiki, or the synthetic source)")
    retrieval.add_argument("--topk", type=int, default=3, help="passages per query when a request gives no topk")

    server = parser.add_argument_group("server")
    server.add_argument("--host", default=LOOPBACK, help="interface to bind (the API has no authentication)")
    server.add_argument("--port", type=int, default=8000, help="TCP port")
    server.add_argument("--max-batch", type=int, default=128, help="queries gathered into one search call")
    server.add_argument("--max-wait-ms", type=float, default=2.0, help="how long a batch may wait for requests already being read, in ms")
    server.add_argument("--concurrency", type=int, default=None,
                        help="search calls that may run at once, one per worker thread (unset: one per available core)")
    defaults = ServerLimits()
    server.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes, help="largest request body accepted")
    server.add_argument("--max-queries", type=int, default=defaults.max_queries, help="queries per request")
    server.add_argument("--max-query-chars", type=int, default=defaults.max_query_chars, help="longest query accepted")
    server.add_argument("--max-topk", type=int, default=defaults.max_topk, help="largest topk a request may ask")
    server.add_argument("--body-timeout-s", type=float, default=defaults.body_timeout_s,
                        help="seconds a request body may take to arrive in full; later: 408 and the connection closed")
    server.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"], help="server log level")

    args = parser.parse_args(argv)
    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            parser.error(f"--import {module}: {' '.join(str(exc).split())}")
    if args.retriever not in retrievers():
        parser.error(f"--retriever: {UnknownNameError('retriever', args.retriever, retrievers())}")
    if bool(args.corpus) == bool(args.synthetic):
        parser.error("give exactly one of --corpus PATH and --synthetic")
    if args.concurrency is not None and args.concurrency < 1:
        parser.error(f"--concurrency must be at least 1, got {args.concurrency}")
    if args.synthetic_source and not args.synthetic:
        parser.error("--synthetic-source needs --synthetic")
    if not 0 < args.body_timeout_s < float("inf"):
        parser.error(f"--body-timeout-s must be a positive number of seconds, got {args.body_timeout_s}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    handler = logging.StreamHandler()
    handler.setLevel(args.log_level.upper())  # on the handler too: some libraries set DEBUG on their own loggers
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(message)s", handlers=[handler])
    if args.synthetic:
        name = args.name or args.synthetic_source or "synthetic"
        identity = {"synthetic": {"seed": args.seed, "difficulty": args.difficulty, "source": args.synthetic_source}}

        def build() -> Source:
            passages = synthetic_passages(seed=args.seed, difficulty=args.difficulty, source=args.synthetic_source)
            return build_source(
                args.retriever, passages=passages, identity=identity, index_dir=args.index_dir, name=name,
                encoder=args.encoder, rebuild=args.rebuild, threads=args.threads, compile_encoder=args.compile,
                backend=args.backend,
            )
    else:
        name = args.name or "wiki"

        def build() -> Source:
            return build_source(
                args.retriever, corpus=args.corpus, index_dir=args.index_dir, name=name, encoder=args.encoder,
                rebuild=args.rebuild, threads=args.threads, compile_encoder=args.compile, backend=args.backend,
            )
    if args.host not in (LOOPBACK, "localhost", "::1"):
        logging.warning("binding %s: anyone who can reach this address can query the server", args.host)
    limits = ServerLimits(args.max_body_bytes, args.max_queries, args.max_query_chars, args.max_topk, args.body_timeout_s)
    source = SourceBuild(build, name=name)
    try:
        serve(
            source, host=args.host, port=args.port, log_level=args.log_level, default_topk=args.topk,
            limits=limits, max_batch=args.max_batch, max_wait_s=args.max_wait_ms / 1000,
            concurrency=args.concurrency or available_cores(),
        )
    except SourceBuildFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        source.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
