"""SearchQA Gym: question answering with search as a token-level Gymnasium environment.

``import search_env`` registers ``SearchQA-v0``; ``gym.make("SearchQA-v0", protocol=..., dataset=...,
sources=..., tokenizer=...)`` builds a :class:`SearchQAEnv`.
"""
from typing import Any

from gymnasium.envs.registration import register

from rewards.registry import UnknownNameError

from search_env.batch import BatchEnv
from search_env.data import QAExample, load_dataset
from search_env.env import SearchQAEnv
from search_env.protocols import SEED_PROTOCOLS, Dialect, available_protocols, get_protocol, register_protocol
from search_env.sources.base import Passage, Source, SourceError
from search_env.trajectory import AGENT, ENVIRONMENT, Trajectory
from search_env.types import Action, Observation, StepResult
from search_env.vector import BatchSearchQAEnv
from search_env.worker import EnvWorker
from search_env.wrappers import FixedWindowObservation, FullContextObservation

__all__ = [
    "SearchQAEnv", "BatchSearchQAEnv", "EnvWorker", "BatchEnv", "Dialect", "register_protocol", "get_protocol",
    "available_protocols", "SEED_PROTOCOLS", "UnknownNameError", "Passage", "Source", "SourceError", "Trajectory",
    "AGENT", "ENVIRONMENT", "Action", "Observation", "StepResult", "QAExample", "load_dataset",
    "FixedWindowObservation", "FullContextObservation", *("BM25Source", "CachedSource", "DenseSource", "HybridSource",
                                                          "ProbeSource", "RemoteSource", "TimeLimitedSource"),
]
__version__ = "0.1.0"

#: The sources, importable from the package where users look for them; loaded on first use (dense
#: retrieval needs torch and faiss, BM25 its index library).
_SOURCES = {"BM25Source", "CachedSource", "DenseSource", "HybridSource", "ProbeSource", "RemoteSource", "TimeLimitedSource"}


def __getattr__(name: str) -> Any:
    if name in _SOURCES:
        from search_env import sources

        return getattr(sources, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


register(id="SearchQA-v0", entry_point="search_env.env:SearchQAEnv")
