"""Precision and memory on the torch backend: ``run.dtype`` (fp32 by default on a CPU, bf16 compute over
fp32 trained weights when asked, the frozen reference in bf16), gradient checkpointing (the same
gradients, the layers run twice), and checkpoints that leave out what a resume rebuilds (the reference
as built), refusing a resume whose rebuilt weights differ."""
from __future__ import annotations

import math

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "jsonargparse", "matplotlib")
import torch  # noqa: E402

from agents.policies.config import ModelConfig  # noqa: E402
from agents.policies.loading import load_policy  # noqa: E402
from agents.rollout.batch import TrainBatch  # noqa: E402
from agents.training.backends import BackendSettings, TorchBackend, training_dtype  # noqa: E402
from agents.training.build import build_trainer  # noqa: E402
from agents.training.checkpoint import load_checkpoint  # noqa: E402
from agents.training.config import TrainConfig  # noqa: E402
from agents.training.resume import free_settings  # noqa: E402
from tests.agents.training.tiny import probe_batch, records, run, small_config  # noqa: E402

SMALL = {"model.tiny_layers": 1, "model.tiny_hidden": 32, "model.tiny_heads": 2, "eval.questions": 0}


# -- run.dtype ------------------------------------------------------------------------------------
def test_auto_is_bf16_only_on_a_gpu_that_has_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert training_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert training_dtype("auto", torch.device("cpu")) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert training_dtype("auto", torch.device("cuda")) == torch.float32
    assert training_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    assert training_dtype("fp32", torch.device("cuda")) == torch.float32


def test_a_bad_dtype_is_one_line_when_the_config_is_built():
    with pytest.raises(ValueError, match=r"^unknown run.dtype 'fp16'; known: auto, bf16, fp32$"):
        TrainConfig("grpo").updated({"run.dtype": "fp16"})


def test_fp32_is_the_default_on_a_cpu_and_computes_exactly_what_the_policy_does(tmp_path):
    config = small_config("grpo", tmp_path, SMALL)
    assert config.run.dtype == "auto"
    trainer = build_trainer(config)
    try:
        backend = trainer.backend
        assert backend.dtype == torch.float32
        assert {p.dtype for p in trainer.policy.parameters()} == {torch.float32}
        assert {p.dtype for p in backend.reference.parameters()} == {torch.float32}
        batch = probe_batch(trainer.policy.vocab_size)
        plain = trainer.policy(batch.input_ids, batch.attention_mask, batch.position_ids, from_column=4).logprobs
        assert torch.equal(backend.forward(batch).logprobs, plain)
    finally:
        trainer.close_environments()


def test_a_bf16_run_on_a_cpu_computes_in_bf16_and_trains(tmp_path):
    config = small_config("grpo", tmp_path, {**SMALL, "run.dtype": "bf16"})
    trainer = build_trainer(config)
    backend = trainer.backend
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    batch = probe_batch(trainer.policy.vocab_size)
    fp32 = trainer.policy(batch.input_ids, batch.attention_mask, batch.position_ids, from_column=4).logprobs
    bf16 = backend.forward(batch).logprobs
    reference = backend.reference_logprobs(batch)
    try:
        result = trainer.train()
    finally:
        trainer.close_environments()
    assert backend.dtype == torch.bfloat16
    # The trained weights stay fp32 (the optimiser's steps are exact); the frozen reference is held in bf16.
    assert {p.dtype for p in trainer.policy.parameters()} == {torch.float32}
    assert {p.dtype for p in backend.reference.parameters()} == {torch.bfloat16}
    # bf16 compute: log-probs are fp32 tensors, near the fp32 ones but not equal to them.
    trained = batch.trained_mask.bool()
    assert bf16.dtype == reference.dtype == torch.float32
    gap = (bf16 - fp32)[trained].abs().max().item()
    assert 0 < gap < 0.1, gap
    assert (reference - fp32)[trained].abs().max().item() < 0.1
    steps = [r for r in records(result.metrics_path) if "stage" not in r]
    assert len(steps) == 2 and all(math.isfinite(r["loss/total"]) and r["updates/applied"] > 0 for r in steps)
    assert any(not torch.equal(v, before[k]) for k, v in trainer.policy.state_dict().items()), "no weight moved"


