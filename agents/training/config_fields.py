"""What the run config's groups share: the metadata that declares a setting free to change on resume, and
the one-line checks of numeric fields. Every group module (:mod:`agents.training.config`,
:mod:`agents.training.task_config`) builds its fields with these, so a bad value reads the same everywhere."""
from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any, Mapping

__all__ = ["RESUME_FREE", "check_finite", "check_positive"]

#: The metadata of a setting a resume may change without being told (``run.allow_changes``): it changes how
#: a run is watched, paced or stored, never what a step computes. Any group's class, an algorithm's too,
#: declares its own (:func:`agents.training.resume.free_settings` collects them).
RESUME_FREE: Mapping[str, Any] = MappingProxyType({"resume_free": True})


def check_finite(group: str, obj: Any, *names: str) -> None:
    """One-line errors for fields of ``obj`` that are NaN or infinite (a rate or limit of ``inf`` or
    ``nan`` from a recipe would corrupt every update without an error)."""
    for name in names:
        value = getattr(obj, name)
        if not math.isfinite(value):
            raise ValueError(f"{group}.{name} must be a finite number, got {value}")


def check_positive(group: str, obj: Any, *names: str, zero_ok: bool = False) -> None:
    """One-line errors for fields of ``obj`` that must be >= 1 (or >= 0 with ``zero_ok``)."""
    low = 0 if zero_ok else 1
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < low:
            raise ValueError(f"{group}.{name} must be >= {low}, got {value}")
