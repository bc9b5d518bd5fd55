"""The suite's own settings: a hang fails instead of blocking CI, and slow tests get a longer limit."""
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
