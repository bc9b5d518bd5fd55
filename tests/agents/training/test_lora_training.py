"""LoRA runs on the torch backend: the reference is the base model (adapters off), with no second copy
of the weights; updates move the adapters only (the base stays bit-identical to an independent load);
checkpoints hold the adapters and optimiser only and resume exactly; a bf16 run keeps its base in bf16;
the exported policy is the merged model with the adapters beside it."""
from __future__ import annotations

import dataclasses
import math

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "jsonargparse", "matplotlib")
skip_without("lora", "peft")
import torch  # noqa: E402

from agents.policies.loading import load_policy  # noqa: E402
from agents.policies.policy import ADAPTER_DIR  # noqa: E402
from agents.training.build import build_trainer  # noqa: E402
from agents.training.checkpoint import load_checkpoint  # noqa: E402
from tests.agents.training.tiny import probe_batch, records, run, small_config  # noqa: E402

LORA = {"model.tiny_layers": 1, "model.tiny_hidden": 32, "model.tiny_heads": 2, "eval.questions": 0,
        "model.lora_rank": 4, "optim.learning_rate": 1e-2}


def base_of(config):
    """The run's base model loaded on its own: the tiny model of the run's seed, no adapters."""
    return load_policy(dataclasses.replace(config.model, lora_rank=0), seed=config.run.seed)


def adapter_state(policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}


def test_a_lora_run_trains_the_adapters_only_against_the_base_as_reference(tmp_path):
    config = small_config("grpo", tmp_path, LORA)
    trainer = build_trainer(config)
    backend = trainer.backend
    base = base_of(config)
    before = adapter_state(trainer.policy)
    try:
        result = trainer.train()
    finally:
        trainer.close_environments()
    # No second copy of the weights: no reference model, and the backend's one model is base + adapters.
    assert backend.reference is None
    adapters = sum(p.numel() for p in before.values())
    assert sum(p.numel() for p in trainer.policy.parameters()) == sum(p.numel() for p in base.parameters()) + adapters
    # Only the adapters moved: every base weight is bit-identical to an independent load of the base.
    frozen = {n.replace(".base_layer", ""): p for n, p in trainer.policy.lm.named_parameters() if not p.requires_grad}
    for name, value in base.model.named_parameters():
        assert torch.equal(frozen[name], value), name
    after = adapter_state(trainer.policy)
    assert any(not torch.equal(after[n], v) for n, v in before.items() if "lora_B" in n)
    # The reference is the base model itself, exactly, while the policy has moved away from it.
    batch = probe_batch(trainer.policy.vocab_size)
    with torch.no_grad():
        expected = base(batch.input_ids, batch.attention_mask, batch.position_ids, from_column=4).logprobs
    assert torch.equal(backend.reference_logprobs(batch), expected)
    assert not torch.equal(backend.forward(batch).logprobs, expected)
    steps = [r for r in records(result.metrics_path) if "stage" not in r]
    assert all(math.isfinite(r["loss/total"]) for r in steps) and any(r["kl"] > 0 for r in steps)
    # The exported policy: the merged model any tool loads, and the adapters beside it.
    exported = load_policy(str(result.policy_dir))
    with torch.no_grad():
        merged = exported(batch.input_ids, batch.attention_mask, batch.position_ids, from_column=4).logprobs
    assert torch.allclose(merged, backend.forward(batch).logprobs, atol=1e-5)
    assert (result.policy_dir / ADAPTER_DIR / "adapter_config.json").is_file()


def test_a_lora_checkpoint_holds_the_adapters_only_and_resumes_exactly(tmp_path):
    changes = {**LORA, "run.steps": 2}
    whole, _ = run(small_config("grpo", tmp_path / "whole", changes))
    first, stopped = run(small_config("grpo", tmp_path / "split", {**changes, "run.stop_after": 1}))
    backend_file = tmp_path / "split" / load_checkpoint(stopped.checkpoint_path)["backend_dir"] / "backend.pt"
    state = load_checkpoint(backend_file)
    trainable = set(adapter_state(first.policy))
    assert set(state["policy"]) - trainable <= {n for n, _ in first.policy.named_buffers()}
    assert trainable <= set(state["policy"]) and "reference" not in state
    full_weights = sum(p.numel() * p.element_size() for p in first.policy.parameters())
    assert backend_file.stat().st_size < full_weights / 2  # adapters and their AdamW moments, not the model
    resumed, result = run(small_config("grpo", tmp_path / "split", {**changes, "run.resume": True}))
    assert result.step == 2
    expected, got = whole.backend.state_dict(), resumed.backend.state_dict()
    for key, value in expected["policy"].items():
        assert torch.equal(value, got["policy"][key]), key
    assert expected["optimizer"]["state"].keys() == got["optimizer"]["state"].keys() != set()
    for index, slots in expected["optimizer"]["state"].items():
        for name, value in slots.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(got["optimizer"]["state"][index][name])), name
    batch = probe_batch(whole.policy.vocab_size)
    assert torch.equal(resumed.backend.reference_logprobs(batch), whole.backend.reference_logprobs(batch))
    assert torch.equal(resumed.backend.forward(batch).logprobs, whole.backend.forward(batch).logprobs)
    assert not torch.equal(first.backend.forward(batch).logprobs, resumed.backend.forward(batch).logprobs)


def test_a_bf16_lora_run_holds_its_base_in_bf16_and_trains_fp32_adapters(tmp_path):
    config = small_config("grpo", tmp_path, {**LORA, "run.dtype": "bf16"})
    trainer = build_trainer(config)
    before = adapter_state(trainer.policy)
    try:
        result = trainer.train()
    finally:
        trainer.close_environments()
    assert {p.dtype for p in trainer.policy.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for p in trainer.policy.parameters() if p.requires_grad} == {torch.float32}
    after = adapter_state(trainer.policy)
    assert any(not torch.equal(after[n], v) for n, v in before.items())
    steps = [r for r in records(result.metrics_path) if "stage" not in r]
    assert all(math.isfinite(r["loss/total"]) for r in steps)
