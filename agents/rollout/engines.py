"""Rollout engines: what plays the episodes, for training (``rollout.engine``) and ``benchmarks.evaluate`` alike.

An engine makes the agent of each rollout (:mod:`agents.rollout.agent`) and, when it holds its own copy of
the weights, takes the trained ones after each optimiser step: such an engine (``vllm``, ``vllm-server``)
also inherits :class:`~agents.rollout.engine_weights.EngineWithWeights`, which names what the trainer's sync
check and rollouts ahead read of it. The trainer sees only :class:`RolloutEngine`; which engine runs is a
registered name, so a new engine (SGLang, a remote server) is one file and one call::

    @dataclass
    class MyEngineOptions:           # the run config's ``engine`` group: --engine.FIELD
        url: str = "http://localhost:9000"

    class MyEngine:                  # the RolloutEngine protocol, and a ``build`` class method
        logprobs_are_trainers = False
        ...
        @classmethod
        def build(cls, options: MyEngineOptions, setup: EngineSetup) -> MyEngine: ...

    register_engine("mine", MyEngine, options=MyEngineOptions)

Then ``--import my_module --rollout.engine mine`` trains with it and ``benchmarks.evaluate --import
my_module --agents mine:MODEL`` evaluates with it. The built-in engines' modules (``hf``, ``vllm``,
``vllm-server``, ``endpoint``) are imported when their name is first looked up.
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

from agents.rollout.agent import RolloutAgent
from rewards.name_registry import Registry, same_definition

__all__ = ["DEFAULT_TIS_CAP", "ENGINES", "EngineEntry", "EngineSetup", "RolloutEngine", "engine_options_class",
           "is_engine", "lookup_engine", "register_engine"]

#: ``algorithm.tis_cap`` left unset, with an engine whose log-probs are not the trainer's own: truncated
#: importance sampling corrects for their gap (kernels, precision, a sync that lags).
DEFAULT_TIS_CAP = 2.0


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer asks of the engine that samples its episodes.

    Attributes:
        logprobs_are_trainers: the log-probs its agents return are the trainer's own for the same weights
            (the HF sampler runs the trained model itself); otherwise the learners' truncated importance
            sampling is on by default (:attr:`EngineEntry.default_tis_cap`).
        decodes_trained_policy: its agents decode with the trained policy's own modules, so the trainer
            wraps decoding in the backend's ``generation()`` (where a sharded policy's weights are whole);
            an engine with a copy of its own takes the weights through :meth:`attach` instead.
        needs_policy: it is built over a policy (:attr:`EngineSetup.policy`); an engine that serves a
            model of its own (an endpoint) is built with none.
        reuse_logprobs: the update may take the rollout's log-probs as the rollout policy's instead of
            recomputing them (one forward pass fewer); the trainer heeds it only with
            ``logprobs_are_trainers``.
    """

    logprobs_are_trainers: bool
    decodes_trained_policy: bool
    needs_policy: bool
    reuse_logprobs: bool

    def agent(self, *, greedy: bool, seed: int, first_row: int = 0) -> RolloutAgent:
        """The agent of one rollout: greedy decoding, or sampling (at the engine's temperature and top-p)
        seeded by ``seed``. ``first_row`` is the index of the agent's first episode in the rollout's whole
        batch (a data-parallel rank's share starts past the others'); the agent's episodes are counted from
        it over its ``begin`` calls, and a sampling agent draws each episode's tokens from a stream keyed by
        (``seed``, that index), so one process and N ranks sample the same episodes."""
        ...

    def attach(self, backend: Any) -> Any:
        """Follow ``backend``'s optimiser steps (its post-step hook), reading the weights from
        ``backend.rollout_weights``; called once, by the trainer."""
        ...

    def sync(self, weights: Callable[..., Iterator[tuple[str, Any]]] | None = None) -> None:
        """Take the policy's current weights now, or those ``weights`` yields (called as
        ``backend.rollout_weights`` is: a copy of earlier weights, which ``rollout.max_staleness`` 2 and more
        sends to an engine that generated for older ones meanwhile). An engine that decodes the trained
        policy, or serves fixed weights, may take no ``weights``: those runs never send any."""
        ...

    def sleep(self) -> None:
        """Release what the engine may release until the next rollout (memory during the update)."""
        ...

    def wake_up(self) -> None:
        """Ready for a rollout (current weights); the trainer calls it on every rank before an evaluation."""
        ...

    def close(self) -> None:
        """Free what the engine holds."""
        ...


