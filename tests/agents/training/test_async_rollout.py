"""Asynchronous, off-policy steps (``rollout.max_staleness`` 1 and K >= 2, :mod:`agents.training.async_rollout`),
on the tiny model with an engine that keeps its own copy of the weights: the HF sampler over a copy of the
policy, synced on request (as a vLLM engine is) from the live weights or a snapshot, which records the weights
every rollout was sampled by and the snapshot versions it synced, and fails if a sync ever comes while it
generates or a rollout meets it asleep. The server engine's own checks are in
``tests/agents/rollout/test_async_server.py``."""
from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "jsonargparse")

import torch  # noqa: E402

from agents.policies.policy import HFPolicy  # noqa: E402
from agents.rollout.batch import TrainBatch  # noqa: E402
from agents.rollout.engine_weights import EngineWithWeights  # noqa: E402
from agents.rollout.engines import EngineSetup, register_engine  # noqa: E402
from agents.rollout.hf_sampler import HFSampler  # noqa: E402
from agents.rollout.sync_check import policy_logprobs  # noqa: E402
from agents.training.callbacks import Callback  # noqa: E402
from agents.training.config import TrainConfig  # noqa: E402
from agents.training.update import agent_turns, engine_mismatch  # noqa: E402
from search_env.trajectory import Trajectory  # noqa: E402
from tests.agents.training.tiny import run, small_config  # noqa: E402

NAME = "test-copy"


@dataclass
class CopyEngineOptions:
    """Attributes:
        fail_at_agent: the agent made this many-th (counting from 0) raises in its first ``generate`` (-1: none).
        background_delay_s: an agent asked for off the main thread waits this long first (so that the
            update's optimiser steps come before it: a sync then would take weights of the wrong version).
        break_sync: this sync (counting from 1), when it is a snapshot's, counts but loads nothing (0: none).
        sleep: the post-step hook puts the engine to sleep, as the vLLM engine's ``sleep`` does; a rollout
            that meets it asleep fails.
    """

    fail_at_agent: int = -1
    background_delay_s: float = 0.0
    break_sync: int = 0
    sleep: bool = False


def fingerprint(model: torch.nn.Module) -> float:
    """A number that changes with any step of the weights."""
    return float(sum((p.detach().double() * (i + 1)).sum() for i, p in enumerate(model.parameters())))


class CopyEngine(EngineWithWeights):
    """The HF sampler over a copy of the policy, synced from the backend when stale (vLLM's contract)."""

    logprobs_are_trainers = False
    decodes_trained_policy = False
    needs_policy = True
    reuse_logprobs = False
    built: list[CopyEngine] = []

    def __init__(self, policy: HFPolicy, options: CopyEngineOptions, temperature: float) -> None:
        self.copy = HFPolicy(copy.deepcopy(policy.model), policy.codec)
        self.options, self.temperature, self.dtype, self.lora = options, temperature, "float32", False
        self.stale, self.syncs, self.busy, self.asleep, self.sleeps = True, 0, 0, False, 0
        self.sync_threads: list[str] = []
        self.synced_versions: list[int | None] = []
        self.agents: list[tuple[int, float, str]] = []  # (seed, weights fingerprint, thread name) of each agent
        self._weights: Any = None
        type(self).built.append(self)

    @classmethod
    def build(cls, options: CopyEngineOptions, setup: EngineSetup) -> CopyEngine:
        return cls(setup.policy, options, setup.temperature)

    def attach(self, backend: Any) -> CopyEngine:
        self.stale, self._weights = True, backend.rollout_weights
        backend.add_post_step_hook(self._after_step)
        return self

    def _after_step(self) -> None:
        self.stale = True
        self.sleep()

    @torch.no_grad()
    def sync(self, weights: Any = None) -> None:
        if self.busy:
            raise AssertionError("a weight sync came while the engine generated")
        if self.asleep:
            self.asleep = False
        self.syncs += 1
        broken = weights is not None and self.syncs == self.options.break_sync
        state = dict(self.copy.model.named_parameters())
        for name, tensor in (self._weights if weights is None else weights)():
            if name in state and not broken:
                state[name].copy_(tensor)
        self.sync_threads.append(threading.current_thread().name)
        self.synced_versions.append(getattr(weights, "version", None))  # a snapshot's version, None for the live weights
        self.stale = False

    def wake_up(self) -> None:
        if self.stale or self.asleep:
            self.sync()

    def sleep(self) -> None:
        if self.options.sleep and not self.asleep:
            self.asleep, self.sleeps = True, self.sleeps + 1

    def close(self) -> None:
        pass

    def logprobs(self, sequences):
        self.wake_up()
        self.copy.eval()
        return policy_logprobs(self.copy, sequences)

    def agent(self, *, greedy: bool, seed: int, first_row: int = 0) -> HFSampler:
        if threading.current_thread() is not threading.main_thread():
            time.sleep(self.options.background_delay_s)
        self.wake_up()
        fail = len(self.agents) == self.options.fail_at_agent
        self.agents.append((seed, fingerprint(self.copy.model), threading.current_thread().name))
        engine = self

        class Watched(HFSampler):
            def generate(self, rows, budgets, **kwargs):
                if fail:
                    raise RuntimeError("replica 0 (http://127.0.0.1:1) stopped answering")
                if engine.asleep:
                    raise AssertionError("a rollout met a sleeping engine")
                engine.busy += 1
                try:
                    return super().generate(rows, budgets, **kwargs)
                finally:
                    engine.busy -= 1

        self.copy.eval()
        return Watched(self.copy, temperature=self.temperature, greedy=greedy, seed=seed, first_row=first_row)


