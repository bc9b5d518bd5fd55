"""The trainer end to end on the tiny model: every algorithm runs and logs what it must, a run stopped
mid-way and resumed ends bit-identical to an uninterrupted one, and a staged reward follows the step."""
from __future__ import annotations

import json

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "yaml", "tensorboard", "matplotlib")
import torch  # noqa: E402

from agents.training import update  # noqa: E402
from agents.training.build import build_trainer  # noqa: E402
from agents.training.checkpoint import load_checkpoint  # noqa: E402
from tests.agents.training.tiny import probe_batch, records, run, small_config  # noqa: E402

ALGOS = ["ppo", "grpo", "reinforce++", "reinforce++-baseline"]

STEP_KEYS = {
    "reward", "em", "f1", "searches", "response_tokens", "kl", "entropy", "policy/clip_frac", "grad_norm",
    "tokens_per_s", "time/generation", "time/env", "time/search", "time/update", "lr", "reward/em",
}
EVAL_KEYS = {f"eval/{mode}/{name}" for mode in ("greedy", "sampled") for name in ("em", "f1", "reward", "searches")}
#: Keys of a step's record that measure time (they differ between two runs of the same steps).
TIMING = ("time/", "tokens_per_s")


@pytest.mark.parametrize("algo,changes", [
    ("ppo", {}), ("ppo", {"algorithm.critic": "head"}), ("grpo", {}), ("reinforce++", {}), ("reinforce++-baseline", {}),
], ids=["ppo-critic", "ppo-head", "grpo", "reinforce++", "reinforce++-baseline"])
def test_each_algorithm_trains_end_to_end(tmp_path, algo, changes):
    config = small_config(algo, tmp_path, changes)
    trainer = build_trainer(config)
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    critic_before = None if trainer.backend.critic is None else {k: v.clone() for k, v in trainer.backend.critic.state_dict().items()}
    try:
        result = trainer.train()
    finally:
        trainer.close_environments()
    assert result.step == 2 and set(result.evaluations) == {"start", "final"}
    moved = [k for k, v in trainer.policy.state_dict().items() if not torch.equal(v, before[k])]
    assert moved, "no parameter changed"
    if critic_before is not None:
        assert any(not torch.equal(v, critic_before[k]) for k, v in trainer.backend.critic.state_dict().items())
    if algo == "ppo" and changes.get("algorithm.critic") == "head":
        assert "value_head.weight" in moved
    steps = [r for r in records(result.metrics_path) if "stage" not in r]
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        assert STEP_KEYS <= set(record), sorted(STEP_KEYS - set(record))
        assert all(value is not None for key, value in record.items() if key in STEP_KEYS)
        assert record["episodes"] == 4 and record["grad_norm"] > 0


def test_logs_tensorboard_and_curve(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer, result = run(small_config("grpo", tmp_path, {"run.steps": 2, "eval.every": 1, "run.report_to": ["tensorboard"]}))
    logged = records(result.metrics_path)
    assert [(r["step"], r.get("stage")) for r in logged] == [(0, "start"), (1, None), (2, None), (2, "final")]
    assert EVAL_KEYS <= set(logged[0]) and EVAL_KEYS <= set(logged[1]) and EVAL_KEYS <= set(logged[3])
    assert STEP_KEYS <= set(logged[2])
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert (STEP_KEYS | EVAL_KEYS) <= scalars
    assert [e.step for e in events.Scalars("reward")] == [1, 2]
    assert result.curve_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "config.json").read_text())["algo"] == "grpo"


