"""Rollout engines by name: what ``rollout.engine`` picks, for training and for ``benchmarks.evaluate`` alike.

An engine makes the agents that play episodes (:mod:`agents.rollout.agent`) and, when it holds its own copy of
the weights, takes the trained weights after each update. Each engine registers its name with the class of
its options (the run config's ``engine`` group, ``--engine.FIELD``), so that a new engine (SGLang, a remote
server) is one file and one :func:`register_engine` call; the built-in engines' modules are imported when
their name is first looked up.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any

from rewards import UnknownNameError

__all__ = ["ENGINES", "EngineEntry", "engine_options_class", "lookup_engine", "register_engine"]


@dataclass(frozen=True)
class EngineEntry:
    """A registered engine.

    Attributes:
        options: the dataclass of its settings (the run config's ``engine`` group).
        build: ``build(config, policy, backend) -> engine``, called once per run.
    """

    options: type
    build: Any


ENGINES: dict[str, EngineEntry] = {}
"""Engine name (``rollout.engine``) -> its registration."""

#: The modules that register the built-in engines, imported when their name is first looked up.
_BUILT_IN = {"hf": "agents.rollout.hf_engine", "vllm": "agents.rollout.vllm_engine"}


def register_engine(name: str, *, options: type, build: Any) -> None:
    """Make an engine reachable as ``rollout.engine: name``."""
    ENGINES[name] = EngineEntry(options, build)


def lookup_engine(name: str) -> EngineEntry:
    """The registration of engine ``name``; ``UnknownNameError`` (one line, the known names) for another."""
    if name not in ENGINES and name in _BUILT_IN:
        import_module(_BUILT_IN[name])
    try:
        return ENGINES[name]
    except KeyError:
        raise UnknownNameError("rollout.engine", name, sorted({*ENGINES, *_BUILT_IN})) from None


def engine_options_class(name: str) -> type:
    """The options dataclass of engine ``name`` (the run config's ``engine`` group)."""
    return lookup_engine(name).options
