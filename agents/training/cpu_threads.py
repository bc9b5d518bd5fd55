"""How many torch threads a CPU phase of a run takes: the cores that other work leaves free.

On a shared machine the fixed choice is the wrong one either way: a second thread on a core another job
keeps busy made each matrix product several times slower than one thread (``benchmarks/RESULTS.md``),
while on an idle machine it makes the warm start faster. The load average says how many cores others keep
busy; where the platform does not report one, a phase takes one thread, whose cost on a busy host is bounded.
Other jobs come and go during a phase of minutes, so :class:`FollowFreeCores` looks again as it runs.
"""
from __future__ import annotations

import os
import time

import torch

__all__ = ["FollowFreeCores", "free_cpu_cores"]


def free_cpu_cores(own_threads: int = 1) -> int | None:
    """Cores of this process's CPU set that other work leaves free, at least 1: the set's size less the
    one-minute load average beyond ``own_threads``, this process's own busy threads (counted in the load:
    its main thread while it prepares a phase, its torch threads while it computes), rounded; ``None`` where
    the platform reports no load average."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    others = max(0.0, load - own_threads)
    return max(1, min(cores, round(cores - others)))


class FollowFreeCores:
    """Torch's thread count kept at the free cores (:func:`free_cpu_cores`) through a phase: set when it
    begins (1 where the load is not known), looked at again every ``every_s`` seconds of it (the load
    average moves over about a minute, so a few looks a minute follow it), and the time-weighted mean kept
    for the run's log. Results do not depend on the count (the phase's numbers are the same on one thread
    as on two, with MKL's strict reproducibility, which importing :mod:`agents` turns on); its minutes do."""

    def __init__(self, every_s: float = 15.0) -> None:
        self.every_s = every_s
        self.threads = free_cpu_cores() or 1
        torch.set_num_threads(self.threads)
        self._since = self._looked = time.perf_counter()
        self._thread_seconds = self._seconds = 0.0

    def follow(self) -> None:
        """Look at the free cores again if ``every_s`` has passed since the last look, and take them."""
        now = time.perf_counter()
        if now - self._looked < self.every_s:
            return
        self._looked = now
        free = free_cpu_cores(own_threads=self.threads)
        if free is not None and free != self.threads:
            self._account(now)
            self.threads = free
            torch.set_num_threads(free)

    def mean_threads(self) -> float:
        """The thread count over the phase so far, weighted by time."""
        self._account(time.perf_counter())
        return self._thread_seconds / self._seconds if self._seconds > 0 else float(self.threads)

    def _account(self, now: float) -> None:
        self._thread_seconds += self.threads * (now - self._since)
        self._seconds += now - self._since
        self._since = now
