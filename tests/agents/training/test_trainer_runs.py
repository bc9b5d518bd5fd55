"""Whole tiny runs, each checking one promise of the trainer: learning-rate warm-ups count training
steps (not optimiser steps), the exported policy folder is the trained policy, and a finished run
resumed with more steps is evaluated again at its new last step."""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "jsonargparse", "matplotlib")
import torch  # noqa: E402

from agents.policies.config import ModelConfig  # noqa: E402
from agents.policies.loading import load_policy  # noqa: E402
from agents.training.build import build_trainer  # noqa: E402
from agents.training.callbacks import Callback  # noqa: E402
from agents.training.checkpoint import load_checkpoint  # noqa: E402
from tests.agents.training.tiny import records, run, small_config  # noqa: E402

#: 4 steps of 4 rows, one update pass of mini-batches of 2 rows: 2 optimiser steps per training step.
TWO_OPTIMISER_STEPS = {"run.steps": 4, "optim.update_epochs": 1, "optim.mini_batch_size": 2, "eval.questions": 0}


def run_recording_rates(config):
    """Train ``config``; returns the logged ``lr`` of each step, and the policy's and the critic's
    learning rates at each optimiser step (read by a post-step hook, as the step used them)."""
    trainer = build_trainer(config)
    at_steps: list[tuple[float, float | None]] = []
    critic = trainer.backend.critic_optimizer

    def hook():
        at_steps.append((trainer.backend.learning_rate, None if critic is None else critic.param_groups[0]["lr"]))

    trainer.backend.add_post_step_hook(hook)
    try:
        result = trainer.train()
    finally:
        trainer.close_environments()
    logged = [r["lr"] for r in records(result.metrics_path)]
    return logged, at_steps


def test_policy_warmup_counts_training_steps(tmp_path):
    # warmup_steps=3: factor (done + 1) / 3 after `done` training steps -> 1/3, 2/3, 1, 1 of 3e-3.
    config = small_config("grpo", tmp_path, {**TWO_OPTIMISER_STEPS, "optim.learning_rate": 3e-3, "optim.warmup_steps": 3})
    logged, at_steps = run_recording_rates(config)
    assert logged == pytest.approx([1e-3, 2e-3, 3e-3, 3e-3], rel=1e-12)
    assert [lr for lr, _ in at_steps] == pytest.approx([1e-3, 1e-3, 2e-3, 2e-3, 3e-3, 3e-3, 3e-3, 3e-3], rel=1e-12)


def test_a_warmup_ratio_is_a_share_of_the_runs_steps(tmp_path):
    # warmup_ratio=0.5 of 4 steps: 2 warm-up steps -> 1/2, 1, 1, 1 of 2e-3.
    config = small_config("grpo", tmp_path, {**TWO_OPTIMISER_STEPS, "optim.learning_rate": 2e-3, "optim.warmup_ratio": 0.5})
    logged, _ = run_recording_rates(config)
    assert logged == pytest.approx([1e-3, 2e-3, 2e-3, 2e-3], rel=1e-12)


def test_the_ppo_critics_warmup_counts_training_steps_too(tmp_path):
    # The critic's own warm-up of 3 steps at 6e-3: 2e-3, 4e-3, 6e-3, 6e-3; the policy's rate is constant.
    config = small_config("ppo", tmp_path, {**TWO_OPTIMISER_STEPS, "optim.learning_rate": 1e-3, "algorithm.critic_lr": 6e-3,
                                            "algorithm.critic_warmup_steps": 3, "algorithm.critic_warmup_ratio": 0.0})
    logged, at_steps = run_recording_rates(config)
    assert logged == pytest.approx([1e-3] * 4, rel=1e-12)
    assert [critic for _, critic in at_steps] == pytest.approx([2e-3, 2e-3, 4e-3, 4e-3, 6e-3, 6e-3, 6e-3, 6e-3], rel=1e-12)


