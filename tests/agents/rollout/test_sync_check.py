"""Checked weight syncs (:mod:`agents.rollout.sync_check`): the gap of hand-made log-probs, the error, warn and
off modes, the probe, and the trainer's side with an engine that keeps its own copy of the tiny policy (a
correct sync logs a gap near 0; a sync that does nothing stops a short run with one line). The vLLM
engines' checks are in ``test_vllm_sync_check.py`` (their own virtualenv)."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import pytest

from agents.rollout.engine_weights import EngineWithWeights
from agents.rollout.sync_check import (
    BF16_TOLERANCE, FP32_TOLERANCE, StaleEngineError, SyncCheck, default_tolerance, make_probe, sync_gap,
)

PROBE = [[5, 6, 7], [8, 9]]


class ScoredEngine:
    """Returns fixed log-probs and counts its syncs and its calls."""

    def __init__(self, rows):
        self.rows, self.syncs, self.calls = rows, 0, 0

    def logprobs(self, sequences):
        self.calls += 1
        assert len(sequences) == 1  # one sequence per request (see SyncCheck.__call__)
        return [self.rows[PROBE.index(list(sequences[0]))]]


TRAINER = [[0.0, -1.0, -2.5], [0.0, -0.25]]


def test_the_gap_is_the_largest_absolute_difference_past_each_rows_first_entry():
    engine = [[3.0, -1.125, -2.5], [-9.0, -0.5]]  # first entries have no log-prob: ignored
    assert sync_gap(engine, TRAINER) == pytest.approx(0.25)
    assert sync_gap(TRAINER, TRAINER) == 0.0
    assert sync_gap([[0.0, -1.0, -2.0], [0.0, -0.25]], TRAINER) == pytest.approx(0.5)
    assert sync_gap([[0.0, float("nan"), -2.5], [0.0, -0.25]], TRAINER) == math.inf
    with pytest.raises(ValueError, match="probe sequence 1: the engine scored 3 tokens, the trainer 2"):
        sync_gap([[0.0, -1.0, -2.5], [0.0, -0.25, -1.0]], TRAINER)
    with pytest.raises(ValueError, match="the engine scored 1 probe sequences, the trainer 2"):
        sync_gap([[0.0, -1.0, -2.5]], TRAINER)


def _check(mode, said=None, **kwargs):
    return SyncCheck(PROBE, lambda sequences: TRAINER, engine_name="vllm", mode=mode, tolerance=0.1,
                     say=(said.append if said is not None else print), **kwargs)


def test_error_mode_stops_with_one_line_naming_the_engine_the_sync_and_the_gap():
    check = _check("error")
    assert check(ScoredEngine([[0.0, -1.05, -2.5], [0.0, -0.25]]), 1) == pytest.approx(0.05)  # within tolerance
    with pytest.raises(StaleEngineError) as caught:
        check(ScoredEngine([[0.0, -1.0, -2.5], [0.0, -0.95]]), 2)
    message = str(caught.value)
    assert "\n" not in message and "engine vllm" in message and "sync 2" in message and "0.7" in message
    assert "tolerance 0.1" in message
    assert [sync for sync, _ in check.gaps] == [1, 2]

    class Failed(RuntimeError):
        pass

    with pytest.raises(Failed, match="sync 3"):
        _check("error", error=Failed)(ScoredEngine([[0.0, -2.0, -2.5], [0.0, -0.25]]), 3)


def test_warn_mode_says_one_line_and_goes_on_and_off_mode_scores_nothing():
    said: list[str] = []
    check = _check("warn", said)
    assert check(ScoredEngine([[0.0, -1.0, -2.5], [0.0, -0.95]]), 4) == pytest.approx(0.7)
    assert len(said) == 1 and said[0].startswith("warning: weight sync check: engine vllm, sync 4") and "\n" not in said[0]
    assert check(ScoredEngine(TRAINER), 5) == 0.0 and len(said) == 1  # a good sync says nothing
    engine = ScoredEngine([[0.0, -9.0, -2.5], [0.0, -0.25]])
    engine.syncs = 1
    off = _check("off", said)
    assert off(engine, 1) is None and off.follow(engine) is None and engine.calls == 0 and off.take_metrics() == {}


def test_follow_checks_once_per_sync_and_the_metric_is_the_largest_gap_since_it_was_taken():
    check = _check("error")
    engine = ScoredEngine([[0.0, -1.0, -2.5], [0.0, -0.2]])
    assert check.follow(engine) is None and engine.calls == 0  # no sync yet
    engine.syncs = 1
    assert check.follow(engine) == pytest.approx(0.05) and check.follow(engine) is None and engine.calls == len(PROBE)
    engine.rows = [[0.0, -1.0, -2.5], [0.0, -0.17]]
    engine.syncs = 2
    check.follow(engine)
    assert check.take_metrics() == {"rollout/sync_gap": pytest.approx(0.08)}
    assert check.take_metrics() == {}


def test_a_gap_is_reported_with_the_step_its_rollout_was_for_however_the_threads_ran():
    check = _check("error")
    engine = ScoredEngine([[0.0, -1.0, -2.5], [0.0, -0.2]])
    engine.syncs = 1
    check.follow(engine, step=3)  # step 3's rollout, synced before step 2's metrics are taken
    assert check.take_metrics(2) == {}
    engine.rows, engine.syncs = [[0.0, -1.0, -2.5], [0.0, -0.17]], 2
    check.follow(engine)  # a check for no step (before an evaluation) goes with the next step's metrics
    assert check.take_metrics(3) == {"rollout/sync_gap": pytest.approx(0.08)}
    engine.syncs = 3
    check.follow(engine, step=5)
    assert check.take_metrics(4) == {} and check.take_metrics(5) == {"rollout/sync_gap": pytest.approx(0.08)}


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ValueError, match="rollout.sync_check must be one of error, warn, off, got 'loud'"):
        SyncCheck(PROBE, lambda s: TRAINER, engine_name="vllm", mode="loud")
    with pytest.raises(ValueError, match="tolerance must be > 0"):
        SyncCheck(PROBE, lambda s: TRAINER, engine_name="vllm", tolerance=0.0)


def test_tolerances_are_tighter_in_float32():
    assert default_tolerance("float32", "torch.float32") == FP32_TOLERANCE
    assert default_tolerance("float32", "fp32") == FP32_TOLERANCE
    for engine, trainer in (("bfloat16", "torch.float32"), ("float32", "torch.bfloat16"), ("auto", "torch.float32")):
        assert default_tolerance(engine, trainer) == BF16_TOLERANCE
    assert 4e-4 * 10 < FP32_TOLERANCE < BF16_TOLERANCE < 0.7 / 2  # above correct syncs measured, below a broken one


def test_the_probe_is_seeded_windows_of_distinct_prompts():
    prompts = [list(range(100 * i, 100 * i + 50)) for i in range(5)] + [[7]]
    probe = make_probe(prompts, seed=3, count=3, length=8)
    assert probe == make_probe(prompts, seed=3, count=3, length=8) != make_probe(prompts, seed=4, count=3, length=8)
    assert len(probe) == 3 and all(len(s) == 8 for s in probe)
    assert len({s[0] // 100 for s in probe}) == 3  # three prompts
    assert all(s == list(range(s[0], s[0] + 8)) for s in probe)  # consecutive ids of one prompt
    assert make_probe([[1, 2, 3]], seed=0, count=2, length=8) == [[1, 2, 3], [1, 2, 3]]  # short: whole, repeated
    with pytest.raises(ValueError, match="at least two tokens"):
        make_probe([[1]], seed=0)
    with pytest.raises(ValueError, match="count >= 1 and length >= 2"):
        make_probe(prompts, seed=0, length=1)


# -- the trainer's side ----------------------------------------------------------------------------------------
@dataclass
class CopyEngineOptions:
    """``broken``: its syncs count but load nothing (the silent failure the check exists for)."""

    broken: bool = False


class CopyEngine(EngineWithWeights):
    """A rollout engine with its own copy of the policy, synced after optimiser steps like the vLLM engines,
    sampling with the HF sampler on that copy: the trainer's side of the check without vLLM."""

    logprobs_are_trainers = False
    decodes_trained_policy = False
    needs_policy = True
    reuse_logprobs = False
    built: list["CopyEngine"] = []

    def __init__(self, policy, broken: bool, temperature: float) -> None:
        self.trained, self.copy, self.broken, self.temperature = policy, copy.deepcopy(policy), broken, temperature
        self.syncs, self.stale, self.closed, self.dtype, self.lora = 0, False, 0, "float32", False
        CopyEngine.built.append(self)

    @classmethod
    def build(cls, options, setup):
        return cls(setup.policy, options.broken, setup.temperature)

    def attach(self, backend):
        self.stale = True
        backend.add_post_step_hook(lambda: setattr(self, "stale", True))
        return self

    def sync(self, weights=None) -> None:
        assert weights is None, "these runs are synchronous: no snapshot is ever sent"
        if not self.broken:
            self.copy.load_state_dict(self.trained.state_dict())
        self.syncs += 1
        self.stale = False

    def wake_up(self) -> None:
        if self.stale:
            self.sync()

    def sleep(self) -> None:
        pass

    def agent(self, *, greedy: bool, seed: int, first_row: int = 0):
        from agents.rollout.hf_sampler import HFSampler

        self.wake_up()
        return HFSampler(self.copy, temperature=self.temperature, greedy=greedy, seed=seed, first_row=first_row)

    def logprobs(self, sequences):
        from agents.rollout.sync_check import policy_logprobs

        self.wake_up()
        self.copy.eval()
        return policy_logprobs(self.copy, sequences)

    def close(self) -> None:
        self.closed += 1


