"""Rewards that change during training: presets switched by step, and (scheduled) weighted mixes.

Some seed systems change the reward as training goes on: R1-Searcher trains in two stages (first
rewarding well-formed retrieval, then answer F1), and Reasoning-search shifts weight from the format
and DAG terms to the judged answer. Every object here is a :class:`StepReward`, called as

    reward(response, golden_answers, *, step, question=..., evidence_model=..., judge=..., **options)

where ``step`` is the trainer's step (an int >= 0) and every other keyword goes on to
``rewards.score``. Each returns a ``RewardResult`` whose components say what applied at that step, so
the logs show when a stage switched or how the weights stood. Pieces nest: a stage can be a mix, a mix
term can be staged. A preset name (str) is accepted wherever a ``StepReward`` is.

Examples::

    StagedReward([(0, "r1-searcher-stage1"), (2000, "r1-searcher-stage2")])
    ComponentMix("reasoning-search", LinearSchedule([
        (0, {"format": 0.5, "dag_valid": 0.5, "judge": 0.0}),
        (1000, {"format": 0.1, "dag_valid": 0.2, "judge": 0.7}),
    ]))
    Preset("reasoning-search", schedule=LinearSchedule([
        (0, {"judge_weight": 0.0}), (1000, {"judge_weight": 0.5}),
    ]))
    RewardMix({"search-r1": 0.8, "search-r1-format": 0.2})

``ComponentMix`` re-weights the components a preset reports (any preset); ``Preset(schedule=...)``
moves the preset's own weight options, so its formula (e.g. Reasoning-search counting the judge
only when the DAG is valid) is kept.
"""
from __future__ import annotations

import bisect
import inspect
import math
import numbers
from abc import ABC, abstractmethod
from typing import Any, Iterable, Mapping, Sequence, Union

from rewards.registry import get as get_preset
from rewards.registry import score
from rewards.result import Component, RewardResult

__all__ = [
    "StepReward",
    "Preset",
    "StagedReward",
    "LinearSchedule",
    "ComponentMix",
    "RewardMix",
    "as_step_reward",
    "accepts_option",
]


