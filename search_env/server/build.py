"""Building the Source that a server serves: which passages (a corpus file or the synthetic world),
which retriever (BM25, dense, or their hybrid), and an index folder that makes restarts fast.

An index folder remembers what it was built from (:data:`STAMP_FILE`); an index built from another
corpus is rebuilt rather than served, because a stale index answers with the wrong passages silently.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Literal

from search_env.files import write_atomically
from search_env.sources.base import Passage, Source

__all__ = ["RETRIEVERS", "STAMP_FILE", "build_source", "corpus_identity", "synthetic_passages"]

log = logging.getLogger(__name__)

Retriever = Literal["bm25", "dense", "hybrid"]
RETRIEVERS: tuple[str, ...] = ("bm25", "dense", "hybrid")
STAMP_FILE = "built_from.json"


def synthetic_passages(*, seed: int = 0, difficulty: int = 1, source: str | None = None) -> list[dict[str, str]]:
    """Passages of the built-in world: all sources together, or the one named ``source``."""
    from search_env.synthetic import generate_world

    world = generate_world(seed=seed, n_questions=0, difficulty=difficulty)
    if source is None:
        return world.passages()
    if source not in world.sources:
        raise ValueError(f"the synthetic world has no source {source!r}; it has {sorted(world.sources)}")
    return world.sources[source]


def corpus_identity(corpus: str | Path) -> dict[str, Any]:
    """What identifies a corpus file for index reuse: its absolute path, size and modification time."""
    path = Path(corpus).resolve()
    stat = path.stat()
    return {"corpus": str(path), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def build_source(
    retriever: Retriever,
    *,
    corpus: str | Path | None = None,
    passages: list[dict[str, str]] | None = None,
    identity: dict[str, Any] | None = None,
    index_dir: str | Path | None = None,
    name: str = "wiki",
    encoder: str | None = None,
    rebuild: bool = False,
    threads: int = 1,
    compile_encoder: bool = False,
    backend: str = "auto",
) -> Source:
    """The Source for ``retriever`` over a corpus file or a list of ``{id, title, text}`` passages.

    Args:
        retriever: "bm25", "dense" (faiss flat index over ``encoder`` embeddings) or "hybrid"
            (reciprocal-rank fusion of the two, each index cached as for its own retriever).
        corpus, passages: exactly one of them.
        identity: what the passages are, for index reuse (default: :func:`corpus_identity` of
            ``corpus``; passages without an identity are never reused from disk).
        index_dir: where indexes are saved (one subfolder per retriever) and loaded from on the
            next start.
        name: the source name reported by ``/health`` and used by clients.
        encoder: model folder or name for dense retrieval; None means the offline default MiniLM.
        rebuild: re-index even when ``index_dir`` holds a matching index (a dense index built
            from another corpus or encoder is an error unless this is set: re-encoding is costly).
        threads: torch threads for query encoding. One is the safe default on a shared machine,
            where more threads than free cores slows encoding down several-fold.
        compile_encoder: ``torch.compile`` the dense encoder at start (slower start, faster
            queries; see :class:`~search_env.sources.encoders.TransformersEncoder`).
        backend: the dense encoder's runtime: "auto" (OpenVINO on a CPU when installed, else
            torch), "torch" or "openvino".
    """
    if (corpus is None) == (passages is None):
        raise ValueError("build_source needs exactly one of corpus= and passages=")
    if retriever not in RETRIEVERS:
        raise ValueError(f"unknown retriever {retriever!r}; use one of {', '.join(RETRIEVERS)}")
    if identity is None and corpus is not None:
        identity = corpus_identity(corpus)
    data = str(corpus) if corpus is not None else passages
    folder = Path(index_dir) if index_dir is not None else None

    def bm25() -> Source:
        from search_env.sources.bm25 import BM25Source

        return _cached(
            folder, "bm25", identity, rebuild, lambda: BM25Source(data, name=name), lambda d: BM25Source.load(d, name=name)
        )

    def dense() -> Source:
        from search_env.sources.dense import DenseSource
        from search_env.sources.encoders import TransformersEncoder

        corpus_or_passages = str(corpus) if corpus is not None else [Passage(p["id"], p["title"], p["text"]) for p in passages or []]
        return DenseSource(
            corpus_or_passages, TransformersEncoder(encoder, num_threads=threads, compile_model=compile_encoder, backend=backend), index="flat",
            index_dir=folder / "dense" if folder is not None else None, rebuild=rebuild, name=name,
        )

    if retriever == "bm25":
        return bm25()
    if retriever == "dense":
        return dense()
    from search_env.sources.hybrid import HybridSource

    return HybridSource([bm25(), dense()], name=name)


def _cached(
    folder: Path | None,
    sub: str,
    identity: dict[str, Any] | None,
    rebuild: bool,
    build: Callable[[], Source],
    load: Callable[[Path], Source],
) -> Source:
    """Load the index in ``folder/sub`` if it was built from ``identity`` (and no ``rebuild`` is asked);
    else build it and save it there."""
    if folder is None:
        return build()
    directory = folder / sub
    stamp = directory / STAMP_FILE
    if not rebuild and identity is not None and stamp.is_file() and json.loads(stamp.read_text(encoding="utf-8")) == identity:
        log.info("loading the %s index from %s", sub, directory)
        return load(directory)
    if stamp.is_file() and not rebuild:
        log.warning("%s was built from another corpus; rebuilding it", directory)
    source = build()
    directory.mkdir(parents=True, exist_ok=True)
    source.save(directory)  # type: ignore[attr-defined]  (the sources cached this way can save)
    if identity is not None:
        write_atomically(stamp, json.dumps(identity, indent=2))  # whole or absent: a torn stamp would fail the next load
    log.info("saved the %s index to %s", sub, directory)
    return source
