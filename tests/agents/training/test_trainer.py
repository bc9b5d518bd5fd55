"""The trainer end to end on the tiny model: every algorithm runs and logs what it must, a run stopped
mid-way and resumed ends bit-identical to an uninterrupted one, and a staged reward follows the step."""
from __future__ import annotations

import dataclasses
import json

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "yaml", "tensorboard", "matplotlib")
import torch  # noqa: E402

from agents.learners import lookup_algorithm  # noqa: E402
from agents.train import build_trainer  # noqa: E402

ALGOS = ["ppo", "grpo", "reinforce++", "reinforce++-baseline"]

STEP_KEYS = {
    "reward", "em", "f1", "searches", "response_tokens", "kl", "entropy", "policy/clip_frac", "grad_norm",
    "tokens_per_s", "time/generation", "time/env", "time/search", "time/update", "lr", "reward/em",
}
EVAL_KEYS = {f"eval/{mode}/{name}" for mode in ("greedy", "sampled") for name in ("em", "f1", "reward", "searches")}


def small_config(algo: str, output_dir, **changes):
    """A run that takes seconds: 2 questions x 2 samples of at most 16 tokens, two optimiser steps per
    update pass and two passes, KL and entropy terms on so that every update moves the weights."""
    _, config_cls = lookup_algorithm(algo)
    settings = dict(
        algo=algo, steps=2, questions_per_step=2, group_size=2, max_new_tokens=16, world_size=30,
        eval_questions=2, micro_batch_size=3, mini_batch_size=2, update_epochs=2, learning_rate=1e-3,
        kl_coef=0.01, entropy_coef=0.01, tensorboard=False, progress=False, output_dir=str(output_dir),
    )
    settings.update(changes)
    return config_cls(**settings)


def run(config):
    trainer = build_trainer(config)
    try:
        result = trainer.train()
    finally:
        trainer.env.close()
    return trainer, result


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("algo,changes", [
    ("ppo", {}), ("ppo", {"critic": "head"}), ("grpo", {}), ("reinforce++", {}), ("reinforce++-baseline", {}),
], ids=["ppo-critic", "ppo-head", "grpo", "reinforce++", "reinforce++-baseline"])
def test_each_algorithm_trains_end_to_end(tmp_path, algo, changes):
    config = small_config(algo, tmp_path, **changes)
    trainer = build_trainer(config)
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    critic_before = None if trainer.backend.critic is None else {k: v.clone() for k, v in trainer.backend.critic.state_dict().items()}
    try:
        result = trainer.train()
    finally:
        trainer.env.close()
    assert result.step == 2 and set(result.evaluations) == {"start", "final"}
    moved = [k for k, v in trainer.policy.state_dict().items() if not torch.equal(v, before[k])]
    assert moved, "no parameter changed"
    if critic_before is not None:
        assert any(not torch.equal(v, critic_before[k]) for k, v in trainer.backend.critic.state_dict().items())
    if algo == "ppo" and changes.get("critic") == "head":
        assert "value_head.weight" in moved
    steps = [r for r in records(result.metrics_path) if "stage" not in r]
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        assert STEP_KEYS <= set(record), sorted(STEP_KEYS - set(record))
        assert all(value is not None for key, value in record.items() if key in STEP_KEYS)
        assert record["episodes"] == 4 and record["grad_norm"] > 0


def test_logs_tensorboard_and_curve(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer, result = run(small_config("grpo", tmp_path, steps=2, eval_every=1, tensorboard=True))
    logged = records(result.metrics_path)
    assert [(r["step"], r.get("stage")) for r in logged] == [(0, "start"), (1, None), (2, None), (2, "final")]
    assert EVAL_KEYS <= set(logged[0]) and EVAL_KEYS <= set(logged[1]) and EVAL_KEYS <= set(logged[3])
    assert STEP_KEYS <= set(logged[2])
    events = EventAccumulator(str(result.tensorboard_dir))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert (STEP_KEYS | EVAL_KEYS) <= scalars
    assert [e.step for e in events.Scalars("reward")] == [1, 2]
    assert result.curve_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "config.json").read_text())["algo"] == "grpo"