class StepReward(ABC):
    """A reward that may depend on the training step; ``name`` labels it in components and logs."""

    name: str

    @abstractmethod
    def __call__(self, response: str, golden_answers: str | Iterable[str], *, step: int, **kwargs: Any) -> RewardResult:
        """Score one response at training step ``step``; ``kwargs`` go on to ``rewards.score``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


RewardLike = Union[str, StepReward]


class Preset(StepReward):
    """A registered preset with bound options, fixed or scheduled by step.

    ``Preset("r1-searcher-stage1", eos_string="<|im_end|>")`` binds preset options;
    ``Preset("reasoning-search", schedule=LinearSchedule([(0, {"judge_weight": 0.0}),
    (500, {"judge_weight": 0.5})]))`` moves numeric options with the step (the preset's own formula,
    gating included, stays in charge) and reports each as an ``option/<name>`` component. Options
    given at call time take precedence over both.
    """

    def __init__(self, name: str, *, schedule: LinearSchedule | None = None, **options: Any) -> None:
        get_preset(name)  # an unknown name fails here, listing the known ones, not at the first score
        self.name = name
        self.schedule = schedule
        self.options = options

    def __call__(self, response: str, golden_answers: str | Iterable[str], *, step: int, **kwargs: Any) -> RewardResult:
        _check_step(step)
        if self.schedule is None:
            return score(self.name, response, golden_answers, **{**self.options, **kwargs})
        scheduled = self.schedule(step)
        result = score(self.name, response, golden_answers, **{**self.options, **scheduled, **kwargs})
        components: dict[str, Component] = dict(result.components)
        components.update({f"option/{key}": kwargs.get(key, value) for key, value in scheduled.items()})
        return RewardResult(result.total, components)


def as_step_reward(reward: RewardLike) -> StepReward:
    """A ``StepReward`` for a preset name or a ``StepReward`` (returned as is)."""
    if isinstance(reward, StepReward):
        return reward
    if isinstance(reward, str):
        return Preset(reward)
    raise TypeError(f"expected a preset name or a StepReward, got {type(reward).__name__}")


class StagedReward(StepReward):
    """The reward of the stage the step falls in: ``[(0, a), (n, b)]`` scores with ``a`` for steps
    ``0..n-1`` and with ``b`` from step ``n`` on.

    Components: the stage reward's own, plus ``stage`` (0-based index) and ``stage_reward`` (its name).
    """

    def __init__(self, stages: Sequence[tuple[int, RewardLike]], *, name: str | None = None) -> None:
        if not stages:
            raise ValueError("StagedReward needs at least one (start_step, reward) stage")
        starts = [start for start, _ in stages]
        if starts[0] != 0:
            raise ValueError(f"the first stage must start at step 0, got {starts[0]}")
        if any(not isinstance(s, int) for s in starts) or any(b <= a for a, b in zip(starts, starts[1:])):
            raise ValueError(f"stage start steps must be strictly increasing ints, got {starts}")
        self.starts = starts
        self.stages = [as_step_reward(reward) for _, reward in stages]
        self.name = name or "staged(" + ", ".join(f"{s}: {r.name}" for s, r in zip(starts, self.stages)) + ")"

    def stage_at(self, step: int) -> int:
        """Index of the stage in force at ``step``."""
        _check_step(step)
        return bisect.bisect_right(self.starts, step) - 1

    def __call__(self, response: str, golden_answers: str | Iterable[str], *, step: int, **kwargs: Any) -> RewardResult:
        index = self.stage_at(step)
        stage = self.stages[index]
        result = stage(response, golden_answers, step=step, **kwargs)
        return RewardResult(result.total, {**result.components, "stage": index, "stage_reward": stage.name})


class LinearSchedule:
    """Named weights that move linearly from knot to knot and stay constant beyond the ends.

    ``LinearSchedule([(0, {"format": 1.0, "judge": 0.0}), (100, {"format": 0.0, "judge": 1.0})])(25)``
    is ``{"format": 0.75, "judge": 0.25}``. Every knot names the same weights.
    """

    def __init__(self, knots: Sequence[tuple[int, Mapping[str, float]]]) -> None:
        if not knots:
            raise ValueError("LinearSchedule needs at least one (step, weights) knot")
        steps = [step for step, _ in knots]
        if any(not isinstance(s, int) or s < 0 for s in steps) or any(b <= a for a, b in zip(steps, steps[1:])):
            raise ValueError(f"knot steps must be strictly increasing ints >= 0, got {steps}")
        keys = set(knots[0][1])
        for step, weights in knots:
            if set(weights) != keys:
                raise ValueError(f"knot at step {step} names {sorted(weights)}, the first knot names {sorted(keys)}")
            bad = {k: w for k, w in weights.items() if not math.isfinite(w)}
            if bad:
                raise ValueError(f"knot at step {step} has non-finite weights {bad}")
        self.steps = steps
        self.knots = [{k: float(w) for k, w in weights.items()} for _, weights in knots]

    @property
    def keys(self) -> list[str]:
        """The weight names, in the first knot's order."""
        return list(self.knots[0])

    def __call__(self, step: int) -> dict[str, float]:
        _check_step(step)
        right = bisect.bisect_right(self.steps, step)
        if right == 0:
            return dict(self.knots[0])
        if right == len(self.steps):
            return dict(self.knots[-1])
        left = right - 1
        frac = (step - self.steps[left]) / (self.steps[right] - self.steps[left])
        a, b = self.knots[left], self.knots[right]
        return {k: a[k] + frac * (b[k] - a[k]) for k in a}


Weights = Union[Mapping[str, float], LinearSchedule]


def _weights_at(weights: Weights, step: int) -> dict[str, float]:
    if isinstance(weights, LinearSchedule):
        return weights(step)
    _check_step(step)
    return {k: float(w) for k, w in weights.items()}


