"""Layouts that cannot run are refused in one line when the run's config is checked, before any model loads
(:mod:`agents.training.layout_checks`), as the launcher's ``WORLD_SIZE`` gives the ranks: ``rollout.max_staleness``
on several ranks with the colocated engine, and launched servers when the ranks span machines."""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch")

from agents.training.config import TrainConfig  # noqa: E402

VLLM_AHEAD = {"rollout.engine": "vllm", "rollout.max_staleness": 1}
SERVER_AHEAD = {"rollout.engine": "vllm-server", "rollout.max_staleness": 1}


def test_max_staleness_on_several_ranks_with_the_colocated_engine_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for backend in ("fsdp", "deepspeed"):
        with pytest.raises(ValueError, match=r"^rollout.max_staleness 1 on 2 ranks needs rollout.engine vllm-server [^\n]*$"):
            TrainConfig("grpo").updated({**VLLM_AHEAD, "run.backend": backend})


def test_launched_servers_with_ranks_on_several_machines_are_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    server = {"rollout.engine": "vllm-server", "run.backend": "deepspeed"}
    with pytest.raises(ValueError, match=r"^rollout.engine vllm-server launches its servers on rank 0's machine[^\n]*$"):
        TrainConfig("grpo").updated(server)
    urls = TrainConfig("grpo").updated({**server, "engine.urls": ["http://10.0.0.9:8000"]})
    assert urls.engine.urls == ["http://10.0.0.9:8000"]


def test_the_layouts_that_run_pass(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert TrainConfig("grpo").updated(VLLM_AHEAD).rollout.max_staleness == 1  # one process: a rollout ahead
    assert TrainConfig("grpo").updated({**VLLM_AHEAD, "rollout.max_staleness": 2}).rollout.max_staleness == 2
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    colocated = {"rollout.engine": "vllm", "run.backend": "deepspeed"}  # an engine per rank, no rollout ahead
    for changes in ({**colocated, "run.backend": "fsdp"}, colocated, {**colocated, "backend.zero_stage": 3}):
        assert TrainConfig("grpo").updated(changes).rollout.engine == "vllm"
    # servers for every rank, synchronous or steps ahead, on any data-parallel backend
    for backend in ({"run.backend": "fsdp"}, {"run.backend": "deepspeed", "backend.zero_stage": 3}):
        assert TrainConfig("grpo").updated({"rollout.engine": "vllm-server", **backend}).rollout.engine == "vllm-server"
        for ahead in (1, 2):
            config = TrainConfig("grpo").updated({**SERVER_AHEAD, **backend, "rollout.max_staleness": ahead})
            assert config.rollout.max_staleness == ahead
    # the engine's own refusal comes first, whatever the ranks
    with pytest.raises(ValueError, match=r"^rollout.max_staleness 1 needs an engine with its own copy"):
        TrainConfig("grpo").updated({"rollout.max_staleness": 1})
