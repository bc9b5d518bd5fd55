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

    assert "-n auto --dist loadfile" in " ".join(request.config.getini("addopts"))
    for cores, workers in ((range(16), 2), (range(2), 2), (range(1), 1)):
        monkeypatch.setattr("os.sched_getaffinity", lambda pid, cores=cores: set(cores), raising=False)
        assert pytest_xdist_auto_num_workers(request.config) == workers

