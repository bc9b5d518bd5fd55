"""Wrappers (one per file): the whole context, or a fixed window for classic RL libraries; macro actions,
a choice among a few candidate calls per turn, for classic RL libraries' small policies."""
from search_env.wrappers.fixed_window import FixedWindowObservation
from search_env.wrappers.full_context import FullContextObservation
from search_env.wrappers.macro_actions import MacroActions

__all__ = ["FixedWindowObservation", "FullContextObservation", "MacroActions"]
