"""Trainer callbacks: the hooks run in order at their points of a run, a callback steers the loop through
``trainer.control`` (an evaluation or a checkpoint after a step, a stop), and the Weights & Biases logger
writes an offline run."""
from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "matplotlib")

import torch  # noqa: E402

from agents.training.callbacks import Callback, TrainerControl  # noqa: E402
from agents.training.checkpoint import load_checkpoint  # noqa: E402
from tests.agents.training.tiny import records, run, small_config  # noqa: E402


class Recorder(Callback):
    """Writes down every hook call as (hook, detail)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def on_run_start(self, trainer):
        self.calls.append(("run_start", trainer.resumed))

    def on_rollout(self, trainer, trajectories):
        self.calls.append(("rollout", len(trajectories)))

    def on_update(self, trainer, metrics):
        self.calls.append(("update", trainer.step))
        assert "reward" in metrics and "lr" in metrics

    def on_evaluation_start(self, trainer, stage):
        self.calls.append(("evaluation_start", stage))

    def on_evaluation(self, trainer, stage, results):
        self.calls.append(("evaluation", stage))
        assert set(results) == {"greedy", "sampled"}

    def on_log(self, trainer, step, record):
        self.calls.append(("log", step))

    def on_checkpoint(self, trainer, path):
        self.calls.append(("checkpoint", load_checkpoint(path)["step"]))

    def on_run_end(self, trainer, result):
        self.calls.append(("run_end", result.step))


def test_hooks_run_in_order_at_their_points_of_a_run(tmp_path):
    recorder = Recorder()
    trainer, result = run(small_config("grpo", tmp_path), callbacks=[recorder])
    assert result.step == 2
    assert recorder.calls == [
        ("run_start", False),
        ("evaluation_start", "start"), ("evaluation", "start"), ("log", 0),
        ("rollout", 4), ("update", 1), ("log", 1),
        ("rollout", 4), ("update", 2), ("log", 2),
        ("evaluation_start", "final"), ("evaluation", "final"), ("log", 2),
        ("checkpoint", 2),
        ("run_end", 2),
    ]
    # The callbacks run beside the run's own loggers, which wrote the same records.
    assert [(r["step"], r.get("stage")) for r in records(result.metrics_path)] == [(0, "start"), (1, None), (2, None), (2, "final")]


class StopAfterFirstStep(Callback):
    def on_update(self, trainer, metrics):
        if trainer.step == 1:
            trainer.control.should_stop = True


def test_a_callback_can_stop_the_run_which_is_checkpointed(tmp_path):
    recorder = Recorder()
    trainer, result = run(small_config("grpo", tmp_path, {"run.steps": 3}), callbacks=[StopAfterFirstStep(), recorder])
    assert result.step == 1 and trainer.step == 1
    assert "final" not in result.evaluations
    assert [c for c in recorder.calls if c[0] in ("update", "checkpoint", "run_end")] == [
        ("update", 1), ("checkpoint", 1), ("run_end", 1)]
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 1
    assert not (tmp_path / "policy").exists()  # an unfinished run exports no policy


class AskAt(Callback):
    """Sets ``trainer.control``'s ``flags`` in ``on_update`` of ``step``."""

    def __init__(self, step: int, *flags: str) -> None:
        self.step, self.flags = step, flags

    def on_update(self, trainer, metrics):
        if trainer.step == self.step:
            for flag in self.flags:
                setattr(trainer.control, flag, True)


def training_record(record: dict) -> dict:
    """What a step's record says of training: no timings, no evaluation."""
    return {k: v for k, v in record.items() if not k.startswith(("time/", "eval/")) and k != "tokens_per_s"}


def test_a_callback_asks_for_an_evaluation_and_a_checkpoint_after_one_step(tmp_path):
    """No ``eval.every`` and no ``run.save_every``: the step-1 evaluation and checkpoint are the callback's,
    the flags are cleared after it (none at step 2), and training is the same as without them."""
    changes = {"run.steps": 3}
    plain, plain_result = run(small_config("grpo", tmp_path / "plain", changes))
    recorder = Recorder()
    asked, result = run(small_config("grpo", tmp_path / "asked", changes),
                        callbacks=[AskAt(1, "should_evaluate", "should_save"), recorder])
    assert result.step == 3
    assert recorder.calls[recorder.calls.index(("update", 1)):recorder.calls.index(("update", 2))] == [
        ("update", 1), ("evaluation_start", None), ("evaluation", None), ("log", 1), ("checkpoint", 1), ("rollout", 4)]
    assert [c for c in recorder.calls if c[0] == "checkpoint"] == [("checkpoint", 1), ("checkpoint", 3)]
    assert asked.control == TrainerControl()
    logged = [r for r in records(result.metrics_path) if "stage" not in r]
    assert [r["step"] for r in logged if "eval/greedy/em" in r] == [1]
    assert {"eval/greedy/em", "eval/sampled/em"} <= set(logged[0])
    # The evaluation draws from its own seeded stream: the steps trained are the plain run's, bit for bit.
    plain_logged = [r for r in records(plain_result.metrics_path) if "stage" not in r]
    assert [training_record(r) for r in logged] == [training_record(r) for r in plain_logged]
    for (name, value), (_, expected) in zip(asked.policy.state_dict().items(), plain.policy.state_dict().items()):
        assert torch.equal(value, expected), name


class TwoRanks:
    """A backend stand-in of two ranks whose other rank raised ``other``'s flags (evaluate, save, stop)."""

    world_size = 2

    def __init__(self, *other: float) -> None:
        self.other = torch.tensor(other)

    def all_reduce_sum(self, tensor):
        return tensor + self.other


def test_the_flags_are_the_same_on_every_rank_and_a_step_takes_its_own():
    control = TrainerControl(should_evaluate=True)
    assert control.shared(TwoRanks(0.0, 1.0, 0.0)) is control
    assert control == TrainerControl(should_evaluate=True, should_save=True)
    assert control.shared(TwoRanks(0.0, 0.0, 1.0)).should_stop
    asked = control.take_step_flags()
    assert asked == TrainerControl(True, True, True) and control == TrainerControl(should_stop=True)


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None,
                    reason="run.report_to wandb needs the wandb package, which no extra installs yet (pip install wandb)")
def test_wandb_logger_writes_an_offline_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    trainer, result = run(small_config("grpo", tmp_path, {"run.report_to": ["wandb"], "eval.questions": 0}))
    assert result.step == 2
    written = [p for p in (tmp_path / "wandb").rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in written), sorted(str(p) for p in written)
