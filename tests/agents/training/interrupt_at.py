"""Imported into ``python -m agents.train`` by ``--import tests.agents.training.interrupt_at``: the process sends
itself a real SIGINT (as a terminal's Ctrl-C would) at the point ``$SEARCHQA_TEST_SIGINT_AT`` names:

* ``load``: once the policy's model has loaded, before the trainer is built;
* ``step``: as the first training step starts (it finishes; the run stops after it).
"""
from __future__ import annotations

import os
import signal

import agents.training.build as build
from agents.training.trainer import Trainer

POINT = os.environ.get("SEARCHQA_TEST_SIGINT_AT", "")

if POINT == "load":
    _load_policy = build.load_policy

    def _load_then_interrupt(*args, **kwargs):
        policy = _load_policy(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)
        return policy

    build.load_policy = _load_then_interrupt
elif POINT == "step":
    _train_step = Trainer.train_step

    def _interrupted_step(self):
        if self.step == 0:
            signal.raise_signal(signal.SIGINT)
        return _train_step(self)

    Trainer.train_step = _interrupted_step
elif POINT:
    raise ValueError(f"SEARCHQA_TEST_SIGINT_AT must be load or step, got {POINT!r}")