register_engine(NAME, CopyEngine, options=CopyEngineOptions)


class Record(Callback):
    """Each step's episodes (ids), the weights' fingerprint after each step, and each step's metrics."""

    def __init__(self) -> None:
        self.episodes: list[list[list[int]]] = []
        self.weights: list[float] = []
        self.metrics: list[dict[str, float]] = []

    def on_run_start(self, trainer) -> None:
        self.weights.append(fingerprint(trainer.policy.model))  # the weights of the steps done

    def on_rollout(self, trainer, trajectories) -> None:
        self.episodes.append([list(t.token_ids) for t in trajectories])

    def on_update(self, trainer, metrics) -> None:
        self.weights.append(fingerprint(trainer.policy.model))
        self.metrics.append(dict(metrics))


def config(tmp_path, **changes) -> TrainConfig:
    return small_config("grpo", tmp_path / "run", {"rollout.engine": NAME, "rollout.max_staleness": 1,
                                                   "run.steps": 4, "eval.every": 2, **changes})


def test_a_negative_max_staleness_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^rollout.max_staleness must be >= 0 .*got -1$"):
        small_config("grpo", tmp_path, {"rollout.max_staleness": -1})


def test_an_engine_without_weights_of_its_own_is_refused_by_the_config_before_any_model_loads(tmp_path):
    refusal = r"^rollout.max_staleness 1 needs an engine with its own copy of the weights .*: rollout.engine 'hf' \(HFEngine\) "
    with pytest.raises(ValueError, match=refusal + r"decodes the policy being trained$"):
        TrainConfig("grpo").updated({"rollout.max_staleness": 1})
    with pytest.raises(ValueError, match=r"^rollout.max_staleness 2 .*rollout.engine 'endpoint' \(EndpointEngine\) holds no weights to sync$"):
        TrainConfig("grpo").updated({"rollout.engine": "endpoint", "rollout.max_staleness": 2})
    assert TrainConfig("grpo").updated({"rollout.engine": NAME, "rollout.max_staleness": 1}).rollout.max_staleness == 1


def test_an_engine_given_to_the_trainer_without_weights_of_its_own_is_refused(tmp_path):
    from agents.rollout.hf_engine import HFEngine
    from agents.training.build import build_trainer
    from agents.training.trainer import Trainer

    built = build_trainer(config(tmp_path))
    try:
        refusal = r"^rollout.max_staleness 1 needs an engine with its own copy .*: HFEngine decodes the policy being trained$"
        with pytest.raises(ValueError, match=refusal):
            Trainer(built.config, built.policy, built.env, built.algorithm, built.backend, engine=HFEngine(built.policy))
    finally:
        built.close_environments()