class ComponentMix(StepReward):
    """A weighted sum of one reward's numeric components, with constant or scheduled weights.

    The total is ``sum(w[k] * components[k])``; the wrapped reward's own total is ignored (it is kept
    as the ``base_total`` component). A bool component counts as 0/1 and a ``None`` one (a part the
    preset skipped, like the judge when the DAG is invalid) as 0. Components: the wrapped reward's,
    plus ``base_total`` and ``weight/<k>`` for each weight in force.
    """

    def __init__(self, reward: RewardLike, weights: Weights, *, name: str | None = None) -> None:
        keys = weights.keys if isinstance(weights, LinearSchedule) else list(weights)
        if not keys:
            raise ValueError("ComponentMix needs at least one weight")
        self.reward = as_step_reward(reward)
        self.weights = weights
        self.name = name or f"components({self.reward.name})"

    def __call__(self, response: str, golden_answers: str | Iterable[str], *, step: int, **kwargs: Any) -> RewardResult:
        weights = _weights_at(self.weights, step)
        result = self.reward(response, golden_answers, step=step, **kwargs)
        total = sum(w * _numeric(result.components, key, self.reward.name) for key, w in weights.items())
        components: dict[str, Component] = {**result.components, "base_total": result.total}
        components.update({f"weight/{key}": w for key, w in weights.items()})
        return RewardResult(total, components)


class RewardMix(StepReward):
    """A weighted sum of several rewards' totals, with constant or scheduled weights.

    Weights are keyed by label; a label names a preset unless ``terms`` maps it to another reward
    (``RewardMix({"em": 1.0, "fmt": 0.2}, {"em": "search-r1", "fmt": Preset("search-r1-format")})``).
    Components: ``<label>/total`` and ``<label>/<component>`` for each term, and ``weight/<label>``.
    """

    def __init__(self, weights: Weights, terms: Mapping[str, RewardLike] | None = None, *, name: str | None = None) -> None:
        labels = weights.keys if isinstance(weights, LinearSchedule) else list(weights)
        if not labels:
            raise ValueError("RewardMix needs at least one weighted reward")
        given = dict(terms or {})
        unused = sorted(set(given) - set(labels))
        if unused:
            raise ValueError(f"terms {unused} have no weight; weighted labels: {labels}")
        self.terms = {label: as_step_reward(given.get(label, label)) for label in labels}
        self.weights = weights
        self.name = name or "mix(" + ", ".join(labels) + ")"

    def __call__(self, response: str, golden_answers: str | Iterable[str], *, step: int, **kwargs: Any) -> RewardResult:
        weights = _weights_at(self.weights, step)
        total = 0.0
        components: dict[str, Component] = {}
        for label, reward in self.terms.items():
            result = reward(response, golden_answers, step=step, **kwargs)
            total += weights[label] * result.total
            components[f"{label}/total"] = result.total
            components.update({f"{label}/{key}": value for key, value in result.components.items()})
            components[f"weight/{label}"] = weights[label]
        return RewardResult(total, components)


def accepts_option(reward: RewardLike, option: str) -> bool:
    """Whether ``option`` may be passed when scoring with ``reward``: a preset whose function takes it
    (by name or ``**options``), a :class:`Preset` that does not bind it already, or a staged or mixed
    reward all of whose parts accept it. Lets a caller (the environment filling in its plan tools)
    pass an option only where it is understood, instead of failing at the first episode's end."""
    if isinstance(reward, str):
        parameters = inspect.signature(get_preset(reward)).parameters.values()
        return any(p.name == option or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    if isinstance(reward, Preset):
        return option not in reward.options and accepts_option(reward.name, option)
    if isinstance(reward, StagedReward):
        return all(accepts_option(stage, option) for stage in reward.stages)
    if isinstance(reward, ComponentMix):
        return accepts_option(reward.reward, option)
    if isinstance(reward, RewardMix):
        return all(accepts_option(term, option) for term in reward.terms.values())
    return False


def _numeric(components: Mapping[str, Component], key: str, reward_name: str) -> float:
    if key not in components:
        raise KeyError(f"reward {reward_name!r} has no component {key!r}; it has {sorted(components)}")
    value = components[key]
    if value is None:
        return 0.0
    if isinstance(value, numbers.Real):  # bool included: True counts 1
        return float(value)
    raise TypeError(f"component {key!r} of reward {reward_name!r} is {value!r}, not a number")


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
