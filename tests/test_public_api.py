"""The names users look for are where they look: the package root, search_env.data and search_env.wrappers."""
from __future__ import annotations

import importlib

import pytest

import search_env
from search_env.data.example import QAExample
from search_env.data.loaders import load_dataset
from search_env.wrappers.fixed_window import FixedWindowObservation
from search_env.wrappers.full_context import FullContextObservation


def test_the_root_exports_datasets_and_wrappers() -> None:
    assert search_env.QAExample is QAExample and search_env.load_dataset is load_dataset
    assert search_env.FixedWindowObservation is FixedWindowObservation
    assert search_env.FullContextObservation is FullContextObservation
    assert search_env.data.load_dataset is load_dataset and search_env.wrappers.FixedWindowObservation is FixedWindowObservation


@pytest.mark.parametrize("module", ["search_env", "search_env.data", "search_env.wrappers", "search_env.sources", "rewards"])
def test_every_exported_name_exists(module: str) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in imported.__all__ if not hasattr(imported, name)]
    assert missing == []


def test_the_root_exports_every_source() -> None:
    from search_env import BM25Source, CachedSource, HybridSource, RemoteSource, TimeLimitedSource
    from search_env.sources.bm25 import BM25Source as bm25
    from search_env.sources.remote import RemoteSource as remote

    assert BM25Source is bm25 and RemoteSource is remote
    assert all(issubclass(cls, search_env.Source) for cls in (BM25Source, CachedSource, HybridSource, TimeLimitedSource))
    with pytest.raises(AttributeError, match="no attribute 'NoSuchSource'"):
        search_env.NoSuchSource
