"""The trainer drives any registered backend through :class:`TrainingBackend`'s methods alone: a second
backend, defined here (it delegates to a torch backend and writes down every call), is picked by
``run.backend`` through ``build_trainer`` and trains a GRPO run with no change to the trainer."""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "matplotlib")
import torch  # noqa: E402

from agents.training.backends import BACKENDS, TorchBackend, TorchOptions, TrainingBackend, register_backend  # noqa: E402
from agents.training.build import build_trainer  # noqa: E402
from tests.agents.training.tiny import records, small_config  # noqa: E402


@register_backend("fake", options=TorchOptions)
class RecordingBackend(TrainingBackend):
    """Another backend: every method call is counted, and the work is a torch backend's."""

    def __init__(self, inner: TorchBackend) -> None:
        super().__init__()
        self.inner = inner
        self.policy = inner.policy
        self.calls: Counter[str] = Counter()

    @classmethod
    def from_config(cls, config, policy, algorithm):
        return cls(TorchBackend.from_config(config, policy, algorithm))

    @property
    def device(self):
        self.calls["device"] += 1
        return self.inner.device

    def forward(self, batch, *, with_entropy=False, with_values=False):
        self.calls["forward"] += 1
        return self.inner.forward(batch, with_entropy=with_entropy, with_values=with_values)

    def reference_logprobs(self, batch):
        self.calls["reference_logprobs"] += 1
        return self.inner.reference_logprobs(batch)

    def reset_reference(self):
        self.calls["reset_reference"] += 1
        self.inner.reset_reference()

    def micro_batches(self, batch):
        self.calls["micro_batches"] += 1
        return self.inner.micro_batches(batch)

    def reduce_counts(self, counts):
        self.calls["reduce_counts"] += 1
        return self.inner.reduce_counts(counts)

    def backward(self, loss):
        self.calls["backward"] += 1
        self.inner.backward(loss)

    def step(self):
        self.calls["step"] += 1
        norm = self.inner.step()
        self._run_post_step_hooks()  # this backend's own hooks (the contract: after every optimiser step)
        return norm

    def finish_step(self):
        self.calls["finish_step"] += 1
        self.inner.finish_step()

    @contextmanager
    def supervised(self, learning_rate, schedule=None, **adamw):
        self.calls["supervised"] += 1
        with self.inner.supervised(learning_rate, schedule, **adamw):
            yield

    def train(self):
        self.calls["train"] += 1
        self.inner.train()

    def eval(self):
        self.calls["eval"] += 1
        self.inner.eval()

    @property
    def learning_rate(self):
        return self.inner.learning_rate

    def save(self, directory):
        self.calls["save"] += 1
        self.inner.save(directory)

    def load(self, directory):
        self.calls["load"] += 1
        self.inner.load(directory)


@pytest.fixture
def fake_backend():
    """The registered class (registered again if an earlier test's clean-up removed it); removed after."""
    BACKENDS.setdefault("fake", RecordingBackend)
    assert BACKENDS["fake"] is RecordingBackend
    yield RecordingBackend
    BACKENDS.pop("fake", None)


def test_the_trainer_trains_through_a_registered_backend_of_its_own(tmp_path, fake_backend):
    # 2 steps x 2 update passes x 2 mini-batches of 2 rows: 8 optimiser steps; KL on, so a reference.
    config = small_config("grpo", tmp_path, {"run.backend": "fake", "eval.questions": 0})
    trainer = build_trainer(config)
    backend = trainer.backend
    assert type(backend) is RecordingBackend and backend.policy is trainer.policy
    synced = []
    backend.add_post_step_hook(lambda: synced.append(trainer.step))  # e.g. a rollout engine's weight sync
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    try:
        result = trainer.train()
    finally:
        trainer.close_environments()
    assert result.step == 2
    calls = backend.calls
    for method in ("device", "forward", "backward", "reduce_counts", "micro_batches", "reference_logprobs", "train", "eval"):
        assert calls[method] > 0, method
    assert calls["step"] == 8 and calls["finish_step"] == 2 and calls["save"] == 1
    assert calls["backward"] >= calls["step"]  # one loss per micro-batch, at least one micro-batch per step
    assert calls["reduce_counts"] == calls["step"]  # the counts of each optimiser step's mini-batch
    assert synced == [0] * 4 + [1] * 4  # once per optimiser step, during the step's update
    assert any(not torch.equal(v, before[k]) for k, v in trainer.policy.state_dict().items())
    assert (tmp_path / "checkpoints" / "step-2" / "backend.pt").is_file()  # what the backend saved
    assert [r["step"] for r in records(result.metrics_path)] == [1, 2]


def test_an_unknown_backend_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match=r"^unknown run.backend 'deepspeeed'; known: deepspeed, .*fsdp, torch; did you mean 'deepspeed'\?$"):
        build_trainer(small_config("grpo", tmp_path, {"run.backend": "deepspeeed", "eval.questions": 0}))


def test_a_lora_bases_load_dtype_is_the_backends_choice(fake_backend, monkeypatch):
    """The run's precision for a LoRA base only on a backend that keeps it as loaded (``torch``; not
    FSDP2, nor a backend that does not say so); what is trained loads in fp32 on every backend."""
    from agents.training.build import policy_load_dtype
    from agents.training.config import TrainConfig

    lora = TrainConfig("grpo").updated({"model.lora_rank": 4, "run.dtype": "bf16", "run.device": "cpu"})
    assert policy_load_dtype(lora) == torch.bfloat16
    assert policy_load_dtype(lora.updated({"model.lora_rank": 0})) == torch.float32
    for backend in ("fsdp", "fake"):
        assert policy_load_dtype(lora.updated({"run.backend": backend})) == torch.float32, backend
    monkeypatch.setattr(fake_backend, "frozen_base_in_run_dtype", True)
    assert policy_load_dtype(lora.updated({"run.backend": "fake"})) == torch.bfloat16


def test_a_backend_is_given_the_settings_it_reads_and_no_other_group():
    from agents.training.backends import BackendSettings
    from agents.training.config import TrainConfig

    config = TrainConfig("grpo").updated({"optim.learning_rate": 0.5, "rollout.temperature": 0.7, "run.dtype": "fp32",
                                          "run.steps": 9, "run.collective_timeout_s": 60.0, "warm_start.copy_steps": 3})
    settings = BackendSettings.of(config)
    assert (settings.optim, settings.options) == (config.optim, config.backend) and settings.optim.learning_rate == 0.5
    assert (settings.temperature, settings.dtype, settings.steps, settings.device, settings.collective_timeout_s,
            settings.warm_starts) == (0.7, "fp32", 9, "auto", 60.0, True)
    assert not BackendSettings.of(config.updated({"warm_start.copy_steps": 0})).warm_starts
    assert BackendSettings.of(config.updated({"env.max_turns": 2, "eval.every": 3})) == settings