@pytest.mark.slow  # three short runs per algorithm: ~30 s each on two busy cores
@pytest.mark.parametrize("algo", ALGOS)
def test_resumed_run_is_bit_identical_to_an_uninterrupted_one(tmp_path, algo):
    base = small_config(algo, tmp_path / "whole", steps=3, eval_questions=2)
    whole, _ = run(dataclasses.replace(base, eval_every=1))  # evaluating more often must not change training
    first, stopped = run(dataclasses.replace(base, output_dir=str(tmp_path / "split"), stop_after=1))
    assert stopped.step == 1 and "final" not in stopped.evaluations
    resumed, result = run(dataclasses.replace(base, output_dir=str(tmp_path / "split"), resume=True))
    assert result.step == 3
    expected, got = whole.backend.state_dict(), resumed.backend.state_dict()
    assert set(expected) == set(got)
    for part in ("policy", "critic", "reference"):
        if part in expected:
            for key, value in expected[part].items():
                assert torch.equal(value, got[part][key]), f"{part}.{key} differs"
    for index, slots in expected["optimizer"]["state"].items():
        for name, value in slots.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(got["optimizer"]["state"][index][name])), name
    # The split run's log holds each step once, and the start evaluation carried over the resume.
    steps = [r["step"] for r in records(result.metrics_path) if "stage" not in r]
    assert steps == [1, 2, 3]
    assert set(result.evaluations) == {"start", "final"}
    assert result.evaluations["start"] == whole.evaluations["start"]
    # Equality is not trivial: the steps after the resume moved the weights.
    assert not torch.equal(first.policy.model.get_input_embeddings().weight,
                           resumed.policy.model.get_input_embeddings().weight)


@pytest.mark.parametrize("env_worker", [False, True], ids=["in-process", "env-worker"])
def test_scheduled_reward_follows_the_step(tmp_path, env_worker):
    # Stage 0 scores with search-r1 (no "format" component), stage 1 from step 1 with search-r1-format.
    # With env_worker the episodes are scored in the worker process, which must follow the step too.
    config = small_config("grpo", tmp_path, steps=2, eval_questions=0, env_worker=env_worker,
                          reward_stages=[[0, "search-r1"], [1, "search-r1-format"]])
    trainer, result = run(config)
    steps = [r for r in records(result.metrics_path) if "stage" not in r]
    assert [r["reward/stage"] for r in steps] == [0.0, 1.0]
    if env_worker:
        assert trainer._worker is None  # train() stopped it
        assert all(r["time/env_worker"] > 0 and r["time/search"] == 0 for r in steps)
    else:
        assert trainer.env.envs[0].trajectory.reward_components["stage_reward"] == "search-r1-format"


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_stepping_the_env_in_a_worker_trains_bit_identically(tmp_path, algo):
    """The worker steps the same episodes: the run's weights and logged rewards equal the in-process run's."""
    finals, rewards = [], []
    for env_worker in (False, True):
        config = small_config(algo, tmp_path / str(env_worker), steps=3, eval_questions=0, env_worker=env_worker)
        trainer, result = run(config)
        finals.append(trainer.policy.state_dict())
        rewards.append([(r["reward"], r["searches"], r["response_tokens"]) for r in records(result.metrics_path)])
    assert rewards[0] == rewards[1]
    for key, value in finals[0].items():
        assert torch.equal(value, finals[1][key]), key


def test_warm_start_runs_before_rl_and_becomes_the_reference(tmp_path):
    from agents.training.warm_start import warm_start

    config = small_config("grpo", tmp_path / "run", steps=1, sft_steps=2, sft_examples=4, sft_lr=1e-2)
    twin = build_trainer(dataclasses.replace(config, output_dir=str(tmp_path / "twin")))
    initial = {k: v.clone() for k, v in twin.policy.state_dict().items()}
    warm_start(twin.policy, config, twin.env)  # what the run's warm start must produce
    twin.env.close()
    trainer, result = run(config)
    assert any(not torch.equal(v, initial[k]) for k, v in twin.policy.state_dict().items())
    for key, value in trainer.backend.reference.state_dict().items():  # the reference is the warm-started policy
        assert torch.equal(value, twin.policy.state_dict()[key]), key
    logged = records(result.metrics_path)
    assert [(r["step"], r.get("stage")) for r in logged] == [(0, "start"), (0, "warm start"), (1, None), (1, "final")]
    assert logged[1]["sft/steps"] == 2 and logged[1]["sft/demonstrations"] == 4
    assert set(result.evaluations) == {"start", "warm start", "final"}


def test_ctrl_c_finishes_the_step_and_checkpoints(tmp_path):
    import signal

    from agents.training.checkpoint import load_checkpoint

    trainer = build_trainer(small_config("grpo", tmp_path, steps=3, eval_questions=0))
    step = trainer.train_step

    def interrupted_step():
        signal.raise_signal(signal.SIGINT)  # arrives mid-step, as a Ctrl-C would
        return step()

    trainer.train_step = interrupted_step
    try:
        result = trainer.train()
    finally:
        trainer.env.close()
    assert result.step == 1 and load_checkpoint(result.checkpoint_path)["step"] == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back


