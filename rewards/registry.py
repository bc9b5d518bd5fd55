"""The preset registry and ``score``, the one entry point the environment and trainers call."""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

from .metrics import as_gold_list
from .name_registry import Registry, UnknownNameError
from .result import RewardResult

__all__ = ["UnknownNameError", "UnknownPresetError", "register", "available", "get", "value_range", "score"]

PresetFn = Callable[..., "RewardResult | float"]
_PRESETS: Registry[PresetFn] = Registry("reward preset")
_RANGES: dict[str, tuple[float, float]] = {}


#: The name this error had when only the preset registry raised it.
UnknownPresetError = UnknownNameError


def register(name: str, fn: PresetFn, *, replace: bool = False, value_range: tuple[float, float] | None = None) -> None:
    """Add a reward preset under ``name``.

    ``fn(response, golden_answers, *, question, ended_with_eos, evidence_model, judge, **options)``
    returns a :class:`RewardResult` or a plain number (wrapped with no components). Registering a
    name taken by another function raises ``ValueError`` unless ``replace=True``, so two plugins cannot silently clash.
    ``value_range`` is the (lowest, highest) total at the preset's default options, so that tables
    can say what a score is out of (R-Search's reward reaches 2.4, most others 1).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"preset name must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"preset {name!r} must be callable, got {type(fn).__name__}")
    if value_range is not None:
        low, high = (float(v) for v in value_range)
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise ValueError(f"preset {name!r}: value_range must be finite (low, high) with low <= high, got {value_range!r}")
    _PRESETS.add(name, fn, replace=replace)
    if value_range is None:
        _RANGES.pop(name, None)
    else:
        _RANGES[name] = (low, high)


def available() -> list[str]:
    """Names of every registered preset, sorted."""
    return sorted(_PRESETS)


def get(name: str) -> PresetFn:
    """The preset function registered as ``name``; :class:`UnknownNameError` lists the known names."""
    return _PRESETS.lookup(name)


def value_range(name: str) -> tuple[float, float] | None:
    """The (lowest, highest) total of preset ``name`` at its default options, or None when it was
    registered without one; :class:`UnknownNameError` for an unknown name."""
    get(name)
    return _RANGES.get(name)


def score(
    preset: str,
    response: str,
    golden_answers: str | Iterable[str],
    *,
    question: str | None = None,
    ended_with_eos: bool = True,
    evidence_model: Callable[[str, str], str] | None = None,
    judge: Callable[[str, list[str], str], float] | None = None,
    **options: Any,
) -> RewardResult:
    """Score one response with the named preset.

    ``response`` is the agent's text after the prompt, environment blocks included; ``golden_answers``
    one gold or several; ``ended_with_eos`` whether generation stopped on the EOS token (ReSearch
    scores 0 otherwise); ``evidence_model``/``judge`` the model callables R-Search and
    Reasoning-search use; ``options`` go to the preset (weights, EOS string …).
    """
    fn = _PRESETS.get(preset) or get(preset)  # get() raises, naming the known presets
    golds = as_gold_list(golden_answers)
    if options:
        result = fn(response, golds, question=question, ended_with_eos=ended_with_eos, evidence_model=evidence_model,
                    judge=judge, **options)
    else:  # spelled out: an empty **options still builds a keyword dict per call (the environment scores every episode)
        result = fn(response, golds, question=question, ended_with_eos=ended_with_eos, evidence_model=evidence_model,
                    judge=judge)
    return result if isinstance(result, RewardResult) else RewardResult(float(result), {})
