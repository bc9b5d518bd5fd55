"""Imported by a test run (``python -m agents.train --import tests.agents.training.stall_rank``): rank 1 stops
answering at the start of its second step (it sleeps ten minutes), as a hung or stopped rank does."""
from __future__ import annotations

import os
import time

from agents.training.trainer import Trainer

#: How long the stalled rank sleeps: far beyond the test's collective timeout.
STALL_S = 600.0

if os.environ.get("RANK") == "1":
    _step = Trainer.train_step

    def _stalls_at_step_2(self: Trainer) -> dict[str, float]:
        if self.step == 1:
            time.sleep(STALL_S)
        return _step(self)

    Trainer.train_step = _stalls_at_step_2  # type: ignore[method-assign]