def test_dynamic_sampling_that_drops_every_group_skips_the_update(tmp_path):
    # The untrained policy scores 0 on every episode: every group is all-equal, DAPO keeps no row.
    trainer = build_trainer(small_config("grpo", tmp_path, steps=1, eval_questions=0, dynamic_sampling=True))
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    try:
        metrics = trainer.train_step()
    finally:
        trainer.env.close()
    assert metrics["reward"] == 0.0 and metrics["rows"] == 0.0 and "grad_norm" not in metrics
    assert all(torch.equal(v, before[k]) for k, v in trainer.policy.state_dict().items())


def test_dynamic_sampling_refills_the_dropped_groups_from_new_questions(tmp_path, monkeypatch):
    # A filter that keeps one group of each rollout: two groups are wanted, so the step takes two rounds,
    # trains on the first group of each (in order) and rolls out the next questions of the data order.
    trainer = build_trainer(small_config("grpo", tmp_path, steps=1, eval_questions=0, dynamic_sampling=True,
                                         dynamic_sampling_rounds=4))
    rolled: list[list[str]] = []

    def keep_first_group(batch):
        rolled.append(list(dict.fromkeys(batch.group_ids)))
        return batch.select([i for i, g in enumerate(batch.group_ids) if g == batch.group_ids[0]])

    monkeypatch.setattr(trainer.algorithm, "filter_batch", keep_first_group)
    position = trainer.order.state_dict()
    expected_questions = trainer.order.take(4)
    trainer.order.load_state_dict(position)
    try:
        metrics = trainer.train_step()
    finally:
        trainer.env.close()
    examples = trainer.env.envs[0].examples
    assert [g for r in rolled for g in r] == [examples[i].id for i in expected_questions]
    assert metrics["rollout_rounds"] == 2.0 and metrics["episodes"] == 8.0 and metrics["rows"] == 4.0
    assert "grad_norm" in metrics


def test_dynamic_sampling_rounds_stop_at_their_limit(tmp_path, monkeypatch):
    trainer = build_trainer(small_config("grpo", tmp_path, steps=1, eval_questions=0, dynamic_sampling=True,
                                         dynamic_sampling_rounds=3))
    monkeypatch.setattr(trainer.algorithm, "filter_batch", lambda batch: batch.select([]))
    try:
        metrics = trainer.train_step()
    finally:
        trainer.env.close()
    assert metrics["rollout_rounds"] == 3.0 and metrics["episodes"] == 12.0 and metrics["rows"] == 0.0
    assert "grad_norm" not in metrics


@pytest.mark.parametrize("changes,match", [
    ({"dynamic_sampling_rounds": 0, "dynamic_sampling": True}, "must be >= 1"),
    ({"dynamic_sampling_rounds": 2}, "set dynamic_sampling=True"),
])
def test_dynamic_sampling_rounds_are_checked(tmp_path, changes, match):
    with pytest.raises(ValueError, match=match):
        small_config("grpo", tmp_path, **changes)


@pytest.mark.parametrize("algo", ["grpo", "reinforce++-baseline"])
def test_one_pass_of_one_step_takes_old_logprobs_from_the_update_and_updates_the_same(tmp_path, algo, monkeypatch):
    """With one optimiser step per rollout the policy has not moved when the update runs, so its own
    (detached) log-probs are the rollout policy's: the extra no-grad pass is skipped and the step is the
    one the separate pass gives."""
    def one_step(name, separate_pass):
        config = small_config(algo, tmp_path / name, steps=1, eval_questions=0, update_epochs=1, mini_batch_size=0,
                              kl_in_reward=False)
        trainer = build_trainer(config)
        if separate_pass:
            monkeypatch.setattr(trainer, "_old_logprobs_from_update", lambda rows: False)
        before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
        calls = []
        forward = trainer.backend.forward
        monkeypatch.setattr(trainer.backend, "forward", lambda mb, **kw: calls.append(torch.is_grad_enabled()) or forward(mb, **kw))
        try:
            metrics = trainer.train_step()
        finally:
            trainer.env.close()
        after = trainer.policy.state_dict()
        assert any(not torch.equal(v, before[k]) for k, v in after.items()), "no parameter changed"
        return after, calls, metrics

    reused, reused_calls, reused_metrics = one_step("reused", separate_pass=False)
    separate, separate_calls, _ = one_step("separate", separate_pass=True)
    assert all(reused_calls) and not all(separate_calls)  # only the update's passes (with grad) when reused
    assert len(separate_calls) > len(reused_calls)
    assert reused_metrics["policy/ratio"] == pytest.approx(1.0, abs=1e-12)
    for key, value in separate.items():
        assert torch.allclose(reused[key], value, atol=1e-6), key