@dataclass(frozen=True)
class EngineSetup:
    """What building an engine takes besides its options.

    Attributes:
        policy: the :class:`~agents.policies.policy.HFPolicy` it decodes or copies (``None`` for an engine
            that does not need one, ``needs_policy = False``).
        temperature / top_p: how its agents sample (greedy agents ignore them).
        max_context: the longest context (prompt, generated and environment tokens) a row may reach.
        seed: the engine's own seed (each agent has its seed too).
        whole_weights: a block within which ``policy``'s weights are whole, for an engine that copies them
            when it is built (a sharded training backend's ``generation()``; nothing to do by default).
    """

    policy: Any = None
    temperature: float = 1.0
    top_p: float = 1.0
    max_context: int = 4096
    seed: int = 0
    whole_weights: Callable[[], AbstractContextManager[Any]] = nullcontext


@dataclass(frozen=True)
class EngineEntry:
    """A registered engine.

    Attributes:
        engine: its class: a :class:`RolloutEngine` with ``build(options, setup)``, a class method.
        options: the dataclass of its settings (the run config's ``engine`` group).
    """

    engine: type
    options: type

    @property
    def default_tis_cap(self) -> float:
        """``algorithm.tis_cap`` when the run leaves it unset: 0 (off) when the engine's log-probs are the
        trainer's own, else :data:`DEFAULT_TIS_CAP`."""
        return 0.0 if self.engine.logprobs_are_trainers else DEFAULT_TIS_CAP

    def build(self, options: Any, setup: EngineSetup) -> RolloutEngine:
        """The engine for ``options`` (an instance of :attr:`options`) and ``setup``."""
        if type(options) is not self.options:
            raise ValueError(f"engine {self.engine.__name__} takes a {self.options.__name__}, got a {type(options).__name__}")
        if self.engine.needs_policy and setup.policy is None:
            raise ValueError(f"engine {self.engine.__name__} decodes a policy: give EngineSetup(policy=...)")
        return self.engine.build(options, setup)


ENGINES: Registry[EngineEntry] = Registry("rollout.engine", built_in={
    "hf": "agents.rollout.hf_engine", "vllm": "agents.rollout.vllm_engine", "endpoint": "agents.rollout.endpoint",
    "vllm-server": "agents.rollout.vllm_server_engine"})
"""Engine name (``rollout.engine``) -> its registration; the built-in engines' modules are imported when
their name is first looked up."""
#: What a registered engine class must have besides the protocol's methods.
_CLASS_ATTRIBUTES = ("logprobs_are_trainers", "decodes_trained_policy", "needs_policy", "build")


def register_engine(name: str, engine: type, *, options: type, replace: bool = False) -> None:
    """Make ``engine`` reachable as ``rollout.engine: name`` (and as ``benchmarks.evaluate``'s agents
    ``name:MODEL``), with ``options`` (a dataclass, every field with a default) as its settings.

    Raises:
        ValueError: ``engine`` lacks a class attribute or method :class:`RolloutEngine` and the registry
            need (one line naming them), or ``name`` is taken by another engine (pass ``replace=True``).
    """
    missing = [attribute for attribute in (*_CLASS_ATTRIBUTES, "agent", "attach", "sync", "sleep", "wake_up", "close")
               if not hasattr(engine, attribute)]
    if missing:
        raise ValueError(f"engine {name!r}: {engine.__name__} lacks {', '.join(missing)} (see agents.rollout.engines.RolloutEngine)")
    known = ENGINES.get(name)
    again = known is not None and same_definition(known.engine, engine)  # its module imported again
    ENGINES.add(name, EngineEntry(engine, options), replace=replace or again)


def lookup_engine(name: str) -> EngineEntry:
    """The registration of engine ``name``; ``UnknownNameError`` (one line, the known names) for another."""
    return ENGINES.lookup(name)


def is_engine(name: str) -> bool:
    """Whether ``name`` is a registered (or built-in) engine, importing nothing else."""
    return ENGINES.has(name)


def engine_options_class(name: str) -> type:
    """The options dataclass of engine ``name`` (the run config's ``engine`` group)."""
    return lookup_engine(name).options
