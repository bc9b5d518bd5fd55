"""Dense retrieval: passages encoded by a :class:`~search_env.sources.encoders.TextEncoder` and
searched with faiss by inner product on unit vectors (= cosine similarity).

Encoding a corpus is expensive, so a :class:`DenseSource` given an ``index_dir`` writes the
embeddings, the faiss index and a manifest there, and later loads them instead of re-encoding. The
manifest records which encoder and which corpus the embeddings belong to; a mismatch is an error
(not a silent re-encode, which could cost hours on a large corpus) unless ``rebuild=True``. Asking
for another index type over the same embeddings rebuilds only the index.

Index types: ``flat`` (exact), ``hnsw`` (graph, fast approximate, CPU only), ``ivf`` (clustered,
approximate; needs training on the embeddings). With faiss-gpu installed and a GPU visible, flat
and IVF indexes are searched on the GPU; the copy on disk is always the CPU form.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

import numpy as np

from search_env.console import progress_enabled
from search_env.data.corpus import load_corpus, passage_from_row
from search_env.files import write_atomically
from search_env._optional import requires_extra
from search_env.progress_lines import progress_meter

from .base import Passage, Source
from .encoders import TextEncoder

logger = logging.getLogger(__name__)

IndexKind = Literal["flat", "hnsw", "ivf"]
MANIFEST = "manifest.json"
EMBEDDINGS = "embeddings.npy"
INDEX_FILE = "index.faiss"
FORMAT_VERSION = 1
_ADD_CHUNK = 65_536  # vectors added to an index per step, so a long build shows progress


@dataclass(frozen=True)
class IndexConfig:
    """Which faiss index to build and how to search it.

    Attributes:
        kind: "flat", "hnsw" or "ivf".
        hnsw_m: graph degree of HNSW (memory/recall trade-off).
        hnsw_ef_construction: HNSW build-time beam width (higher: better graph, slower build).
        hnsw_ef_search: HNSW search beam width (raised to k when k is larger).
        ivf_nlist: IVF cluster count; None picks about 4*sqrt(n), capped so that every cluster
            has at least 39 training points (faiss's own guideline).
        ivf_nprobe: IVF clusters visited per query (capped at nlist).
    """

    kind: IndexKind = "flat"
    hnsw_m: int = 32
    hnsw_ef_construction: int = 200
    hnsw_ef_search: int = 128
    ivf_nlist: int | None = None
    ivf_nprobe: int = 16

    def __post_init__(self) -> None:
        if self.kind not in ("flat", "hnsw", "ivf"):
            raise ValueError(f"unknown index kind {self.kind!r}; use 'flat', 'hnsw' or 'ivf'")
        for field_name in ("hnsw_m", "hnsw_ef_construction", "hnsw_ef_search", "ivf_nprobe"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{field_name} must be at least 1, got {getattr(self, field_name)}")
        if self.ivf_nlist is not None and self.ivf_nlist < 1:
            raise ValueError(f"ivf_nlist must be at least 1, got {self.ivf_nlist}")

    def nlist_for(self, n: int) -> int:
        """IVF cluster count for ``n`` vectors."""
        if self.ivf_nlist is not None:
            if self.ivf_nlist > n:
                raise ValueError(f"ivf_nlist={self.ivf_nlist} is more than the {n} passages to cluster")
            return self.ivf_nlist
        return max(1, min(int(4 * math.sqrt(n)), n // 39))


@dataclass(frozen=True)
class BuildStats:
    """How a :class:`DenseSource` got its index: what was reused from disk and how long each part
    took in this process (0.0 for reused parts)."""

    reused_embeddings: bool
    reused_index: bool
    encode_seconds: float
    index_seconds: float
    load_seconds: float


def passage_text(passage: Passage) -> str:
    """The text a passage is encoded as: title and body on separate lines (the wiki-18 convention)."""
    return f"{passage.title}\n{passage.text}" if passage.title else passage.text


def as_passages(passages_or_path: Iterable[Passage | Mapping[str, Any]] | str | os.PathLike[str]) -> list[Passage]:
    """The corpus as passages: from a jsonl path (``{id, title, text}`` or wiki-18 ``{id, contents}``,
    read by :func:`search_env.data.corpus.load_corpus`), or from passages or row dicts as
    :class:`~search_env.sources.bm25.BM25Source` takes them."""
    if isinstance(passages_or_path, (str, os.PathLike)):
        rows: Iterable[Passage | Mapping[str, Any]] = load_corpus(passages_or_path)
    else:
        rows = passages_or_path
    passages = []
    for i, row in enumerate(rows):
        if not isinstance(row, Passage):
            fields = passage_from_row(row, f"passage {i}")
            row = Passage(fields["id"], fields["title"], fields["text"])
        passages.append(row)
    return passages


def corpus_fingerprint(passages: Iterable[Passage]) -> str:
    """A hash of every passage's id, title and text, so stored embeddings are never reused for a
    corpus that changed."""
    digest = hashlib.sha256()
    for p in passages:
        digest.update(f"{p.id}\x1f{p.title}\x1f{p.text}\x1e".encode("utf-8"))
    return digest.hexdigest()


def _faiss() -> Any:
    """The faiss module, or an error naming the extra that installs it."""
    with requires_extra("dense", "dense retrieval"):
        import faiss
    return faiss


def faiss_gpu_available() -> bool:
    """True when the installed faiss has GPU support and sees at least one GPU."""
    faiss = _faiss()

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def build_index(embeddings: np.ndarray, config: IndexConfig, *, show_progress: bool = False) -> Any:
    """A CPU faiss index over unit-norm ``embeddings`` (float32, shape (n, dim)), inner-product metric.
    ``show_progress``: a progress bar; without one, plain progress lines for a long build."""
    faiss = _faiss()

    n, dim = embeddings.shape
    if n == 0:
        raise ValueError("cannot build a dense index over an empty corpus")
    if config.kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif config.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.hnsw_ef_construction
        index.hnsw.efSearch = config.hnsw_ef_search
    else:
        nlist = config.nlist_for(n)
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(np.ascontiguousarray(embeddings, dtype=np.float32))
        index.nprobe = min(config.ivf_nprobe, nlist)
    with progress_meter(total=n, desc=f"indexing ({config.kind})", show=show_progress, unit="vec") as meter:
        for start in range(0, n, _ADD_CHUNK):
            chunk = np.ascontiguousarray(embeddings[start : start + _ADD_CHUNK], dtype=np.float32)
            index.add(chunk)
            meter.update(len(chunk))
    return index


def _to_search_device(index: Any, config: IndexConfig, use_gpu: bool | None) -> Any:
    """Move the index to GPU 0 when asked (or, for None, when faiss-gpu sees a GPU). HNSW has no
    GPU implementation in faiss and stays on the CPU."""
    want = faiss_gpu_available() if use_gpu is None else use_gpu
    if not want:
        return index
    if not faiss_gpu_available():
        raise RuntimeError("use_gpu=True but faiss has no GPU support here (install faiss-gpu) or sees no GPU")
    if config.kind == "hnsw":
        logger.info("faiss has no GPU HNSW; searching the HNSW index on the CPU")
        return index
    faiss = _faiss()

    return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)


class DenseSource(Source):
    """Dense retrieval over a passage corpus: encode, index with faiss, search by inner product.

    Args:
        passages_or_path: the corpus: a jsonl path, passages, or row dicts (see :func:`as_passages`).
        encoder: the text encoder; None means the offline default
            :class:`~search_env.sources.encoders.TransformersEncoder` (all-MiniLM-L6-v2).
        index: an :class:`IndexConfig` or just its kind ("flat", "hnsw", "ivf").
        index_dir: folder for embeddings, index and manifest; reused when it matches the corpus and
            encoder. None keeps everything in memory.
        rebuild: re-encode and overwrite whatever ``index_dir`` holds.
        use_gpu: search on GPU with faiss-gpu; None means when available.
        show_progress: progress bars while encoding and indexing; None: only when stderr is a
            terminal or ``$SEARCHQA_PROGRESS`` asks for them (see :mod:`search_env.console`).
            Without bars, a build that takes long prints a plain progress line on stderr every
            :data:`~search_env.progress_lines.LINE_INTERVAL_S` seconds (done, share, elapsed, time
            left), so a log shows it moving (:mod:`search_env.progress_lines`).
        name: the source's name in multi-source environments.
    """

    def __init__(
        self,
        passages_or_path: Iterable[Passage | Mapping[str, Any]] | str | os.PathLike[str],
        encoder: TextEncoder | None = None,
        *,
        index: IndexConfig | IndexKind = "flat",
        index_dir: str | os.PathLike[str] | None = None,
        rebuild: bool = False,
        use_gpu: bool | None = None,
        show_progress: bool | None = None,
        name: str = "dense",
    ) -> None:
        if encoder is None:
            from .encoders import TransformersEncoder

            encoder = TransformersEncoder()
        self.name = name
        self.encoder = encoder
        self.config = index if isinstance(index, IndexConfig) else IndexConfig(kind=index)
        self.passages = as_passages(passages_or_path)
        if not self.passages:
            raise ValueError("DenseSource needs a non-empty corpus")
        self.index_dir = Path(index_dir).expanduser() if index_dir is not None else None
        cpu_index, self.stats = self._load_or_build(rebuild=rebuild, show_progress=progress_enabled(show_progress))
        self._index = _to_search_device(cpu_index, self.config, use_gpu)

    @property
    def fork_safe(self) -> bool:
        return False  # its encoder runs a PyTorch model in-process (see Source.fork_safe)

    def _manifest(self, corpus_hash: str, stats: BuildStats) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "encoder": self.encoder.signature,
            "corpus": corpus_hash,
            "num_passages": len(self.passages),
            "dim": self.encoder.dim,
            "index": asdict(self.config),
            "encode_seconds": stats.encode_seconds,
            "index_seconds": stats.index_seconds,
        }

    def _load_or_build(self, *, rebuild: bool, show_progress: bool) -> tuple[Any, BuildStats]:
        faiss = _faiss()

        corpus_hash = corpus_fingerprint(self.passages)
        stored = self._read_manifest() if self.index_dir is not None and not rebuild else None
        start = time.perf_counter()
        if stored is not None:
            self._check_manifest(stored, corpus_hash)
            index_path = self.index_dir / INDEX_FILE
            if stored["index"] == asdict(self.config) and index_path.exists():
                index = faiss.read_index(str(index_path))
                stats = BuildStats(True, True, 0.0, 0.0, time.perf_counter() - start)
                logger.info("loaded dense index from %s", self.index_dir)
                return index, stats
            embeddings = np.load(self.index_dir / EMBEDDINGS, mmap_mode="r")
            load_seconds = time.perf_counter() - start
            encode_seconds = 0.0
        else:
            texts = [passage_text(p) for p in self.passages]
            embeddings = self.encoder.encode_passages(texts, show_progress=show_progress)
            encode_seconds, load_seconds = time.perf_counter() - start, 0.0
            if embeddings.shape != (len(self.passages), self.encoder.dim):
                raise ValueError(
                    f"encoder returned embeddings of shape {embeddings.shape}, "
                    f"expected {(len(self.passages), self.encoder.dim)}"
                )
        index_start = time.perf_counter()
        index = build_index(embeddings, self.config, show_progress=show_progress)
        stats = BuildStats(stored is not None, False, encode_seconds, time.perf_counter() - index_start, load_seconds)
        if self.index_dir is not None:
            self._write(index, embeddings if stored is None else None, corpus_hash, stats)
        return index, stats

    def _read_manifest(self) -> dict[str, Any] | None:
        path = self.index_dir / MANIFEST
        if not path.exists():
            return None
        if not (self.index_dir / EMBEDDINGS).exists():
            raise FileNotFoundError(f"{path} exists but {EMBEDDINGS} is missing; pass rebuild=True to rebuild")
        return json.loads(path.read_text(encoding="utf-8"))

    def _check_manifest(self, stored: dict[str, Any], corpus_hash: str) -> None:
        problems = []
        if stored.get("format") != FORMAT_VERSION:
            problems.append(f"format {stored.get('format')} (this version reads {FORMAT_VERSION})")
        if stored.get("encoder") != self.encoder.signature:
            problems.append(f"encoder {stored.get('encoder')!r} (now {self.encoder.signature!r})")
        if stored.get("corpus") != corpus_hash:
            problems.append(f"a different corpus ({stored.get('num_passages')} passages, hash {str(stored.get('corpus'))[:12]})")
        if problems:
            raise ValueError(
                f"the dense index in {self.index_dir} was built with " + "; ".join(problems)
                + ". Pass rebuild=True to re-encode into it, or use another index_dir."
            )

    def _write(self, index: Any, embeddings: np.ndarray | None, corpus_hash: str, stats: BuildStats) -> None:
        """Write embeddings (when freshly encoded), index and manifest; the manifest goes last so an
        interrupted write never looks like a complete index."""
        faiss = _faiss()

        self.index_dir.mkdir(parents=True, exist_ok=True)
        manifest_path = self.index_dir / MANIFEST
        if embeddings is not None:
            manifest_path.unlink(missing_ok=True)
            np.save(self.index_dir / EMBEDDINGS, embeddings)
            manifest = self._manifest(corpus_hash, stats)
        else:  # new index over stored embeddings: keep the original encoding time
            manifest = {**json.loads(manifest_path.read_text(encoding="utf-8")), "index": asdict(self.config),
                        "index_seconds": stats.index_seconds}
        faiss.write_index(index, str(self.index_dir / INDEX_FILE))
        write_atomically(manifest_path, json.dumps(manifest, indent=2))

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Top-``k`` passages per query by cosine similarity; ``score`` is that similarity."""
        if k < 0:
            raise ValueError(f"k must be non-negative, got {k}")
        queries = list(queries)
        if not queries:
            return []
        if k == 0:
            return [[] for _ in queries]
        vectors = np.ascontiguousarray(self.encoder.encode_queries(queries), dtype=np.float32)
        depth = min(k, len(self.passages))
        params = None
        if self.config.kind == "hnsw" and depth > self.config.hnsw_ef_search:
            faiss = _faiss()  # the beam must be at least k wide to return k results

            params = faiss.SearchParametersHNSW(efSearch=depth)
        scores, rows = self._index.search(vectors, depth, params=params)
        return [
            [Passage(self.passages[i].id, self.passages[i].title, self.passages[i].text, float(s))
             for s, i in zip(score_row, row) if i >= 0]
            for score_row, row in zip(scores, rows)
        ]

    def __len__(self) -> int:
        return len(self.passages)
