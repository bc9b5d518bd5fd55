"""Search sources: one batched interface (:class:`Source`) over BM25, dense, hybrid and remote retrieval, and
wrappers over any source (a cache, a time limit, probes that spoil a share of queries on purpose), and
the registry of retrievers a corpus is searched with by name (:func:`register_source`, see
:mod:`search_env.sources.registry`).

``DenseSource`` (torch, faiss), ``RemoteSource`` (urllib3) and ``MCPSource`` (an MCP server's tool; the ``mcp``
extra) load their dependencies on first use.
"""
from typing import Any

from search_env.sources.base import Passage, Source, SourceError
from search_env.sources.bm25 import BM25Source
from search_env.sources.cache import CachedSource
from search_env.sources.hybrid import HybridSource, reciprocal_rank_fusion
from search_env.sources.probes import PROBES, ProbeSource
from search_env.sources.recorded import RecordedSource, RetrievalRecording
from search_env.sources.registry import (
    SOURCES, SourceOptions, available_sources, build_source, lookup_source, register_source,
)
from search_env.sources.time_limit import TimeLimitedSource

__all__ = [
    "Passage", "Source", "SourceError", "BM25Source", "CachedSource", "TimeLimitedSource", "HybridSource",
    "reciprocal_rank_fusion", "ProbeSource", "PROBES", "DenseSource", "RemoteSource", "MCPSource", "RecordedSource", "RetrievalRecording",
    "SOURCES", "SourceOptions", "available_sources", "build_source", "lookup_source", "register_source",
]
_LAZY = {"DenseSource": "search_env.sources.dense", "RemoteSource": "search_env.sources.remote",
         "MCPSource": "search_env.sources.mcp"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