def test_each_step_is_sampled_by_the_weights_one_step_old_while_the_last_step_updates(tmp_path):
    record = Record()
    trainer, result = run(config(tmp_path, **{"engine.background_delay_s": 1.0}), callbacks=[record])
    engine = CopyEngine.built[-1]
    assert result.step == 4
    # Syncs: the start; step 2's launch (v1); the evaluations after 2 (v2) and 4 (v4).
    assert set(engine.sync_threads) == {"MainThread"} and engine.syncs == 4
    training = [a for a in engine.agents if a[2].startswith("rollout-step-") or a[2] == "MainThread"]
    # Step 0 is rolled out at once by the initial weights; steps 1..3 on the background thread, each by the
    # weights after the step before the one they are for (exactly one version behind).
    rollout_seeds = [trainer.rollout_driver.seed("rollout", at=s) for s in range(4)]
    by_seed = {seed: (weights, thread) for seed, weights, thread in training}
    for step, seed in enumerate(rollout_seeds):
        weights, thread = by_seed[seed]
        assert weights == record.weights[max(step - 1, 0)]
        assert thread == ("MainThread" if step == 0 else f"rollout-step-{step}")
    assert [m["rollout/staleness_max"] for m in record.metrics] == [0.0, 1.0, 1.0, 1.0]
    assert all(m["rollout/staleness_mean"] == m["rollout/staleness_max"] for m in record.metrics)
    for m in record.metrics:
        assert m["time/update_waited"] >= 0 and m["time/weight_sync"] >= 0
    assert all("time/rollout_waited" in m for m in record.metrics[:3]) and "time/rollout_waited" not in record.metrics[3]
    assert all(0 <= m["rollout/sync_gap"] < 1e-5 for m in record.metrics if "rollout/sync_gap" in m)
    assert trainer.rollout_driver.pipeline is not None and not trainer.rollout_driver.pipeline.in_flight


def test_synchronous_runs_keep_no_pipeline_and_checkpoint_nothing_ahead(tmp_path):
    record = Record()
    trainer, _ = run(config(tmp_path, **{"rollout.max_staleness": 0, "run.steps": 2}), callbacks=[record])
    assert trainer.rollout_driver.pipeline is None and "rollout_ahead" not in trainer.state_dict()
    engine = CopyEngine.built[-1]
    seeds = {seed: weights for seed, weights, _ in engine.agents}
    assert [seeds[trainer.rollout_driver.seed("rollout", at=s)] for s in range(2)] == record.weights[:2]  # on-policy
    assert all("rollout/staleness_max" not in m and "time/update_waited" not in m for m in record.metrics)


def test_a_run_stopped_and_resumed_takes_the_steps_of_a_run_straight_through(tmp_path):
    straight = Record()
    whole, _ = run(config(tmp_path / "a"), callbacks=[straight])
    stopped, resumed = Record(), Record()
    first, result = run(config(tmp_path / "b", **{"run.stop_after": 2}), callbacks=[stopped])
    assert result.step == 2 and first.rollout_driver.pipeline is not None
    second, result = run(config(tmp_path / "b", **{"run.resume": True}), callbacks=[resumed])
    assert result.step == 4
    # The rollout taken from the checkpoint has no idle time to report (its clock was the first process's).
    assert "time/rollout_waited" not in resumed.metrics[0] and 0 <= straight.metrics[2]["time/rollout_waited"] < 60
    assert stopped.episodes + resumed.episodes == straight.episodes
    assert stopped.weights + resumed.weights[1:] == straight.weights
    for a, b in zip(whole.policy.model.parameters(), second.policy.model.parameters()):
        assert torch.equal(a, b)
    # The resumed run's step 2 was not sampled again: its episodes came from the checkpoint.
    resumed_seeds = {seed for seed, _, _ in CopyEngine.built[-1].agents}
    assert whole.rollout_driver.seed("rollout", at=2) not in resumed_seeds and whole.rollout_driver.seed("rollout", at=3) in resumed_seeds