def _train(tmp_path, changes):
    pytest.importorskip("transformers")
    from agents.rollout.engines import register_engine
    from agents.training.build import build_trainer
    from agents.training.callbacks import Callback
    from tests.agents.training.tiny import small_config

    register_engine("copy-test", CopyEngine, options=CopyEngineOptions)
    metrics: list[dict] = []

    class Keep(Callback):
        def on_update(self, trainer, step_metrics):
            metrics.append(dict(step_metrics))

    config = small_config("grpo", tmp_path, {"rollout.engine": "copy-test", "eval.questions": 0, **changes})
    trainer = build_trainer(config, callbacks=[Keep()])
    try:
        return trainer, trainer.train(), metrics
    finally:
        trainer.close_environments()
        trainer.close_environments()


def test_a_correct_sync_logs_a_gap_near_zero_every_step_and_the_engine_is_closed_once(tmp_path):
    trainer, result, metrics = _train(tmp_path, {"run.steps": 2})
    assert result.step == 2 and trainer.rollout_driver.sync_check is not None
    assert trainer.rollout_driver.sync_check.tolerance == FP32_TOLERANCE
    assert [sync for sync, _ in trainer.rollout_driver.sync_check.gaps] == [1, 2]
    assert all(m["rollout/sync_gap"] < 1e-5 for m in metrics) and len(metrics) == 2
    assert trainer.engine.closed == 1


