"""The suite's own settings: a hang fails instead of blocking CI, slow tests get a longer limit, and the
tests run in at most two workers."""
from __future__ import annotations

import pytest

from tests.conftest import SLOW_TIMEOUT_S, skip_without


def test_every_test_has_a_time_limit(request: pytest.FixtureRequest) -> None:
    skip_without("test", "pytest_timeout")
    assert request.config.pluginmanager.hasplugin("timeout")
    assert 0 < float(request.config.getini("timeout")) < SLOW_TIMEOUT_S


@pytest.mark.slow
def test_a_slow_test_gets_the_longer_limit(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("timeout").args == (SLOW_TIMEOUT_S,)


@pytest.mark.slow
@pytest.mark.timeout(2000)
def test_a_test_can_set_its_own_limit(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("timeout").args == (2000,)


def test_the_suite_runs_in_at_most_two_workers_each_taking_whole_files(request: pytest.FixtureRequest,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import pytest_xdist_auto_num_workers

    assert "-n auto --dist loadfile --no-loadscope-reorder" in " ".join(request.config.getini("addopts"))
    for cores, workers in ((range(16), 2), (range(2), 2), (range(1), 1)):
        monkeypatch.setattr("os.sched_getaffinity", lambda pid, cores=cores: set(cores), raising=False)
        assert pytest_xdist_auto_num_workers(request.config) == workers


class _Item:
    def __init__(self, nodeid: str, slow: bool = False) -> None:
        self.nodeid, self._slow = nodeid, slow

    def get_closest_marker(self, name: str):
        return object() if name == "slow" and self._slow else None


def test_modules_with_a_slow_test_go_first_whole_and_in_order() -> None:
    from tests.conftest import slow_modules_first

    fast_a, fast_b = _Item("tests/a.py::t"), _Item("tests/b.py::t")
    slow_c, c_fast = _Item("tests/c.py::t1", slow=True), _Item("tests/c.py::t2")  # t2 moves with its module
    slow_d = _Item("tests/d.py::t", slow=True)
    assert slow_modules_first([fast_a, c_fast, fast_b, slow_c, slow_d]) == [c_fast, slow_c, slow_d, fast_a, fast_b]