def test_an_error_of_the_rollout_ahead_stops_the_run_and_leaves_no_thread(tmp_path):
    before = set(threading.enumerate())
    # Agents: the start's evaluation (greedy, sampled), step 0, then step 1's (on the background thread).
    with pytest.raises(RuntimeError, match=r"^replica 0 \(http://127.0.0.1:1\) stopped answering$"):
        run(config(tmp_path, **{"engine.fail_at_agent": 3}))
    assert [t for t in threading.enumerate() if t not in before and t.name.startswith("rollout-step-")] == []


# -- K steps ahead -------------------------------------------------------------------------------------
@pytest.mark.parametrize("k, every, staleness, snapshots", [
    # K = 2, evaluating every 2 steps: an evaluation settles the pipeline, so step 4's launch (at step 2)
    # takes the live weights on the main thread; steps 3 and 5 are launched behind others, from snapshots.
    (2, 2, [0.0, 1.0, 2.0, 2.0, 2.0, 2.0], [1, 3]),
    # K = 3, no periodic evaluation: steps 1..3 by the initial weights, 4 and 5 from snapshots of v1, v2.
    (3, 0, [0.0, 1.0, 2.0, 3.0, 3.0, 3.0], [1, 2]),
])
def test_step_s_is_sampled_by_the_weights_after_s_minus_k_steps(tmp_path, k, every, staleness, snapshots):
    record = Record()
    trainer, result = run(config(tmp_path, **{"rollout.max_staleness": k, "run.steps": 6, "eval.every": every,
                                              "engine.background_delay_s": 0.5}), callbacks=[record])
    engine = CopyEngine.built[-1]
    assert result.step == 6
    by_seed = {seed: (weights, thread) for seed, weights, thread in engine.agents}
    for step in range(6):
        weights, thread = by_seed[trainer.rollout_driver.seed("rollout", at=step)]
        assert weights == record.weights[max(0, step - k)], step  # the weights identity: exactly v_{max(0, s-K)}
        assert thread == ("MainThread" if step == 0 else f"rollout-step-{step}")
    assert [m["rollout/staleness_max"] for m in record.metrics] == staleness
    assert all(m["rollout/staleness_mean"] == m["rollout/staleness_max"] <= k for m in record.metrics)
    # The snapshots' syncs ran on the threads of the rollouts they precede (the engine idle, its only user),
    # each checked against the trainer's log-probs of that version; every other sync on the main thread.
    from_snapshots = [(v, thread) for v, thread in zip(engine.synced_versions, engine.sync_threads) if v is not None]
    assert [v for v, _ in from_snapshots] == snapshots
    assert [thread for _, thread in from_snapshots] == [f"rollout-step-{v + k}" for v in snapshots]
    assert all(thread == "MainThread" for v, thread in zip(engine.synced_versions, engine.sync_threads) if v is None)
    assert [sync for sync, _ in trainer.rollout_driver.sync_check.gaps] == list(range(1, engine.syncs + 1))
    assert all(gap < 1e-5 for _, gap in trainer.rollout_driver.sync_check.gaps)
    assert all(m["time/update_waited"] >= 0 and m["time/weight_sync"] >= 0 for m in record.metrics)
    assert any("time/rollout_waited" in m for m in record.metrics)
    assert not trainer.rollout_driver.pipeline.in_flight and trainer.rollout_driver.pipeline.ahead == []


