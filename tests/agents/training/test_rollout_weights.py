"""What a rollout engine reads of the policy (``TrainingBackend.rollout_weights``): the model's state dict by
its transformers names, each tensor whole. Under ZeRO-3 (two ranks, ``torchrun``, gloo on the CPU) every
rank is given the single-process model's tensors while gathering one parameter at a time, and rank 0 alone
reads them within ``generation()`` (where they are whole, as the trainer's evaluation does); a LoRA policy
gives its frozen base under the plain model's names, and its adapters alone under peft's."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
import torch  # noqa: E402

from tests.agents.training.ds_rollout_weights import tiny_policy  # noqa: E402
from tests.agents.training.torchrun import torchrun  # noqa: E402


def assert_same(read: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert list(read) == list(expected)  # the same names, in the state dict's order
    for name, tensor in expected.items():
        assert read[name].shape == tensor.shape and torch.equal(read[name], tensor), name


def plain_state_dict() -> dict[str, torch.Tensor]:
    """The tiny model's state dict without adapters: the names and weights a LoRA policy's base must give."""
    return {name: tensor.clone() for name, tensor in tiny_policy().model.state_dict().items()}


def adapter_state_dict(policy) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in policy.model.state_dict().items() if ".lora_" in name}


def test_the_torch_backend_gives_the_state_dict():
    from agents.learners import GRPO
    from agents.training.backends import build_backend
    from agents.training.config import TrainConfig

    config = TrainConfig("grpo")
    policy = tiny_policy()
    expected = {name: tensor.clone() for name, tensor in policy.model.state_dict().items()}
    assert_same(dict(build_backend(config, policy, GRPO(config.algorithm)).rollout_weights()), expected)


def test_a_lora_policy_gives_its_base_by_the_plain_names_and_its_adapters_by_peft_s():
    skip_without("lora", "peft")
    from agents.learners import GRPO
    from agents.training.backends import build_backend
    from agents.training.config import TrainConfig

    config = TrainConfig("grpo").updated({"model.lora_rank": 4})
    policy = tiny_policy(4)
    backend = build_backend(config, policy, GRPO(config.algorithm))
    assert_same(dict(backend.rollout_weights()), plain_state_dict())
    adapters = adapter_state_dict(policy)
    assert adapters and all(".lora_A.default." in n or ".lora_B.default." in n for n in adapters)
    assert_same(dict(backend.rollout_weights(adapters=True)), adapters)


def read_on_two_ranks(tmp_path: Path, zero: int, lora_rank: int = 0) -> list[dict]:
    torchrun(2, "-m", "tests.agents.training.ds_rollout_weights", "--backend", "deepspeed", "--zero", str(zero),
             "--lora-rank", str(lora_rank), "--out", str(tmp_path))
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]


@pytest.mark.deepspeed
@pytest.mark.slow
@pytest.mark.parametrize("zero", [2, 3])
def test_every_rank_reads_the_single_process_model_one_parameter_at_a_time(tmp_path, zero):
    skip_without("deepspeed", "deepspeed")
    expected = plain_state_dict()
    ranks = read_on_two_ranks(tmp_path, zero)
    assert_same(ranks[0]["in_generation"], expected)  # rank 0 alone, the weights whole already: no collective
    for rank in ranks:
        assert_same(rank["weights"], expected)
        if zero == 3:
            # Sharded: most parameters are partitioned, yet at every yield one (the one yielded) is whole.
            assert rank["partitioned"] >= 10 and rank["most_gathered"] == 1 and rank["gathered_after"] == 0, rank
            assert_scored_module_by_module(rank)


def assert_scored_module_by_module(rank: dict) -> None:
    """The sync check's scoring (``backend.scoring()``) gives the whole model's log-probs, with never all the
    parameters whole at a module's forward pass (measured: ZeRO-3 the module's own 2 of 20, FSDP the root's and
    one layer's 11 of 20), where ``generation()`` gathers them all."""
    for scored, whole in zip(rank["scored"], rank["scored_whole"], strict=True):
        torch.testing.assert_close(torch.tensor(scored), torch.tensor(whole), atol=1e-6, rtol=0)
    assert 0 < rank["scoring_most_whole"] < rank["parameters"], rank


@pytest.mark.fsdp
@pytest.mark.slow
def test_every_fsdp_rank_scores_the_sync_probe_module_by_module(tmp_path):
    torchrun(2, "-m", "tests.agents.training.ds_rollout_weights", "--backend", "fsdp", "--out", str(tmp_path))
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        assert_same(result["weights"], plain_state_dict())
        assert_scored_module_by_module(result)


@pytest.mark.deepspeed
@pytest.mark.slow
def test_every_zero3_rank_reads_a_lora_policy_s_base_and_adapters(tmp_path):
    skip_without("deepspeed", "deepspeed")
    skip_without("lora", "peft")
    expected_base, adapters = plain_state_dict(), adapter_state_dict(tiny_policy(4))
    for rank in read_on_two_ranks(tmp_path, 3, lora_rank=4):
        assert_same(rank["weights"], expected_base)
        assert_same(rank["adapters"], adapters)
        assert rank["most_gathered"] == 1 and rank["gathered_after"] == 0, rank