@pytest.mark.slow  # three short runs per algorithm: ~30 s each on two busy cores
@pytest.mark.parametrize("algo", ALGOS)
def test_resumed_run_is_bit_identical_to_an_uninterrupted_one(tmp_path, algo):
    base = small_config(algo, tmp_path / "whole", {"run.steps": 3, "eval.questions": 2})
    whole, whole_result = run(base.updated({"eval.every": 1}))  # evaluating more often must not change training
    split = str(tmp_path / "split")
    first, stopped = run(base.updated({"run.output_dir": split, "run.stop_after": 1}))
    assert stopped.step == 1 and "final" not in stopped.evaluations
    assert not (tmp_path / "split" / "policy").exists()  # only a finished run exports its policy
    # The checkpoint layout: the trainer's state names the backend's folder of the saved step.
    state = load_checkpoint(stopped.checkpoint_path)
    assert state["step"] == 1 and state["backend_dir"] == "checkpoints/step-1"
    assert [p.name for p in (tmp_path / "split" / "checkpoints").iterdir()] == ["step-1"]
    assert (tmp_path / "split" / "checkpoints" / "step-1" / "backend.pt").is_file()
    resumed, result = run(base.updated({"run.output_dir": split, "run.resume": True}))
    assert result.step == 3
    assert [p.name for p in (tmp_path / "split" / "checkpoints").iterdir()] == ["step-3"]  # older steps removed
    expected, got = whole.backend.state_dict(), resumed.backend.state_dict()
    assert set(expected) == set(got)
    for part in ("policy", "critic"):
        if part in expected:
            for key, value in expected[part].items():
                assert torch.equal(value, got[part][key]), f"{part}.{key} differs"
    # The reference is not checkpointed (it is the policy as built): the resume rebuilt the very same one.
    assert "reference" not in expected and whole.algorithm.uses_reference
    batch = probe_batch(whole.policy.vocab_size)
    assert torch.equal(resumed.backend.reference_logprobs(batch), whole.backend.reference_logprobs(batch))
    for optimizer in ("optimizer", "critic_optimizer"):
        if optimizer not in expected:
            continue
        assert expected[optimizer]["state"].keys() == got[optimizer]["state"].keys() != set()
        for index, slots in expected[optimizer]["state"].items():
            for name, value in slots.items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(got[optimizer]["state"][index][name])), name
    for scheduler in ("scheduler", "critic_scheduler"):
        if scheduler in expected:
            assert expected[scheduler] == got[scheduler]
    # The logs: the same steps with the same figures (timings aside).
    def figures(path):
        return [{k: v for k, v in r.items() if not k.startswith(TIMING) and not k.startswith("eval/")}
                for r in records(path) if "stage" not in r]

    assert figures(result.metrics_path) == figures(whole_result.metrics_path)
    # The split run's log holds each step once, and the start evaluation carried over the resume.
    steps = [r["step"] for r in records(result.metrics_path) if "stage" not in r]
    assert steps == [1, 2, 3]
    assert set(result.evaluations) == {"start", "final"}
    assert result.evaluations["start"] == whole.state.evaluations["start"]
    # Equality is not trivial: the steps after the resume moved the weights.
    assert not torch.equal(first.policy.model.get_input_embeddings().weight,
                           resumed.policy.model.get_input_embeddings().weight)


@pytest.mark.parametrize("env_worker", [False, True], ids=["in-process", "env-worker"])
def test_scheduled_reward_follows_the_step(tmp_path, env_worker):
    # Stage 0 scores with search-r1 (no "format" component), stage 1 from step 1 with search-r1-format.
    # With env_worker the episodes are scored in the worker process, which must follow the step too.
    config = small_config("grpo", tmp_path, {"run.steps": 2, "eval.questions": 0, "rollout.env_worker": env_worker,
                                             "env.reward_stages": [[0, "search-r1"], [1, "search-r1-format"]]})
    trainer, result = run(config)
    steps = [r for r in records(result.metrics_path) if "stage" not in r]
    assert [r["reward/stage"] for r in steps] == [0.0, 1.0]
    if env_worker:
        assert trainer.rollout_driver.worker is None  # train() stopped it
        assert all(r["time/env_worker"] > 0 and r["time/search"] == 0 for r in steps)
    else:
        assert trainer.env.envs[0].trajectory.reward_components["stage_reward"] == "search-r1-format"


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_stepping_the_env_in_a_worker_trains_bit_identically(tmp_path, algo):
    """The worker steps the same episodes: the run's weights and logged rewards equal the in-process run's."""
    finals, rewards = [], []
    for env_worker in (False, True):
        config = small_config(algo, tmp_path / str(env_worker), {"run.steps": 3, "eval.questions": 0, "rollout.env_worker": env_worker})
        trainer, result = run(config)
        finals.append(trainer.policy.state_dict())
        rewards.append([(r["reward"], r["searches"], r["response_tokens"]) for r in records(result.metrics_path)])
    assert rewards[0] == rewards[1]
    for key, value in finals[0].items():
        assert torch.equal(value, finals[1][key]), key


def test_warm_start_runs_before_rl_and_becomes_the_reference(tmp_path):
    from agents.training.warm_start import warm_start

    config = small_config("grpo", tmp_path / "run", {"run.steps": 1, "warm_start.steps": 2, "warm_start.examples": 4,
                                                     "warm_start.learning_rate": 1e-2})
    twin = build_trainer(config.updated({"run.output_dir": str(tmp_path / "twin")}))
    initial = {k: v.clone() for k, v in twin.policy.state_dict().items()}
    warm_start(twin.backend, config, twin.env)  # what the run's warm start must produce
    twin.close_environments()
    trainer, result = run(config)
    assert any(not torch.equal(v, initial[k]) for k, v in twin.policy.state_dict().items())
    for key, value in trainer.backend.reference.state_dict().items():  # the reference is the warm-started policy
        assert torch.equal(value, twin.policy.state_dict()[key]), key
    logged = records(result.metrics_path)
    assert [(r["step"], r.get("stage")) for r in logged] == [(0, "start"), (0, "warm start"), (1, None), (1, "final")]
    assert logged[1]["warm_start/steps"] == 2 and logged[1]["warm_start/demonstrations"] == 4
    assert set(result.evaluations) == {"start", "warm start", "final"}


def test_ctrl_c_finishes_the_step_and_checkpoints(default_sigint, tmp_path):
    import signal

    from agents.training.checkpoint import load_checkpoint

    trainer = build_trainer(small_config("grpo", tmp_path, {"run.steps": 3, "eval.questions": 0}))
    step = trainer.train_step

    def interrupted_step():
        signal.raise_signal(signal.SIGINT)  # arrives mid-step, as a Ctrl-C would
        return step()

    trainer.train_step = interrupted_step
    try:
        result = trainer.train()
    finally:
        trainer.close_environments()
    assert result.step == 1 and load_checkpoint(result.checkpoint_path)["step"] == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back