def test_a_sync_that_loads_nothing_stops_the_run_with_one_line(tmp_path):
    from agents.training.health import TrainingFailed

    with pytest.raises(TrainingFailed) as caught:
        _train(tmp_path, {"run.steps": 3, "engine.broken": True, "optim.learning_rate": 0.05})
    message = str(caught.value)
    assert "\n" not in message and message.startswith("weight sync check: engine copy-test, sync 2:"), message
    assert CopyEngine.built[-1].closed == 1


def test_warn_mode_goes_on_and_off_mode_builds_no_check(tmp_path, capsys):
    trainer, result, metrics = _train(tmp_path, {"run.steps": 2, "engine.broken": True, "optim.learning_rate": 0.05,
                                                 "rollout.sync_check": "warn"})
    assert result.step == 2 and metrics[1]["rollout/sync_gap"] > FP32_TOLERANCE
    warnings = [line for line in capsys.readouterr().err.splitlines() if "weight sync check" in line]
    assert len(warnings) == 1 and "sync 2" in warnings[0]
    trainer, result, metrics = _train(tmp_path / "off", {"run.steps": 1, "rollout.sync_check": "off"})
    assert trainer.rollout_driver.sync_check is None and "rollout/sync_gap" not in metrics[0]


def test_the_hf_engine_is_not_checked_and_bad_settings_are_refused(tmp_path):
    pytest.importorskip("transformers")
    from agents.training.build import build_trainer
    from agents.training.config import RolloutConfig
    from tests.agents.training.tiny import small_config

    trainer = build_trainer(small_config("grpo", tmp_path, {"eval.questions": 0}))
    try:
        assert trainer.rollout_driver.sync_check is None  # decodes the trained policy itself: no second copy to go stale
    finally:
        trainer.close_environments()
    with pytest.raises(ValueError, match="rollout.sync_check must be error, warn or off, got 'loud'"):
        RolloutConfig(sync_check="loud")
    with pytest.raises(ValueError, match="rollout.sync_tolerance must be >= 0"):
        RolloutConfig(sync_tolerance=-1.0)
