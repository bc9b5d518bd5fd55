"""LoRA under the DeepSpeed backend (two ranks, ``torchrun``, gloo on the CPU): the ranks take the single
process's steps on the adapters, against the base model as reference (adapters off, no copy), leaving the
base weights as they were; a stopped run's checkpoints hold the adapters only (the engine's frozen
parameters left out) and resume to the uninterrupted run's adapters, gradient checkpointing on."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
skip_without("deepspeed", "deepspeed")
skip_without("lora", "peft")
import torch  # noqa: E402

from agents.policies.config import ModelConfig  # noqa: E402
from agents.policies.loading import load_policy  # noqa: E402
from tests.agents.training.test_deepspeed_backend import ATOL  # noqa: E402
from tests.agents.training.torchrun import equivalence_run, train_run  # noqa: E402

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]

#: The tiny model ds_equivalence and the runs below train.
SHAPE = {"tiny_layers": 1, "tiny_hidden": 32, "tiny_heads": 2}


def _lora_update(tmp_path: Path, backend: str, zero: int) -> dict:
    return equivalence_run(tmp_path / f"lora-{backend}-{zero}.pt", backend, "--algo", "grpo", "--zero", str(zero),
                           "--lora-rank", "4")


def _plain_name(name: str) -> str:
    """A LoRA policy's parameter name as the plain model's (peft's wrapper and base layer taken out)."""
    return name.replace("base_model.model.", "").replace(".base_layer", "")


@pytest.mark.parametrize("zero", [2, 3])
def test_two_ranks_train_the_adapters_as_one_process_does(tmp_path, zero):
    single = _lora_update(tmp_path, "torch", zero)
    ranks = _lora_update(tmp_path, "deepspeed", zero)
    assert single["params"].keys() == ranks["params"].keys()
    for name, value in single["params"].items():
        torch.testing.assert_close(ranks["params"][name], value, atol=ATOL, rtol=0, msg=name)
    assert ranks["loss"]["loss/kl"] == pytest.approx(single["loss"]["loss/kl"], rel=1e-5, abs=1e-9)
    base = {name: p for name, p in load_policy(ModelConfig(**SHAPE)).named_parameters()}
    adapters = {name for name in ranks["params"] if ".lora_" in name}
    assert adapters and any(ranks["params"][n].abs().sum() > 0 for n in adapters if "lora_B" in n)  # B moved off 0
    for name, value in ranks["params"].items():
        if name not in adapters:  # the base, bit-identical to the model as built
            assert torch.equal(value, base[_plain_name(name)]), name


def _train(tmp_path: Path, out: str, zero: int, *flags: str) -> None:
    train_run("deepspeed", tmp_path / out, "--backend.zero_stage", str(zero), "--eval.questions", "0",
              "--optim.learning_rate", "1e-2", "--model.lora_rank", "4", *flags)


def test_a_stopped_two_rank_lora_run_keeps_the_adapters_only_and_resumes_exactly(tmp_path):
    """With gradient checkpointing on, which must reach the adapters under ZeRO-3's hooks too."""
    from safetensors.torch import load_file

    _train(tmp_path, "whole", 3, "--run.gradient_checkpointing", "true")
    _train(tmp_path, "sliced", 3, "--run.gradient_checkpointing", "true", "--run.stop_after", "1")
    engine = tmp_path / "sliced" / "checkpoints" / "step-1" / "engine"
    full_model = sum(p.numel() * 4 for p in load_policy(ModelConfig(**SHAPE)).parameters())
    assert sum(f.stat().st_size for f in engine.iterdir()) < full_model / 2  # both ranks' files: no base weights
    _train(tmp_path, "sliced", 3, "--run.gradient_checkpointing", "true", "--run.resume", "true")
    whole = load_file(tmp_path / "whole" / "policy" / "adapter" / "adapter_model.safetensors")
    sliced = load_file(tmp_path / "sliced" / "policy" / "adapter" / "adapter_model.safetensors")
    assert whole.keys() == sliced.keys() and whole
    for name, value in whole.items():
        torch.testing.assert_close(sliced[name], value, atol=0, rtol=0, msg=name)
    assert any(value.abs().sum() > 0 for name, value in whole.items() if "lora_B" in name)
