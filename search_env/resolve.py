"""Turning :class:`~search_env.env.SearchQAEnv`'s constructor arguments into what an episode uses.

Each helper takes what a user may pass (a dataset name, a path or examples; a source, a corpus path or
a mapping; a reward name or schedule) and returns one canonical form, or raises a one-line error
saying what to pass instead. Kept apart from the environment so that ``env.py`` reads as the POMDP.
"""
from __future__ import annotations

import numbers
import os
from typing import Any, Mapping, Sequence

from rewards.registry import get as get_preset
from rewards.schedule import StepReward, accepts_option

from search_env.dag.validate import normalize_source_name
from search_env.data.example import QAExample
from search_env.protocols import Dialect
from search_env.sources.base import Source

__all__ = [
    "resolve_budget",
    "resolve_dataset",
    "resolve_sources",
    "guard_sources",
    "resolve_source_names",
    "default_aliases",
    "offer_plan_tools",
    "resolve_reward",
]

_SOURCES_HELP = "a Source, a corpus path (jsonl, searched with BM25), or a mapping of names to those"


def resolve_budget(name: str, value: Any, protocol_value: int | None, low: int) -> int | None:
    """``value`` checked to be an int >= ``low``, or the protocol's ``protocol_value`` when it is None."""
    if value is None:
        return protocol_value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, or None for the protocol's; got {value!r}")
    return int(value)


def resolve_dataset(dataset: Any, seed: int, size: int) -> tuple[list[QAExample], Any]:
    """The examples of ``dataset``, and the synthetic world when it is ``"synthetic"`` (else None)."""
    if isinstance(dataset, str) and dataset == "synthetic":
        from search_env.synthetic import generate_world

        world = generate_world(seed=seed, n_questions=size)
        return list(world.questions), world
    if isinstance(dataset, (str, os.PathLike)):
        from search_env.data.loaders import load_dataset

        examples = list(load_dataset(os.fspath(dataset)))
    else:
        examples = list(dataset)
    if not examples:
        raise ValueError("the dataset is empty")
    return examples, None


def resolve_sources(sources: Any, world: Any) -> dict[str, Source]:
    """Named sources (lower-cased names). ``None``: BM25 over the synthetic world, one source per
    world source plus ``"all"``. A corpus path becomes a BM25 source named ``"wiki"`` (the name the
    default NL-DAG aliases point at)."""
    if sources is None:
        if world is None:
            raise ValueError(f"pass sources=... ({_SOURCES_HELP}) for a non-synthetic dataset")
        from search_env.sources.bm25 import BM25Source

        resolved: dict[str, Source] = {name: BM25Source(passages, name=name) for name, passages in world.sources.items()}
        resolved["all"] = BM25Source(world.passages(), name="all")
        return resolved
    if isinstance(sources, Source):
        return {sources.name.lower(): sources}
    if isinstance(sources, (str, os.PathLike)):
        return {"wiki": _corpus_source(sources, "wiki")}
    if not isinstance(sources, Mapping):
        raise TypeError(f"sources must be {_SOURCES_HELP}; got {type(sources).__name__}")
    resolved = {}
    for name, source in sources.items():
        if isinstance(source, (str, os.PathLike)):
            source = _corpus_source(source, str(name))
        elif not isinstance(source, Source):
            raise TypeError(f"sources[{name!r}] must be a Source or a corpus path, not {type(source).__name__}")
        resolved[str(name).lower()] = source
    if not resolved:
        raise ValueError("sources is empty")
    return resolved


def _corpus_source(path: str | os.PathLike, name: str) -> Source:
    from search_env.sources.bm25 import BM25Source

    return BM25Source(os.fspath(path), name=name)


