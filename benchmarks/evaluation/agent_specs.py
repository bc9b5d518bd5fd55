"""What ``--agents`` accepts, and how the harness builds each agent.

Every agent plays through :func:`agents.rollout.collect.collect_rollouts` as a
:class:`~agents.rollout.agent.RolloutAgent`, the way training plays its episodes. A spec is one of:

- a registered name (:data:`AGENT_KINDS`): the scripted baselines ``oracle``, ``retrieve-then-answer``,
  ``no-search``; ``hf:MODEL`` (a local ``transformers`` model folder, a trained run's ``policy/``
  folder, ``tiny`` or ``smollm2``, sampled with :class:`~agents.rollout.hf_sampler.HFSampler`);
  ``endpoint:URL#MODEL`` (an OpenAI-compatible completions server, e.g.
  ``endpoint:http://localhost:8000/v1#Qwen/Qwen2.5-3B-Instruct``); the LLM baselines
  (:mod:`agents.baselines`) as ``BASELINE:LLM``: ``direct``, ``cot``, ``naive-rag``, ``ircot``,
  ``oracle-passages``, and ``protocol`` (the LLM under the environment's own prompt, i.e. ``hf:``/
  ``endpoint:``), where LLM is ``smollm2``, ``tiny``, a model folder, ``ENGINE:MODEL`` or
  ``endpoint:URL#MODEL`` (e.g. ``ircot:smollm2``, ``cot:endpoint:http://localhost:8000/v1#my-model``):
  the same model, engine and decoding in every row. A kind takes its argument after the first colon;
  :func:`register_agent_kind` adds one;
- ``ENGINE:MODEL``: any rollout engine of :mod:`agents.rollout.engines` (``hf`` and ``endpoint`` above,
  ``vllm``, or one a module registers, imported with ``--import``) over MODEL (as for ``hf:``), or
  ``ENGINE`` alone for an engine that serves a model of its own; its options are its options class's
  defaults and ``--engine-option ENGINE.FIELD=VALUE`` (:attr:`AgentOptions.engine_options`). Model
  agents are built through that registry, as training builds its rollout engine;
- an existing folder: the same as ``hf:FOLDER``;
- ``module:Name``: a scripted agent class (``start`` and ``next_text``, one instance per episode), or a
  rollout agent: a class with ``begin``/``generate``/``feed``/``finish``, or a function returning such
  an agent. It is called with the decoding keywords its signature takes among ``greedy``,
  ``temperature``, ``top_p`` and ``seed``.

An agent that has a ``codec`` attribute (an HF sampler: its model's tokenizer) gets environments built
with that tokenizer; the others get the run's tokenizer (``--tokenizer``, default the built-in one).

Decoding is greedy unless ``--sampled K``: then every agent whose episodes depend on a seed plays K
seeds and its row is their mean; scripted agents, and rollout agents that take no ``seed``, play once.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from agents.baselines import BASELINES, BaselineAgent, RolloutTextGenerator
from agents.rollout.agent import RolloutAgent
from agents.rollout.engines import ENGINES, EngineSetup, RolloutEngine, is_engine, lookup_engine
from agents.scripted import NoSearchAgent, OracleAgent, RetrieveThenAnswerAgent, ScriptedRolloutAgent
from rewards import Registry
from search_env.data.example import QAExample

from benchmarks.evaluation import HarnessError

__all__ = ["AGENT_KINDS", "AgentLoader", "AgentOptions", "Decoding", "EvalAgent", "agent_from_object", "options_of_engine",
           "parse_agent", "register_agent_kind"]


@dataclass(frozen=True)
class Decoding:
    """How a model agent picks its tokens: greedy (``samples`` 0), or sampled at ``temperature`` and
    ``top_p`` over ``samples`` seeds."""

    samples: int = 0
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.samples < 0 or self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"decoding needs samples >= 0, temperature > 0 and top_p in (0, 1]; got {self}")

    @property
    def greedy(self) -> bool:
        return self.samples == 0

    def describe(self) -> str:
        """``greedy`` or ``sampled (T=0.6, top-p 1), mean of 4 seeds``."""
        if self.greedy:
            return "greedy"
        return f"sampled (T={self.temperature:g}, top-p {self.top_p:g}), mean of {self.samples} seed{'s' if self.samples > 1 else ''}"


@dataclass(frozen=True)
class AgentOptions:
    """What building an agent may need besides its spec.

    Attributes:
        decoding: greedy or sampled.
        device: where a local model runs (None: CUDA when available, else the CPU).
        dtype: a local model's weights: ``auto`` (bfloat16 on CUDA, float32 on the CPU), ``float32``,
            ``bfloat16`` or ``float16``.
        api_key_env: the environment variable holding an endpoint's API key (unset: none is sent).
        timeout_s: deadline of one endpoint request.
        max_context: the longest context of an episode (an engine sizes its cache by it).
        engine_options: by engine name, fields of its options (``{"vllm": {"memory_fraction": 0.5}}``)
            over their defaults; for ``endpoint`` over ``api_key_env`` and ``timeout_s`` above too.
    """

    decoding: Decoding = Decoding()
    device: str | None = None
    dtype: str = "auto"
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 120.0
    max_context: int = 8192
    engine_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def _plays_every_question(example: QAExample) -> str | None:
    """The ``unable`` of an agent that can play any question."""
    return None


@dataclass
class EvalAgent:
    """An agent as the harness plays it.

    Attributes:
        name: the spec as given (the table's agent column).
        build: a fresh rollout agent for a seed (one per (dataset, protocol, seed) cell).
        seeded: whether its episodes depend on the seed (then ``--sampled K`` plays K seeds).
        decoding: how it decodes, for the table.
        release: frees what loading it took (a model's memory); called once its cells are done.
        unable: why it cannot play a question (None: it can), e.g. the gold-passage oracle on a dataset
            without gold passages; a dataset with such a question is not played by it at all.
    """

    name: str
    build: Callable[[int], RolloutAgent]
    seeded: bool
    decoding: str
    release: Callable[[], None] = lambda: None
    unable: Callable[[QAExample], "str | None"] = _plays_every_question


#: Loads an agent (a model, a client) with the run's options; the spec was checked already.
AgentLoader = Callable[[AgentOptions], EvalAgent]
#: Parses a kind's argument (None when the spec has none) for the spec ``name``; raises ``ValueError``
#: in one line for a bad one, and returns the loader.
AgentKind = Callable[[str, "str | None"], AgentLoader]

#: The scripted baselines by name.
SCRIPTED = {"oracle": OracleAgent, "retrieve-then-answer": RetrieveThenAnswerAgent, "no-search": NoSearchAgent}
_DECODING_KEYWORDS = ("greedy", "temperature", "top_p", "seed")


def _scripted_kind(cls: type) -> AgentKind:
    def parse(name: str, argument: str | None) -> AgentLoader:
        if argument is not None:
            raise ValueError(f"agent {name!r}: {name.partition(':')[0]} takes no argument")
        return lambda options: agent_from_object(name, cls, options)
    return parse


def _engine_kind(engine: str) -> AgentKind:
    """``ENGINE:MODEL`` for a rollout engine over a local model; ``ENGINE`` alone for one that serves its own."""
    def parse(name: str, argument: str | None) -> AgentLoader:
        if not lookup_engine(engine).engine.needs_policy:
            if argument is not None:
                raise ValueError(f"agent {name!r}: engine {engine} serves a model of its own and takes no argument "
                                 f"(its options: --engine-option {engine}.FIELD=VALUE)")
            return lambda options: _load_engine(name, engine, None, options)
        if not argument:
            raise ValueError(f"agent {name!r}: give {engine}:MODEL, a model folder, 'tiny' or 'smollm2'")
        if argument not in ("tiny", "smollm2") and not os.path.isdir(argument):
            raise ValueError(f"agent {name!r}: {argument!r} is not an existing model folder, 'tiny' or 'smollm2'")
        return lambda options: _load_engine(name, engine, argument, options)
    return parse


def _endpoint_kind(name: str, argument: str | None) -> AgentLoader:
    url, _, model = (argument or "").partition("#")
    if not url or not model:
        raise ValueError(f"agent {name!r}: give endpoint:URL#MODEL, e.g. endpoint:http://localhost:8000/v1#my-model")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"agent {name!r}: {url!r} is not an http(s) URL")
    return lambda options: _load_engine(name, "endpoint", None, options, {"url": url, "model": model})


def _llm_kind(name: str, argument: str | None) -> AgentLoader:
    """The LLM of a baseline spec ``BASELINE:LLM``: ``ENGINE:MODEL`` (``hf:MODEL``...), ``endpoint:URL#MODEL``,
    or a bare model (``hf``'s)."""
    if not argument:
        raise ValueError(f"agent {name!r}: give {name.partition(':')[0]}:LLM, where LLM is smollm2, tiny, a model folder, "
                         "hf:MODEL or endpoint:URL#MODEL")
    engine, colon, rest = argument.partition(":")
    if engine == "endpoint":
        return _endpoint_kind(name, rest if colon else None)
    if is_engine(engine):
        return _engine_kind(engine)(name, rest if colon else None)
    return _engine_kind("hf")(name, argument)


def _baseline_kind(baseline: str) -> AgentKind:
    def parse(name: str, argument: str | None) -> AgentLoader:
        load_llm = _llm_kind(name, argument)  # builds the LLM's agent, named ``name``: the protocol row
        if baseline == "protocol":
            return load_llm
        return lambda options: _load_baseline(name, baseline, load_llm(options))
    return parse


#: Agent kinds by name (the part of a spec before its first colon), on the project's one registry type.
AGENT_KINDS: Registry[AgentKind] = Registry("agent kind")
AGENT_KINDS.update({**{key: _scripted_kind(cls) for key, cls in SCRIPTED.items()}, "hf": _engine_kind("hf"),
                    "endpoint": _endpoint_kind, **{key: _baseline_kind(key) for key in ("protocol", *BASELINES)}})


def register_agent_kind(name: str, kind: AgentKind, *, replace: bool = False) -> None:
    """Add an agent kind, so ``--agents NAME`` or ``NAME:ARGUMENT`` builds it (a named baseline). A name
    taken by another kind raises ``ValueError`` unless ``replace=True``, as in every registry of the project."""
    if ":" in name or not name:
        raise ValueError(f"an agent kind's name must be non-empty and have no colon, got {name!r}")
    AGENT_KINDS.add(name, kind, replace=replace)


def parse_agent(spec: str) -> AgentLoader:
    """Check ``spec`` (see the module docstring) without loading any model, and return its loader.

    Raises:
        ValueError: one line saying what is wrong and what to give instead.
    """
    kind, colon, argument = spec.partition(":")
    if kind in AGENT_KINDS:
        return AGENT_KINDS[kind](spec, argument if colon else None)
    if is_engine(kind):
        return _engine_kind(kind)(spec, argument if colon else None)
    if os.path.isdir(spec):
        return _engine_kind("hf")(spec, spec)
    if not colon or not kind or not argument:
        raise ValueError(f"unknown agent {spec!r}: give one of {', '.join(AGENT_KINDS)} (KIND or KIND:ARGUMENT), "
                         f"a rollout engine's ENGINE:MODEL ({', '.join(sorted({'vllm', *ENGINES}))}), a model folder or module:Name")
    try:
        target = getattr(importlib.import_module(kind), argument)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load agent {spec!r}: {exc}") from None
    _check_object(spec, target)
    return lambda options: agent_from_object(spec, target, options)


def _check_object(name: str, target: Any) -> None:
    if isinstance(target, type) and not (_is_scripted(target) or _is_rollout_class(target)):
        raise ValueError(f"agent {name!r} lacks start and next_text (a scripted agent, see agents.scripted.agents.ScriptedAgent) "
                         "and begin, generate, feed and finish (a RolloutAgent)")
    if not callable(target):
        raise ValueError(f"agent {name!r} is a {type(target).__name__}, not a class or a function returning a RolloutAgent")


def _is_scripted(cls: type) -> bool:
    return all(callable(getattr(cls, method, None)) for method in ("start", "next_text"))


def _is_rollout_class(cls: type) -> bool:
    return all(callable(getattr(cls, method, None)) for method in ("begin", "generate", "feed", "finish"))


def agent_from_object(name: str, target: Any, options: AgentOptions | None = None) -> EvalAgent:
    """The agent a scripted-agent class, a rollout-agent class or a function returning a rollout agent
    makes (see the module docstring)."""
    options = options or AgentOptions()
    _check_object(name, target)
    if isinstance(target, type) and _is_scripted(target):
        return EvalAgent(name, lambda seed: ScriptedRolloutAgent(target), seeded=False, decoding="scripted")
    try:
        accepted = set(inspect.signature(target).parameters) & set(_DECODING_KEYWORDS)
    except (TypeError, ValueError):  # a builtin without a signature: it takes none of them
        accepted = set()
    decoding = options.decoding
    values = {"greedy": decoding.greedy, "temperature": decoding.temperature, "top_p": decoding.top_p}

    def build(seed: int) -> RolloutAgent:
        keywords = {key: value for key, value in {**values, "seed": seed}.items() if key in accepted}
        agent = target(**keywords)
        if not isinstance(agent, RolloutAgent):
            raise TypeError(f"agent {name!r} made a {type(agent).__name__}, which lacks begin, generate, feed and finish")
        return agent

    seeded = "seed" in accepted and not decoding.greedy
    described = decoding.describe() if accepted & {"greedy", "temperature", "top_p"} else "its own"
    return EvalAgent(name, build, seeded=seeded, decoding=described)


def options_of_engine(engine: str, options: AgentOptions, **spec: Any) -> Any:
    """The options of ``engine`` for an agent: its options class with ``spec``'s fields (an endpoint's URL
    and model), the run's endpoint settings and ``options.engine_options[engine]`` over its defaults.

    Raises:
        ValueError: a field the class lacks, or a bad value (one line).
    """
    options_class = lookup_engine(engine).options
    fields = dict(spec)
    if engine == "endpoint":
        fields.update(api_key_env=options.api_key_env, timeout_s=options.timeout_s)
    fields.update(options.engine_options.get(engine, {}))
    known = {f.name for f in dataclasses.fields(options_class)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"engine {engine} has no option {', '.join(unknown)} (its options: {', '.join(sorted(known))})")
    return options_class(**fields)


def _load_engine(name: str, engine: str, model: str | None, options: AgentOptions,
                 spec: Mapping[str, Any] | None = None) -> EvalAgent:
    """An agent of the rollout engine ``engine`` (over ``model``, loaded as ``hf:MODEL`` is, when the engine
    needs a policy; ``spec``: options its spec gives), sampling as ``options.decoding`` says. The engine (and model) is built by the first
    ``build`` (a resumed run whose episodes are all done builds none) and kept until ``release``."""
    decoding = options.decoding
    entry = lookup_engine(engine)
    settings = options_of_engine(engine, options, **(spec or {}))
    built: list[RolloutEngine] = []

    def rollout_engine() -> RolloutEngine:
        if not built:
            policy = _load_policy(name, model, options) if model is not None else None
            setup = EngineSetup(policy, temperature=decoding.temperature, top_p=decoding.top_p, max_context=options.max_context)
            try:
                built.append(entry.build(settings, setup))
            except ValueError as exc:  # the engine's one-line errors (a setting it cannot use...)
                raise HarnessError(f"agent {name!r}: {exc}") from None
        return built[0]

    def build(seed: int) -> RolloutAgent:
        return rollout_engine().agent(greedy=decoding.greedy, seed=seed)

    def release() -> None:
        if built:
            built.pop().close()
            if model is not None:
                import torch

                if torch.cuda.is_available():
                    torch.cuda.empty_cache()

    return EvalAgent(name, build, seeded=not decoding.greedy, decoding=decoding.describe(), release=release)


def _load_policy(name: str, model: str, options: AgentOptions) -> Any:
    """The policy of ``model`` on ``options.device`` in ``options.dtype``."""
    import torch

    from agents.policies.loading import load_policy

    device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if options.dtype != "auto" and options.dtype not in dtypes:
        raise ValueError(f"dtype must be auto or one of {', '.join(dtypes)}, got {options.dtype!r}")
    dtype = dtypes.get(options.dtype, torch.bfloat16 if device.type == "cuda" else torch.float32)
    try:
        return load_policy(model, dtype=dtype).to(device)
    except ValueError as exc:  # load_policy's one-line errors (a tokenizer of another model...)
        raise HarnessError(f"agent {name!r}: {exc}") from None


def _load_baseline(name: str, baseline: str, llm: EvalAgent) -> EvalAgent:
    """The baseline ``baseline`` played by the LLM ``llm`` (its engine, decoding and seeds)."""

    def build(seed: int) -> RolloutAgent:
        return BaselineAgent(BASELINES[baseline](), RolloutTextGenerator(llm.build(seed)))

    return EvalAgent(name, build, seeded=llm.seeded, decoding=llm.decoding, release=llm.release,
                     unable=getattr(BASELINES[baseline](), "unable", _plays_every_question))