# -- gradient checkpointing -----------------------------------------------------------------------
def _gradients(policy, batch: TrainBatch) -> tuple[dict[str, torch.Tensor], int]:
    """The gradients of one loss (the trained tokens' log-probs and entropy) and how often the first
    decoder layer's MLP ran: once per forward pass, twice with checkpointing (recomputed in the backward
    pass)."""
    calls = []
    mlp = policy.lm.model.layers[0].mlp
    forward = mlp.forward  # counted on the instance: a recomputation runs no module hooks

    def counted(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    mlp.forward = counted
    policy.zero_grad(set_to_none=True)
    policy.train()
    try:
        out = policy(batch.input_ids, batch.attention_mask, batch.position_ids, with_entropy=True, from_column=4)
        loss = -(out.logprobs * batch.trained_mask).sum() - 0.1 * (out.entropy * batch.trained_mask).sum()
        loss.backward()
    finally:
        del mlp.forward
    return {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}, len(calls)


def test_gradient_checkpointing_gives_the_same_gradients():
    policy = load_policy(ModelConfig(tiny_layers=2, tiny_hidden=64, tiny_heads=4))
    batch = probe_batch(policy.vocab_size, rows=4, width=20)
    plain, plain_calls = _gradients(policy, batch)
    policy.set_gradient_checkpointing(True)
    checkpointed, checkpointed_calls = _gradients(policy, batch)
    assert (plain_calls, checkpointed_calls) == (1, 2)  # the layer was recomputed: checkpointing is on
    assert plain.keys() == checkpointed.keys() and len(plain) == len(list(policy.parameters()))
    for name, grad in plain.items():
        assert torch.allclose(grad, checkpointed[name], rtol=0, atol=1e-6), name
    policy.set_gradient_checkpointing(False)
    assert _gradients(policy, batch)[1] == 1


def test_the_run_flag_turns_it_on_and_a_resume_may_change_it(tmp_path):
    assert "run.gradient_checkpointing" in free_settings(TrainConfig())
    trainer = build_trainer(small_config("grpo", tmp_path, {**SMALL, "run.gradient_checkpointing": True}))
    try:
        assert all(layer.gradient_checkpointing for layer in trainer.policy.lm.model.layers)
    finally:
        trainer.close_environments()


# -- checkpoints leave out the reference ----------------------------------------------------------
def _param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def test_a_checkpoint_leaves_out_the_reference_and_a_resume_rebuilds_it_exactly(tmp_path):
    changes = {**SMALL, "run.steps": 2}
    whole, _ = run(small_config("grpo", tmp_path / "whole", changes))
    first, stopped = run(small_config("grpo", tmp_path / "split", {**changes, "run.stop_after": 1}))
    state = load_checkpoint(tmp_path / "split" / load_checkpoint(stopped.checkpoint_path)["backend_dir"] / "backend.pt")
    assert "reference" not in state and len(state["rebuilt_sha256"]) == 64
    assert set(state["policy"]) == set(first.policy.state_dict())
    # The policy, AdamW's two moments and a little more: a reference would add a fourth copy of the weights.
    size = (tmp_path / "split" / load_checkpoint(stopped.checkpoint_path)["backend_dir"] / "backend.pt").stat().st_size
    weights = _param_bytes(first.policy)
    assert 3 * weights < size < 3.5 * weights, (size, weights)
    resumed, result = run(small_config("grpo", tmp_path / "split", {**changes, "run.resume": True}))
    assert result.step == 2
    batch = probe_batch(whole.policy.vocab_size)
    assert torch.equal(resumed.backend.reference_logprobs(batch), whole.backend.reference_logprobs(batch))
    for key, value in whole.policy.state_dict().items():
        assert torch.equal(value, resumed.policy.state_dict()[key]), key
    # Not trivially equal: the policy moved away from the reference.
    assert not torch.equal(resumed.backend.forward(batch).logprobs, resumed.backend.reference_logprobs(batch))


def test_a_reference_reset_by_a_warm_start_is_kept_in_the_checkpoint(tmp_path):
    warm = {**SMALL, "run.steps": 1, "run.stop_after": None, "warm_start.steps": 2, "warm_start.examples": 4,
            "warm_start.batch_size": 2}
    trainer, result = run(small_config("grpo", tmp_path, warm))
    folder = tmp_path / load_checkpoint(result.checkpoint_path)["backend_dir"]
    state = load_checkpoint(folder / "backend.pt")
    assert set(state["reference"]) == set(trainer.backend.reference.state_dict())
    for key, value in trainer.backend.reference.state_dict().items():
        assert torch.equal(state["reference"][key], value), key


def test_a_resume_whose_rebuilt_weights_differ_is_refused(tmp_path):
    """The model folder the run trains from is changed after the checkpoint: the reference a resume
    rebuilds from it is not the run's, and the resume says so in one line."""
    model_dir = tmp_path / "model"
    load_policy(ModelConfig(tiny_layers=1, tiny_hidden=32, tiny_heads=2)).save_pretrained(model_dir)
    changes = {**SMALL, "model.name": str(model_dir), "run.steps": 2}
    run(small_config("grpo", tmp_path / "run", {**changes, "run.stop_after": 1}))
    changed = load_policy(str(model_dir))
    with torch.no_grad():
        changed.model.get_input_embeddings().weight[0] += 1.0
    changed.save_pretrained(model_dir)
    with pytest.raises(ValueError) as error:
        build_trainer(small_config("grpo", tmp_path / "run", {**changes, "run.resume": True}))
    message = str(error.value)
    assert "\n" not in message and "the model changed since it was written" in message


def test_a_backend_built_by_hand_rebuilds_its_reference_from_its_own_policy(tmp_path):
    """A direct save/load round trip: the reference as built is not in the file, and loading into a
    backend built around the same initial policy restores the trained policy with that reference."""
    config = small_config("grpo", tmp_path, SMALL)
    policy = load_policy(config.model)
    backend = TorchBackend(policy, BackendSettings.of(config), with_reference=True)
    batch = probe_batch(policy.vocab_size)
    backend.train()
    loss = -(backend.forward(batch).logprobs * batch.trained_mask).sum()
    backend.backward(loss)
    backend.step()
    backend.save(tmp_path)
    assert "reference" not in load_checkpoint(tmp_path / "backend.pt")
    other = TorchBackend(load_policy(config.model), BackendSettings.of(config), with_reference=True)
    other.load(tmp_path)
    assert torch.equal(other.forward(batch).logprobs, backend.forward(batch).logprobs)
    assert torch.equal(other.reference_logprobs(batch), backend.reference_logprobs(batch))
    assert not torch.equal(other.forward(batch).logprobs, other.reference_logprobs(batch))
