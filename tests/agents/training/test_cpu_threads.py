"""The warm start's thread count comes from the cores other work leaves free."""
from __future__ import annotations

import os

import pytest

from agents.training import warm_start as warm_start_module
from agents.training.config import TrainConfig
from agents.training.cpu_threads import free_cpu_cores
from agents.training.warm_start import warm_start_threads


@pytest.mark.parametrize(("cores", "load", "free"), [
    (2, 1.0, 2),   # idle but for this process
    (2, 0.2, 2),   # the load never adds cores
    (2, 2.1, 1),   # another job busy on one core
    (2, 6.0, 1),   # at least one
    (16, 4.6, 12),  # 3.6 cores busy elsewhere: 12.4, rounded
])
def test_free_cores_are_the_cpu_set_less_the_load_of_others(monkeypatch, cores, load, free):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    assert free_cpu_cores() == free


def test_without_a_load_average_nothing_is_known_and_the_warm_start_takes_one_thread(monkeypatch):
    def no_load() -> tuple[float, float, float]:
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", no_load)
    assert free_cpu_cores() is None
    assert warm_start_threads(TrainConfig()) == 1


def test_a_set_thread_count_wins_over_the_free_cores(monkeypatch):
    monkeypatch.setattr(warm_start_module, "free_cpu_cores", lambda: 7)
    config = TrainConfig()
    assert config.warm_start.num_threads is None
    assert warm_start_threads(config) == 7
    assert warm_start_threads(config.updated({"warm_start.num_threads": 3})) == 3
