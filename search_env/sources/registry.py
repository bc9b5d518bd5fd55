"""The retrievers a corpus can be searched with, by name: ``data.retriever`` of a training run,
``benchmarks.evaluate --retriever`` and ``python -m search_env.server --retriever`` all build their
source through :func:`build_source`, so a user's retriever is one file and one call::

    from search_env.sources import SourceOptions, register_source

    def my_retriever(corpus, options: SourceOptions) -> Source:     # a jsonl path, or a list of passages
        return MySource(corpus, name=options.name)

    register_source("mine", my_retriever)

Then ``--import my_module`` makes ``mine`` selectable in all three places. The built-in ``bm25`` and
``dense`` are registered here; their modules (``dense``: torch and faiss) load when one is built. An MCP
server's search tool is one call too: :func:`search_env.sources.mcp.register_mcp_source`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Union

from rewards.name_registry import Registry

from search_env.sources.base import Passage, Source

__all__ = ["SOURCES", "Corpus", "SourceFactory", "SourceOptions", "available_sources", "build_source", "lookup_source",
           "register_source"]

Corpus = Union[str, "os.PathLike[str]", Sequence[Union[Passage, Mapping[str, Any]]]]
"""A ``{id, title, text}`` jsonl (or wiki-18 ``{id, contents}``) path, or the passages themselves."""


@dataclass(frozen=True)
class SourceOptions:
    """What building a retriever over a corpus takes besides the corpus; a retriever reads what it uses.

    Attributes:
        name: the source's name (what a protocol's tool names and the environment's ``sources`` key it by).
        index_dir: a folder of this source's own where it may keep its index between runs (None: in memory).
        rebuild: index again even when ``index_dir`` holds an index.
        encoder: a dense encoder's model folder or name (None: the offline default).
        encoder_threads: torch threads for query encoding (None: torch's default).
        compile_encoder: ``torch.compile`` the encoder at start.
        encoder_backend: the encoder's runtime: ``auto``, ``torch`` or ``openvino``.
        dense_index: the faiss index kind (``flat``, ``hnsw``, ``ivf``).
        show_progress: progress bars while indexing (None: when stderr is a terminal).
    """

    name: str = "wiki"
    index_dir: Path | None = None
    rebuild: bool = False
    encoder: str | None = None
    encoder_threads: int | None = None
    compile_encoder: bool = False
    encoder_backend: str = "auto"
    dense_index: str = "flat"
    show_progress: bool | None = None


SourceFactory = Callable[[Corpus, SourceOptions], Source]
"""``factory(corpus, options) -> Source``: a retriever over ``corpus`` (see :data:`Corpus`)."""

SOURCES: Registry[SourceFactory] = Registry("retriever")
"""Retriever name -> the factory that builds it over a corpus."""


def register_source(name: str, factory: SourceFactory, *, replace: bool = False) -> SourceFactory:
    """Make ``factory`` the retriever ``name``; returns it. A name taken by another factory is a
    ``ValueError`` unless ``replace=True``."""
    if not callable(factory):
        raise TypeError(f"retriever {name!r}: the factory must be callable, got {type(factory).__name__}")
    return SOURCES.add(name, factory, replace=replace)


def lookup_source(name: str) -> SourceFactory:
    """The factory of retriever ``name``; :class:`~rewards.UnknownNameError` (one line, the known names)
    for another."""
    return SOURCES.lookup(name)


def available_sources() -> list[str]:
    """Every retriever name, sorted."""
    return SOURCES.names()


def build_source(name: str, corpus: Corpus, options: SourceOptions = SourceOptions()) -> Source:
    """Retriever ``name`` over ``corpus``."""
    return lookup_source(name)(corpus, options)


def _bm25(corpus: Corpus, options: SourceOptions) -> Source:
    """BM25 over the passages, indexed in memory."""
    from search_env.sources.bm25 import BM25Source

    return BM25Source(corpus if isinstance(corpus, (str, Path)) else list(corpus), name=options.name)


def _dense(corpus: Corpus, options: SourceOptions) -> Source:
    """An encoder's embeddings in a faiss index, kept in ``options.index_dir`` when given."""
    from search_env.sources.dense import DenseSource
    from search_env.sources.encoders import TransformersEncoder

    encoder = TransformersEncoder(options.encoder, num_threads=options.encoder_threads,
                                  compile_model=options.compile_encoder, backend=options.encoder_backend)
    return DenseSource(corpus, encoder, index=options.dense_index, index_dir=options.index_dir, rebuild=options.rebuild,
                       show_progress=options.show_progress, name=options.name)


register_source("bm25", _bm25)
register_source("dense", _dense)