def test_dynamic_sampling_that_drops_every_group_skips_the_update(tmp_path):
    # The untrained policy scores 0 on every episode: every group is all-equal, DAPO keeps no row.
    trainer = build_trainer(small_config("grpo", tmp_path, {"run.steps": 1, "eval.questions": 0, "algorithm.dynamic_sampling": True}))
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close_environments()
    assert metrics["reward"] == 0.0 and metrics["rows"] == 0.0 and "grad_norm" not in metrics
    assert all(torch.equal(v, before[k]) for k, v in trainer.policy.state_dict().items())


def test_dynamic_sampling_refills_the_dropped_groups_from_new_questions(tmp_path, monkeypatch):
    # A filter that keeps one group of each rollout: two groups are wanted, so the step takes two rounds,
    # trains on the first group of each (in order) and rolls out the next questions of the data order.
    trainer = build_trainer(small_config("grpo", tmp_path, {"run.steps": 1, "eval.questions": 0, "algorithm.dynamic_sampling": True,
                                                            "algorithm.dynamic_sampling_rounds": 4}))
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
        trainer.close_environments()
    examples = trainer.env.envs[0].examples
    assert [g for r in rolled for g in r] == [examples[i].id for i in expected_questions]
    assert metrics["rollout_rounds"] == 2.0 and metrics["episodes"] == 8.0 and metrics["rows"] == 4.0
    assert "grad_norm" in metrics


def test_dynamic_sampling_rounds_stop_at_their_limit(tmp_path, monkeypatch):
    trainer = build_trainer(small_config("grpo", tmp_path, {"run.steps": 1, "eval.questions": 0, "algorithm.dynamic_sampling": True,
                                                            "algorithm.dynamic_sampling_rounds": 3}))
    monkeypatch.setattr(trainer.algorithm, "filter_batch", lambda batch: batch.select([]))
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close_environments()
    assert metrics["rollout_rounds"] == 3.0 and metrics["episodes"] == 12.0 and metrics["rows"] == 0.0
    assert "grad_norm" not in metrics


def test_dynamic_sampling_rounds_go_on_while_another_rank_is_short(tmp_path, monkeypatch):
    # Ranks take the same rounds (their data order and a sharded policy's gathers stay in step): this rank
    # keeps its two groups in the first round, but the sum over ranks says another is still short, so a
    # second round runs; this rank trains on its first round's groups.
    trainer = build_trainer(small_config("grpo", tmp_path, {"run.steps": 1, "eval.questions": 0, "algorithm.dynamic_sampling": True,
                                                            "algorithm.dynamic_sampling_rounds": 3}))
    monkeypatch.setattr(trainer.algorithm, "filter_batch", lambda batch: batch)
    other_rank = iter([1.0])  # short after the first round, then not
    own_sum = trainer.backend.all_reduce_sum
    monkeypatch.setattr(trainer.backend, "all_reduce_sum", lambda tensor: own_sum(tensor) + next(other_rank, 0.0))
    try:
        metrics = trainer.train_step()
    finally:
        trainer.close_environments()
    assert metrics["rollout_rounds"] == 2.0 and metrics["episodes"] == 8.0 and metrics["rows"] == 4.0


@pytest.mark.parametrize("changes,match", [
    ({"algorithm.dynamic_sampling_rounds": 0, "algorithm.dynamic_sampling": True}, "^dynamic_sampling_rounds must be >= 1, got 0$"),
    ({"algorithm.dynamic_sampling_rounds": 2}, "set dynamic_sampling=True"),
])
def test_dynamic_sampling_rounds_are_checked(tmp_path, changes, match):
    with pytest.raises(ValueError, match=match):
        small_config("grpo", tmp_path, changes)


@pytest.mark.parametrize("algo", ["grpo", "reinforce++-baseline"])
def test_one_pass_of_one_step_takes_old_logprobs_from_the_update_and_updates_the_same(tmp_path, algo, monkeypatch):
    """With one optimiser step per rollout the policy has not moved when the update runs, so its own
    (detached) log-probs are the rollout policy's: the extra no-grad pass is skipped and the step is the
    one the separate pass gives."""
    def one_step(name, separate_pass):
        config = small_config(algo, tmp_path / name, {"run.steps": 1, "eval.questions": 0, "optim.update_epochs": 1,
                                                      "optim.mini_batch_size": 0, "algorithm.kl_in_reward": False})
        trainer = build_trainer(config)
        if separate_pass:
            monkeypatch.setattr(update, "old_logprobs_from_update", lambda optim, algorithm, rows: False)
        before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
        calls = []
        forward = trainer.backend.forward
        monkeypatch.setattr(trainer.backend, "forward", lambda mb, **kw: calls.append(torch.is_grad_enabled()) or forward(mb, **kw))
        try:
            metrics = trainer.train_step()
        finally:
            trainer.close_environments()
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