def test_k_2_stopped_and_resumed_takes_the_steps_of_a_run_straight_through(tmp_path):
    changes = {"rollout.max_staleness": 2, "run.steps": 5, "eval.every": 0}
    straight = Record()
    whole, _ = run(config(tmp_path / "a", **changes), callbacks=[straight])
    stopped, resumed = Record(), Record()
    # Stopped after step 1: the rollouts of steps 2 (by v0) and 3 (by v1, a snapshot synced on its thread, its
    # sync gap not yet logged) were in flight and go into the checkpoint.
    first, result = run(config(tmp_path / "b", **changes, **{"run.stop_after": 2}), callbacks=[stopped])
    assert result.step == 2
    second, result = run(config(tmp_path / "b", **changes, **{"run.resume": True}), callbacks=[resumed])
    assert result.step == 5
    assert stopped.episodes + resumed.episodes == straight.episodes
    assert stopped.weights + resumed.weights[1:] == straight.weights
    for a, b in zip(whole.policy.model.parameters(), second.policy.model.parameters()):
        assert torch.equal(a, b)
    assert [m["rollout/staleness_max"] for m in stopped.metrics + resumed.metrics] == [0.0, 1.0, 2.0, 2.0, 2.0]
    # Each sync's gap is logged with the step its rollout was for, the checkpoint's too.
    logged = [i for i, m in enumerate(stopped.metrics + resumed.metrics) if "rollout/sync_gap" in m]
    assert logged == [i for i, m in enumerate(straight.metrics) if "rollout/sync_gap" in m] and 3 in logged
    resumed_seeds = {seed for seed, _, _ in CopyEngine.built[-1].agents}
    assert {whole.rollout_driver.seed("rollout", at=s) for s in (2, 3)}.isdisjoint(resumed_seeds)  # taken from the checkpoint


def test_a_snapshot_sync_that_loads_nothing_is_caught_by_the_sync_check(tmp_path):
    from agents.training.health import TrainingFailed

    before = set(threading.enumerate())
    # Syncs: 1 the initial weights (main thread); 2 the snapshot of v1 for step 3, on its rollout's thread.
    with pytest.raises(TrainingFailed, match=r"^weight sync check: engine test-copy, sync 2: .*not serving the trained weights$"):
        run(config(tmp_path, **{"rollout.max_staleness": 2, "run.steps": 4, "eval.questions": 0, "engine.break_sync": 2,
                                "optim.learning_rate": 0.05, "rollout.sync_tolerance": 1e-3}))
    engine = CopyEngine.built[-1]
    assert engine.synced_versions == [None, 1] and engine.sync_threads == ["MainThread", "rollout-step-3"]
    assert [t for t in threading.enumerate() if t not in before and t.name.startswith("rollout-step-")] == []


def test_an_error_of_a_rollout_k_steps_ahead_stops_the_run_and_leaves_no_thread(tmp_path):
    before = set(threading.enumerate())
    # Agents: the start's evaluation (greedy, sampled), step 0, then steps 1 and 2 on background threads.
    with pytest.raises(RuntimeError, match=r"^replica 0 \(http://127.0.0.1:1\) stopped answering$"):
        run(config(tmp_path, **{"rollout.max_staleness": 2, "engine.fail_at_agent": 4}))
    assert CopyEngine.built[-1].agents[4][2] == "rollout-step-2"
    assert [t for t in threading.enumerate() if t not in before and t.name.startswith("rollout-step-")] == []


@pytest.mark.parametrize("k", [1, 2])
def test_a_sleeping_engine_never_meets_a_rollout_ahead(tmp_path, k):
    """The engine sleeps where its post-step hook runs: held back by the pipeline until nothing is in flight,
    and woken (its weights reloaded) before the next launch or evaluation."""
    trainer, result = run(config(tmp_path, **{"rollout.max_staleness": k, "engine.sleep": True}))
    engine = CopyEngine.built[-1]
    assert result.step == 4 and engine.sleeps > 0 and all(0 <= gap < 1e-5 for _, gap in trainer.rollout_driver.sync_check.gaps)


def test_an_engine_claiming_its_own_weights_without_a_sync_from_a_snapshot_fails_at_build(tmp_path):
    from agents.training.build import build_trainer

    class LiveOnly(CopyEngine):
        def sync(self) -> None:
            super().sync()

    register_engine("test-live-only", LiveOnly, options=CopyEngineOptions)
    for staleness in (0, 2):  # whether or not the run would send a snapshot
        with pytest.raises(ValueError, match=r"^engine LiveOnly is an EngineWithWeights but lacks sync\(weights=...\) "):
            build_trainer(config(tmp_path, **{"rollout.engine": "test-live-only", "rollout.max_staleness": staleness}))


