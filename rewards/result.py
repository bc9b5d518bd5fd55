"""The value every reward preset returns: a total plus its named parts, for logs and ``info``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

__all__ = ["Component", "RewardResult"]

Component = Union[float, str, bool, None]


@dataclass
class RewardResult:
    """A scalar reward and the named components it was built from.

    ``components`` holds the parts a researcher wants to log next to the total: sub-scores
    (``"f1"``, ``"format"``), the extracted answer, and which format rule failed
    (``components["format_error"] = "think_count"``, or ``None`` when the format is fine).
    """

    total: float
    components: dict[str, Component] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.total = float(self.total)

    def __float__(self) -> float:
        return self.total
