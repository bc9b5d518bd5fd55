"""Building the Source that a server serves: which passages (a corpus file or the synthetic world),
which retriever (BM25, dense, their hybrid, or one a module registered with
:func:`search_env.sources.register_source`), and an index folder that makes restarts fast.

An index folder remembers what it was built from (:data:`STAMP_FILE`); an index built from another
corpus is rebuilt rather than served, because a stale index answers with the wrong passages silently.
"""
from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from rewards.name_registry import UnknownNameError
from search_env.files import write_atomically
from search_env.sources.base import Passage, Source
from search_env.sources.registry import SOURCES, SourceOptions

__all__ = ["HYBRID", "RETRIEVERS", "STAMP_FILE", "build_source", "corpus_identity", "retrievers", "synthetic_passages"]

log = logging.getLogger(__name__)

#: The server's own retriever: reciprocal-rank fusion of ``bm25`` and ``dense``.
HYBRID = "hybrid"
#: The built-in retrievers (:func:`retrievers` adds those registered since, e.g. by ``--import``).
RETRIEVERS: tuple[str, ...] = ("bm25", "dense", HYBRID)
STAMP_FILE = "built_from.json"


def retrievers() -> list[str]:
    """Every retriever the server can build: the registered ones and :data:`HYBRID`, sorted."""
    return sorted({*SOURCES.names(), HYBRID})


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
    retriever: str,
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
        retriever: "bm25", "dense" (faiss flat index over ``encoder`` embeddings), "hybrid"
            (reciprocal-rank fusion of the two, each index cached as for its own retriever) or another
            registered retriever (its index folder ``index_dir/<retriever>``).
        corpus, passages: exactly one of them.
        identity: what the passages are, for index reuse (default: :func:`corpus_identity` of
            ``corpus``; passages without an identity are never reused from disk).
        index_dir: where indexes are saved (one subfolder per retriever) and loaded from on the
            next start (BM25's here, by a stamp of what it was built from; the others by the retriever).
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
    if retriever != HYBRID and not SOURCES.has(retriever):
        raise UnknownNameError("retriever", retriever, retrievers())
    if identity is None and corpus is not None:
        identity = corpus_identity(corpus)
    data = str(corpus) if corpus is not None else passages
    folder = Path(index_dir) if index_dir is not None else None
    options = SourceOptions(name=name, rebuild=rebuild, encoder=encoder, encoder_threads=threads,
                            compile_encoder=compile_encoder, encoder_backend=backend, dense_index="flat")

    def built(kind: str) -> Source:
        if kind == "bm25":  # BM25 saves and loads its index here, checked against the corpus it was built from
            from search_env.sources.bm25 import BM25Source

            return _cached(
                folder, "bm25", identity, rebuild, lambda: BM25Source(data, name=name), lambda d: BM25Source.load(d, name=name)
            )
        corpus_or_passages = str(corpus) if corpus is not None else [Passage(p["id"], p["title"], p["text"]) for p in passages or []]
        return SOURCES.lookup(kind)(corpus_or_passages, replace(options, index_dir=folder / kind if folder is not None else None))

    if retriever != HYBRID:
        return built(retriever)
    from search_env.sources.hybrid import HybridSource

    return HybridSource([built("bm25"), built("dense")], name=name)


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
