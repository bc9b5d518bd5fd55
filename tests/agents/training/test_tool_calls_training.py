"""The tiny model trains under the tool-calls protocol end to end: the warm start's scripted
demonstrations write native tool calls (run by the environment, well formed by the tool-calls format
reward), GRPO rolls out and updates under the same protocol, and every logged number is finite."""
from __future__ import annotations

import math

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "jsonargparse", "matplotlib")

import rewards  # noqa: E402
from agents.training import warm_start as warm_start_module  # noqa: E402
from agents.training.build import build_trainer  # noqa: E402
from agents.training.callbacks import Callback  # noqa: E402
from tests.agents.training.tiny import records, small_config  # noqa: E402

#: A warm start of two steps on four demonstrations (2-hop ones: two calls of about 54 built-in tokens each, and
#: the answer, within max_new_tokens); the tiny run's 2 steps of 2 questions x 2 samples.
TOOL_CALLS = {"env.protocol": "tool-calls", "env.max_new_tokens": 160, "warm_start.steps": 2, "warm_start.copy_steps": 0, "warm_start.examples": 4,
              "warm_start.batch_size": 2, "warm_start.second_hop_rate": 1.0, "eval.questions": 1}


class Rollouts(Callback):
    def __init__(self) -> None:
        self.trajectories = []

    def on_rollout(self, trainer, trajectories) -> None:
        self.trajectories.extend(trajectories)


def test_the_tiny_model_warm_starts_and_trains_under_tool_calls(tmp_path, monkeypatch) -> None:
    demonstrated = []

    def recording(*args, **kwargs):
        demos = warm_start_module.make_demonstrations.__wrapped__(*args, **kwargs)
        demonstrated.extend(demos.trajectories)
        return demos

    recording.__wrapped__ = warm_start_module.make_demonstrations
    monkeypatch.setattr(warm_start_module, "make_demonstrations", recording)
    rollouts = Rollouts()
    trainer = build_trainer(small_config("grpo", tmp_path, TOOL_CALLS), callbacks=[rollouts])
    try:
        result = trainer.train()
    finally:
        trainer.close_environments()

    assert result.steps_run == 2 and result.step == 2
    assert len(demonstrated) == 4
    for trajectory in demonstrated:
        assert trajectory.protocol == "tool-calls" and trajectory.tool_calls
        assert all(call.kind == "tool" and not call.error for call in trajectory.tool_calls)
        assert trajectory.counters["searches"] == len(trajectory.tool_calls) and trajectory.counters["invalid_calls"] == 0
        assert trajectory.end_reason == "answer"
        assert rewards.score("tool-calls-format", trajectory.response_text, trajectory.golden_answers).components["format_valid"]
    assert len(rollouts.trajectories) == 8 and {t.protocol for t in rollouts.trajectories} == {"tool-calls"}

    logged = records(result.metrics_path)
    warm = [r for r in logged if "warm_start/loss_last" in r]
    assert len(warm) == 1 and warm[0]["warm_start/demonstrations"] == 4
    assert [r["step"] for r in logged if "loss/total" in r] == [1, 2]
    numbers = [v for r in logged for v in r.values() if isinstance(v, float)]
    assert numbers and all(math.isfinite(v) for v in numbers)