def test_the_exported_policy_is_the_trained_policy(tmp_path, capsys):
    run_dir = tmp_path / "run"
    trainer, result = run(small_config("grpo", run_dir, {"eval.questions": 0}))
    assert result.policy_dir == run_dir / "policy"
    exported = load_policy(ModelConfig(str(result.policy_dir)))
    trained = trainer.policy
    assert exported.codec.vocab_size == trained.codec.vocab_size
    assert exported.codec.pad_id == trained.codec.pad_id and exported.codec.eos_ids == trained.codec.eos_ids
    text = "Question: Where was Ann Kouze born?\n<search>Ann Kouze</search>"
    assert exported.codec.encode(text) == trained.codec.encode(text)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, trained.codec.vocab_size, (3, 12), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    positions = (mask.cumsum(1) - 1).clamp_min(0)
    trained.eval()
    exported.eval()
    with torch.no_grad():
        expected = trained(ids, mask, positions).logprobs
        got = exported(ids, mask, positions).logprobs
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert not torch.equal(expected, torch.zeros_like(expected))

    # The run's folder is not a model: the error says where its policy is.
    import agents.train

    capsys.readouterr()  # what the run wrote
    status = agents.train.main(["--model.name", str(run_dir), "--data.world_size", "30", "--eval.questions", "0",
                                "--run.steps", "1", "--run.output_dir", str(tmp_path / "next")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1
    assert err == f"error: model {str(run_dir)!r} is a training run; its trained policy is {run_dir / 'policy'}"


class Evaluations(Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[str | None, int]] = []

    def on_evaluation(self, trainer, stage, results):
        self.seen.append((stage, trainer.step))


def test_a_finished_run_resumed_with_more_steps_is_evaluated_at_its_new_last_step(tmp_path):
    config = small_config("grpo", tmp_path)
    _, first = run(config)
    assert first.step == 2 and load_checkpoint(first.checkpoint_path)["stage_steps"] == {"start": 0, "final": 2}
    first_final = first.evaluations["final"]

    evaluations = Evaluations()
    trainer, longer = run(config.updated({"run.steps": 3, "run.resume": True}), callbacks=[evaluations])
    assert longer.step == 3 and evaluations.seen == [("final", 3)]
    assert trainer.state.stage_steps == {"start": 0, "final": 3}
    assert load_checkpoint(longer.checkpoint_path)["stage_steps"] == {"start": 0, "final": 3}
    assert longer.evaluations["start"] == first.evaluations["start"] and set(longer.evaluations) == {"start", "final"}
    assert [(r["step"], r.get("stage")) for r in records(longer.metrics_path)] == [
        (0, "start"), (1, None), (2, None), (2, "final"), (3, None), (3, "final")]
    assert first_final is not longer.evaluations["final"]

    # Resumed again with the same steps: nothing to train, and the final evaluation is not repeated.
    again = Evaluations()
    _, same = run(config.updated({"run.steps": 3, "run.resume": True}), callbacks=[again])
    assert same.step == 3 and again.seen == []
    assert len(records(same.metrics_path)) == 6


@pytest.mark.parametrize("periodic_sampled", [True, False])
def test_periodic_evaluations_sample_only_when_asked(tmp_path, periodic_sampled):
    """The evaluations every eval.every steps are greedy only with eval.periodic_sampled off; the before and
    after evaluations take both modes either way."""
    config = small_config("grpo", tmp_path, {"run.steps": 3, "eval.every": 1, "eval.periodic_sampled": periodic_sampled})
    _, result = run(config)
    logged = records(result.metrics_path)
    periodic = [r for r in logged if "stage" not in r and "eval/greedy/em" in r]
    assert [r["step"] for r in periodic] == [1, 2]
    assert all(("eval/sampled/em" in r) is periodic_sampled for r in periodic)
    assert set(result.evaluations["start"]) == set(result.evaluations["final"]) == {"greedy", "sampled"}


@pytest.mark.parametrize("changes", [{"optim.update_epochs": 1, "optim.mini_batch_size": 0}, {}],
                         ids=["old log-probs from the update's pass", "old log-probs from a pass of their own"])
def test_every_step_logs_the_engines_log_prob_gap(tmp_path, changes):
    """The sampler's log-probs of the ids it sampled reach the batch and are compared with the trainer's
    for the same policy, whichever pass gives the trainer's: the HF sampler's agree (a separate engine's
    would show a failed weight sync here)."""
    config = small_config("grpo", tmp_path, {"run.steps": 2, "eval.questions": 0, "algorithm.kl_coef": 0.0, **changes})
    _, result = run(config)
    steps = [r for r in records(result.metrics_path) if "time/step" in r]
    assert len(steps) == 2
    for step in steps:
        assert 0.0 <= step["rollout/logprob_gap_mean"] <= step["rollout/logprob_gap_max"] < 1e-4, step


class _CtrlCAtFinal(Callback):
    """Sends the process a Ctrl-C as the final evaluation starts."""

    def on_evaluation_start(self, trainer, stage):
        if stage == "final":
            import signal

            signal.raise_signal(signal.SIGINT)


def test_ctrl_c_during_the_final_evaluation_keeps_the_run_and_a_resume_evaluates_it(default_sigint, tmp_path, capsys):
    config = small_config("grpo", tmp_path, {"run.steps": 2})
    _, stopped = run(config, callbacks=[_CtrlCAtFinal()])
    assert stopped.step == 2 and "final" not in stopped.evaluations  # no traceback: train() returned
    assert stopped.stopped and "not exported" not in stopped.report()  # stopped early, with its policy written
    assert "stopped during the final evaluation" in capsys.readouterr().err
    _, resumed = run(config.updated({"run.resume": True}))
    assert resumed.step == 2 and set(resumed.evaluations["final"]) == {"greedy", "sampled"}
