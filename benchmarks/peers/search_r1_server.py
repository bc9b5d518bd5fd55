"""A stand-in for Search-R1's dense retrieval server (``search_r1/search/retrieval_server.py``), run
on the CPU beside ours so that throughput is compared side by side on the same machine at the same
moment. This shared machine's speed drifts by tens of percent within minutes, so a ratio taken
from two runs at different times says little.

It is written here from the reference's behaviour, not copied, and reproduces what costs the
reference time per request:

- FastAPI with a synchronous endpoint, which FastAPI runs on its thread pool, so concurrent
  requests encode side by side with no batching across requests;
- the encoder in float32 with torch's default thread count: the reference's ``model.cuda()`` has to
  go to run on a CPU, and its ``model.half()`` on a CPU without native float16 is far slower than
  float32, so float32 is the fast choice a CPU user would make;
- every request's queries tokenised together, padded to the longest, truncated at 256 tokens;
  mean pooling with ``masked_fill``, L2 normalisation, then a faiss search of the whole batch;
- a tqdm bar per request (the reference wraps its batch loop in one) and documents looked up by row.

Where it departs, it departs in the peer's favour: documents come from a Python list instead of a
``datasets`` table (the reference reads each hit through ``datasets``' row access), and the index
is our flat inner-product index over the same corpus (a flat search costs the same whatever
encoded the vectors).

Run: ``python -m benchmarks.peers.search_r1_server --index-dir DIR --corpus corpus.jsonl --port N``
where DIR holds a dense index built by :class:`search_env.sources.dense.DenseSource`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import faiss
import numpy as np
import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import AutoModel, AutoTokenizer

from search_env.console import HelpFormatter, progress
from search_env.sources.encoders import default_model_path

MAX_LENGTH = 256  # the reference's retrieval_query_max_length
BATCH_SIZE = 512  # the reference's retrieval_batch_size


class QueryRequest(BaseModel):
    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


class PeerRetriever:
    """Encode with mean pooling in float32, search a flat index, look documents up by row."""

    def __init__(self, model_dir: Path, index_path: Path, corpus_path: Path) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir).eval()
        self.index = faiss.read_index(str(index_path))
        with corpus_path.open(encoding="utf-8") as handle:
            self.documents = [_document(json.loads(line)) for line in handle if line.strip()]

    @torch.no_grad()
    def encode(self, queries: list[str]) -> np.ndarray:
        inputs = self.tokenizer(queries, max_length=MAX_LENGTH, padding=True, truncation=True, return_tensors="pt")
        hidden = self.model(**inputs, return_dict=True).last_hidden_state
        mask = inputs["attention_mask"]
        pooled = hidden.masked_fill(~mask[..., None].bool(), 0.0).sum(dim=1) / mask.sum(dim=1)[..., None]
        return torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy().astype(np.float32, order="C")

    def batch_search(self, queries: list[str], k: int) -> tuple[list[list[dict]], list[list[float]]]:
        results, scores = [], []
        # show=True: the reference draws this bar on every request whatever stderr is, and its cost
        # is part of what the stand-in reproduces (the benchmark sends its stderr to /dev/null)
        for start in progress(range(0, len(queries), BATCH_SIZE), desc="Retrieval process: ", show=True):
            batch_scores, batch_rows = self.index.search(self.encode(queries[start : start + BATCH_SIZE]), k=k)
            for row_scores, rows in zip(batch_scores.tolist(), batch_rows.tolist()):
                results.append([self.documents[row] for row in rows])
                scores.append(row_scores)
        return results, scores


def _document(row: dict) -> dict:
    contents = row["contents"] if "contents" in row else f'"{row.get("title", "")}"\n{row["text"]}'
    return {"id": str(row["id"]), "contents": contents}


def create_app(retriever: PeerRetriever, default_topk: int = 3) -> FastAPI:
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(request: QueryRequest) -> dict:  # synchronous, as in the reference
        topk = request.topk or default_topk
        results, scores = retriever.batch_search(request.queries, topk)
        if request.return_scores:
            return {"result": [[{"document": d, "score": s} for d, s in zip(docs, row)] for docs, row in zip(results, scores)]}
        return {"result": results}

    @app.get("/health")  # not in the reference: the benchmark polls it to know the server is up
    def health() -> dict:
        return {"status": "ok"}

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers.search_r1_server", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--index-dir", type=Path, required=True, help="folder of a DenseSource index (index.faiss)")
    parser.add_argument("--corpus", type=Path, required=True, help="the jsonl corpus the index was built from")
    parser.add_argument("--model", type=Path, default=None, help="encoder folder (unset: the offline MiniLM)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind")
    parser.add_argument("--port", type=int, default=8001, help="TCP port")
    parser.add_argument("--topk", type=int, default=3, help="passages per query when a request gives no topk")
    args = parser.parse_args(argv)
    retriever = PeerRetriever(args.model or default_model_path(), args.index_dir / "index.faiss", args.corpus)
    uvicorn.run(create_app(retriever, args.topk), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