def guard_sources(sources: dict[str, Source], cache_size: int, timeout_s: float | None) -> dict[str, Source]:
    """Wrap each distinct source once: a time limit inside, an LRU cache outside (a hit costs no call)."""
    if not cache_size and timeout_s is None:
        return sources
    from search_env.sources.cache import CachedSource
    from search_env.sources.time_limit import TimeLimitedSource

    wrapped: dict[int, Source] = {}
    for source in sources.values():
        if id(source) not in wrapped:
            guarded = TimeLimitedSource(source, timeout_s) if timeout_s is not None else source
            wrapped[id(source)] = CachedSource(guarded, maxsize=cache_size) if cache_size else guarded
    return {name: wrapped[id(source)] for name, source in sources.items()}


def resolve_source_names(
    sources: Mapping[str, Source], default_source: str | None, source_aliases: Mapping[str, str] | None
) -> tuple[dict[str, str], str]:
    """The aliases NL-DAG plans may use (lower-cased; :func:`default_aliases` when none are given) and
    the source single queries go to (``"all"`` when there is one, else the first)."""
    aliases = {k.lower(): v.lower() for k, v in (source_aliases or default_aliases(sources)).items()}
    default = (default_source or ("all" if "all" in sources else next(iter(sources)))).lower()
    if default not in sources:
        raise ValueError(f"default_source {default!r} is not one of {sorted(sources)}")
    return aliases, default


def default_aliases(sources: Mapping[str, Source]) -> dict[str, str]:
    """Reasoning-search's tool names mapped onto the synthetic world's sources, when both exist."""
    aliases = {"general": "wiki", "academy": "papers", "search": "wiki"}
    return {k: v for k, v in aliases.items() if v in sources and k not in sources}


def offer_plan_tools(protocol: Dialect, sources: Mapping[str, Source], aliases: Mapping[str, str]) -> Dialect:
    """``protocol`` with the tools its NL-DAG prompt offers fitted to these sources and aliases.

    The protocol's own list is kept whole when every name in it resolves (parity with the reference
    prompt, e.g. General/News/Academy over the synthetic world's wiki/news/papers). Otherwise the
    names that resolve are kept, and every source that none of them reaches is offered by its name.
    A single-query protocol, or one that offers no tools, is returned as it is.
    """
    if protocol.call_kind != "dag" or not protocol.plan_tools:
        return protocol

    def target(name: str) -> str | None:
        key = normalize_source_name(name)
        key = aliases.get(key, key)
        return key if key in sources else None

    kept = tuple((name, what) for name, what in protocol.plan_tools if target(name) is not None)
    if len(kept) == len(protocol.plan_tools):
        return protocol
    reached = {target(name) for name, _ in kept}
    return protocol.with_options(plan_tools=kept + tuple((name, "") for name in sources if name not in reached))


def resolve_reward(
    protocol: Dialect,
    reward: str | StepReward | None,
    reward_options: Mapping[str, Any] | None,
    plan_names: Sequence[str],
) -> tuple[str | StepReward, dict[str, Any]]:
    """The reward an episode is scored with and its keyword options.

    ``reward`` None means the protocol's preset with the protocol's options; a preset name or a
    :class:`~rewards.schedule.StepReward` replaces both. For an NL-DAG or a tool-calls protocol,
    ``plan_names`` (the source names and aliases a plan or a call may use) go to the reward as its ``tools``
    option when it takes one and the caller did not set it, so the reward accepts every tool the environment
    runs, and only those.
    """
    if reward is not None and not isinstance(reward, (str, StepReward)):
        raise TypeError(f"reward must be a preset name or a rewards.schedule.StepReward, not {type(reward).__name__}")
    chosen = protocol.reward if reward is None else reward
    if isinstance(chosen, str):
        get_preset(chosen)  # an unknown name fails here, listing the known ones, not at an episode's end
    options = dict(protocol.reward_options if reward is None else {}, **(reward_options or {}))
    if protocol.call_kind in ("dag", "tools") and "tools" not in options and accepts_option(chosen, "tools"):
        options["tools"] = tuple(plan_names)
    return chosen, options