def trajectory(producers: list[int], trained: list[int]) -> Trajectory:
    return Trajectory(question="q", golden_answers=["a"], protocol="search-r1", example_id="0", prompt_length=2,
                      token_ids=list(range(len(producers))), producers=bytearray(producers), trained=bytearray(trained))


def test_the_gap_is_reported_per_search_turn_of_the_agent():
    # Row 0: prompt (2), turn 1 (3 agent tokens, the last not trained), observation (2), turn 2 (2), padding.
    # Row 1: prompt (2), turn 1 (2), observation (1), turn 2 (1), observation (1), turn 3 (2).
    producers = [[0, 0, 1, 1, 1, 0, 0, 1, 1, 0], [0, 0, 1, 1, 0, 1, 0, 1, 1, 0]]
    trained = [[0, 0, 1, 1, 0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 0, 1, 0, 1, 1, 0]]
    lengths = [9, 9]
    rows = [trajectory(p[:n], t[:n]) for p, t, n in zip(producers, trained, lengths)]
    width = 10
    trained_mask = torch.tensor(trained)
    rollout = torch.zeros(2, width)
    old = torch.zeros(2, width)
    rollout[0, 2:5] = torch.tensor([-1.0, -2.0, -9.0])  # gaps 0.5, 1.0 (the untrained 4.0 never counts)
    old[0, 2:5] = torch.tensor([-1.5, -1.0, -5.0])
    rollout[0, 7:9] = torch.tensor([-0.5, -0.5])  # gaps 0.25, 0.75
    old[0, 7:9] = torch.tensor([-0.25, -1.25])
    rollout[1, 2:4] = torch.tensor([-1.0, -1.0])  # gaps 0.0, 0.5
    old[1, 2:4] = torch.tensor([-1.0, -1.5])
    rollout[1, 5] = -2.0  # gap 2.0
    old[1, 5] = 0.0
    rollout[1, 7:9] = torch.tensor([-3.0, -1.0])  # gaps 1.0, 0.0
    old[1, 7:9] = torch.tensor([-2.0, -1.0])
    mask = torch.ones(2, width, dtype=torch.long)
    mask[:, 9:] = 0
    batch = TrainBatch(input_ids=torch.zeros(2, width, dtype=torch.long), attention_mask=mask,
                       position_ids=torch.arange(width).repeat(2, 1), trained_mask=trained_mask,
                       token_rewards=torch.zeros(2, width), scores=torch.zeros(2), group_index=torch.zeros(2, dtype=torch.long),
                       group_ids=["0", "0"], trajectories=rows, rollout_logprobs=rollout, old_logprobs=old)
    assert agent_turns(batch)[0].tolist() == [0, 0, 1, 1, 1, 0, 0, 2, 2, 0]
    assert agent_turns(batch)[1].tolist() == [0, 0, 1, 1, 0, 2, 0, 3, 3, 0]
    stats = engine_mismatch(batch)
    expected = {
        "rollout/logprob_gap_mean": (0.5 + 1.0 + 0.25 + 0.75 + 0.0 + 0.5 + 2.0 + 1.0 + 0.0) / 9,
        "rollout/logprob_gap_max": 2.0,
        "rollout/logprob_gap_turn1_mean": (0.5 + 1.0 + 0.0 + 0.5) / 4, "rollout/logprob_gap_turn1_max": 1.0,
        "rollout/logprob_gap_turn2_mean": (0.25 + 0.75 + 2.0) / 3, "rollout/logprob_gap_turn2_max": 2.0,
        "rollout/logprob_gap_turn3_mean": (1.0 + 0.0) / 2, "rollout/logprob_gap_turn3_max": 1.0,
    }
    assert stats.keys() == expected.keys()
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, abs=1e-7), key
    # Without trajectories (a hand-built batch of ids alone) the overall gap stays and the turns are left out.
    bare = engine_mismatch(TrainBatch(**{**batch.__dict__, "trajectories": []}))
    assert set(bare) == {"rollout/logprob_gap_mean", "rollout/logprob_gap_max"}
    assert np.isclose(bare["rollout/logprob_gap_mean"], expected["rollout/logprob_gap_mean"])
