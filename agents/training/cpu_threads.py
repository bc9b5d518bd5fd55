"""How many torch threads a CPU phase of a run takes: the cores that are free when it begins.

On a shared machine the fixed choice is the wrong one either way: a second thread on a core another job
keeps busy made each matrix product several times slower than one thread (``benchmarks/RESULTS.md``),
while on an idle machine it makes the warm start faster. The load average says how many cores others keep
busy; where the platform does not report one, a phase takes one thread, whose cost on a busy host is bounded.
"""
from __future__ import annotations

import os

__all__ = ["free_cpu_cores"]


def free_cpu_cores() -> int | None:
    """Cores of this process's CPU set that other work leaves free, at least 1: the set's size less the
    one-minute load average beyond this process's own running thread (counted in the load while it
    prepared the phase), rounded; ``None`` where the platform reports no load average."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    others = max(0.0, load - 1.0)
    return max(1, min(cores, round(cores - others)))
