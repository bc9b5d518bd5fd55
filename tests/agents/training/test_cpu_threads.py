"""The warm start's thread count follows the cores other work leaves free."""
from __future__ import annotations

import os

import pytest
import torch

from agents.training import cpu_threads
from agents.training.cpu_threads import FollowFreeCores, free_cpu_cores


@pytest.mark.parametrize(("cores", "load", "own", "free"), [
    (2, 1.0, 1, 2),   # idle but for this process
    (2, 0.2, 1, 2),   # the load never adds cores
    (2, 2.1, 1, 1),   # another job busy on one core
    (2, 6.0, 1, 1),   # at least one
    (16, 4.6, 1, 12),  # 3.6 cores busy elsewhere: 12.4, rounded
    (2, 2.0, 2, 2),   # this process's two threads are the whole load
    (2, 3.0, 2, 1),   # one more job beside them
])
def test_free_cores_are_the_cpu_set_less_the_load_of_others(monkeypatch, cores, load, own, free):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    assert free_cpu_cores(own_threads=own) == free


def test_without_a_load_average_nothing_is_known_and_a_phase_takes_one_thread(monkeypatch):
    def no_load() -> tuple[float, float, float]:
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", no_load)
    assert free_cpu_cores() is None
    before = torch.get_num_threads()
    try:
        follower = FollowFreeCores(every_s=0.0)
        follower.follow()
        assert follower.threads == torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_thread_count_follows_the_free_cores_and_logs_their_time_weighted_mean(monkeypatch):
    """Free cores 2, then 1 (another job came) after one second, then looked at 3 seconds later: threads
    2 for 1 s and 1 for 3 s, a mean of (2 x 1 + 1 x 3) / 4 = 1.25."""
    clock = iter([0.0, 1.0, 4.0])  # start; the look at 1 s; the mean at 4 s
    free = iter([2, 1])
    own_seen: list[int] = []

    def fake_free(own_threads: int = 1) -> int:
        own_seen.append(own_threads)
        return next(free)

    monkeypatch.setattr(cpu_threads.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(cpu_threads, "free_cpu_cores", fake_free)
    before = torch.get_num_threads()
    try:
        follower = FollowFreeCores(every_s=0.5)
        assert follower.threads == torch.get_num_threads() == 2
        follower.follow()
        assert follower.threads == torch.get_num_threads() == 1
        assert own_seen == [1, 2]  # the second look counts this process's own two threads in the load
        assert follower.mean_threads() == pytest.approx(1.25)
    finally:
        torch.set_num_threads(before)


def test_a_look_before_every_s_has_passed_changes_nothing(monkeypatch):
    clock = iter([0.0, 0.2])
    monkeypatch.setattr(cpu_threads.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(cpu_threads, "free_cpu_cores", lambda own_threads=1: 2 if own_threads == 1 else 1)
    before = torch.get_num_threads()
    try:
        follower = FollowFreeCores(every_s=1.0)
        follower.follow()
        assert follower.threads == 2
    finally:
        torch.set_num_threads(before)
