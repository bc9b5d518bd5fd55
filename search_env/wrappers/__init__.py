"""Observation wrappers (one per file): the whole context, or a fixed window for classic RL libraries."""
from search_env.wrappers.fixed_window import FixedWindowObservation
from search_env.wrappers.full_context import FullContextObservation

__all__ = ["FixedWindowObservation", "FullContextObservation"]
