"""A user's own algorithm, registered when this module is imported: the benchmark's ``--import`` test names
it. REINFORCE++ under another name, so it trains as a real algorithm does."""
from __future__ import annotations

from agents.learners import ReinforcePP, ReinforcePPConfig, register_algorithm


@register_algorithm
class TinyPG(ReinforcePP):
    """REINFORCE++ registered as ``tiny-pg``."""

    name = "tiny-pg"
    config_class = ReinforcePPConfig
