"""Layouts that cannot run are refused in one line when the run's config is checked, before any model loads
(:mod:`agents.training.layout_checks`): ``rollout.max_staleness`` and the vLLM server engine on several ranks,
as the launcher's ``WORLD_SIZE`` gives them."""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch")

from agents.training.config import TrainConfig  # noqa: E402

VLLM_AHEAD = {"rollout.engine": "vllm", "rollout.max_staleness": 1}


def test_max_staleness_on_several_ranks_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for backend in ("fsdp", "deepspeed"):
        with pytest.raises(ValueError, match=r"^rollout.max_staleness 1 runs on one process; this launch has 2 ranks [^\n]*$"):
            TrainConfig("grpo").updated({**VLLM_AHEAD, "run.backend": backend})


def test_the_server_engine_on_several_ranks_is_refused_in_one_line(monkeypatch):
    server = {"rollout.engine": "vllm-server", "run.backend": "deepspeed"}
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"^rollout.engine vllm-server serves one trainer process; this launch has 2 ranks[^\n]*$"):
        TrainConfig("grpo").updated(server)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert TrainConfig("grpo").updated({"rollout.engine": "vllm-server"}).rollout.engine == "vllm-server"


def test_the_layouts_that_run_pass(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert TrainConfig("grpo").updated(VLLM_AHEAD).rollout.max_staleness == 1  # one process: a rollout ahead
    monkeypatch.setenv("WORLD_SIZE", "2")
    colocated = {"rollout.engine": "vllm", "run.backend": "deepspeed"}  # an engine per rank, no rollout ahead
    for changes in ({**colocated, "run.backend": "fsdp"}, colocated, {**colocated, "backend.zero_stage": 3}):
        assert TrainConfig("grpo").updated(changes).rollout.engine == "vllm"
    # the engine's own refusal comes first, whatever the ranks
    with pytest.raises(ValueError, match=r"^rollout.max_staleness 1 needs an engine with its own copy"):
        TrainConfig("grpo").updated({"rollout.max_staleness": 1})
