"""The FSDP2 backend keeps the maths of one process: two ranks (``torchrun``, gloo on the CPU), each holding
one question group of uneven rows, take the same two optimiser steps on the same global batch as the
single-process torch backend, to float32 rounding (parameters within 1e-5, read back whole; the updates move
them by about 2e-3), with the same global gradient norm (a mean over ranks instead of a sum would halve it),
for GRPO and PPO with a separate critic; a warm start leaves both ranks with the single process's weights;
LoRA trains the adapters alone, as one process does, over the base as built. A checkpoint taken between two
updates and loaded again gives the uninterrupted run's weights to the bit, and a stopped ``agents.train``
run (rollouts and evaluation decoding whole weights, the policy exported) resumes to the uninterrupted one;
a resume on another number of ranks is one line."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
import torch  # noqa: E402

from agents.policies.config import ModelConfig  # noqa: E402
from agents.policies.loading import load_policy  # noqa: E402
from agents.training.backends.fsdp import decoder_layers, rank_file  # noqa: E402
from tests.agents.training.torchrun import ROOT, TINY_RUN, equivalence_run, rank_env, train_run  # noqa: E402

pytestmark = [pytest.mark.fsdp, pytest.mark.slow]

#: Parameters of the two runs agree within this (float32 sums taken in another order; Adam steps of 1e-3).
ATOL = 1e-5


def _assert_same_steps(single: dict, ranks: dict, atol: float = ATOL) -> None:
    for group in ("params", "critic"):
        assert single[group].keys() == ranks[group].keys()
        for name, value in single[group].items():
            torch.testing.assert_close(ranks[group][name], value, atol=atol, rtol=0, msg=f"{group}: {name}")
    for key, value in single["loss"].items():  # the logged losses are the whole batch's
        assert ranks["loss"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert ranks["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)


@pytest.mark.parametrize("algo, critic", [("grpo", "head"), ("ppo", "separate")])
def test_two_ranks_take_the_single_process_steps(tmp_path, algo, critic):
    flags = ("--algo", algo, "--critic", critic)
    single = equivalence_run(tmp_path / "torch.pt", "torch", *flags)
    ranks = equivalence_run(tmp_path / "fsdp.pt", "fsdp", *flags)
    assert ranks["rows"] == [3, 3] and bool(ranks["critic"]) == (critic == "separate")
    _assert_same_steps(single, ranks)


#: A warm start's parameters agree within this (its Adam steps of 3e-3 normalise near-zero gradients).
WARM_ATOL = 1e-4


def test_a_warm_start_then_a_checkpoint_round_trip_keep_the_single_process_weights(tmp_path):
    """Both ranks run the whole warm start: the same weights to the bit, the single process's, with its
    gradient norms (the mean over ranks of the batch's gradient, not their sum); the reference reset to the
    warmed policy (its shards copied) gives the single process's KL. Then a checkpoint taken after one
    update, loaded after a second, takes the second update again to the uninterrupted weights exactly."""
    single = equivalence_run(tmp_path / "torch.pt", "torch", "--warm-start")
    ranks = equivalence_run(tmp_path / "fsdp.pt", "fsdp", "--warm-start", "--resume")
    assert len(ranks["warm"]) == 2 and ranks["warm_norms"] == pytest.approx(single["warm_norms"], rel=1e-4)
    first, second = (warm["params"] for warm in ranks["warm"])
    for name, value in single["warm"][0]["params"].items():
        torch.testing.assert_close(first[name], second[name], atol=0, rtol=0, msg=name)
        torch.testing.assert_close(first[name], value, atol=WARM_ATOL, rtol=0, msg=name)
    _assert_same_steps(single, ranks, WARM_ATOL)
    uninterrupted, resumed = ranks["uninterrupted"]["params"], ranks["resumed"]["params"]
    assert max(float((uninterrupted[n] - v).abs().max()) for n, v in ranks["params"].items()) > 1e-4  # it moved
    for name, value in uninterrupted.items():
        torch.testing.assert_close(resumed[name], value, atol=0, rtol=0, msg=name)


def test_two_ranks_train_lora_adapters_as_one_process_does(tmp_path):
    skip_without("lora", "peft")
    flags = ("--algo", "grpo", "--lora-rank", "4")
    single = equivalence_run(tmp_path / "torch.pt", "torch", *flags)
    ranks = equivalence_run(tmp_path / "fsdp.pt", "fsdp", *flags)
    _assert_same_steps(single, ranks)
    base = dict(load_policy(ModelConfig(tiny_layers=1, tiny_hidden=32, tiny_heads=2)).named_parameters())
    adapters = {name for name in ranks["params"] if ".lora_" in name}
    assert adapters and any(ranks["params"][n].abs().sum() > 0 for n in adapters if "lora_B" in n)  # B moved off 0
    for name, value in ranks["params"].items():
        if name not in adapters:  # the base, bit-identical to the model as built
            plain = name.replace("base_model.model.", "").replace(".base_layer", "")
            assert torch.equal(value, base[plain]), name


def test_a_stopped_two_rank_run_resumes_to_the_uninterrupted_policy_and_not_on_one_rank(tmp_path):
    from transformers import AutoModelForCausalLM

    flags = ("--eval.questions", "2", "--optim.learning_rate", "1e-3")
    train_run("fsdp", tmp_path / "whole", *flags)
    train_run("fsdp", tmp_path / "sliced", *flags, "--run.stop_after", "1")
    assert sorted(p.name for p in (tmp_path / "sliced" / "checkpoints" / "step-1").rglob("backend-rank*.pt")) == \
        [rank_file(0), rank_file(1)]
    one_rank = subprocess.run([sys.executable, "-m", "agents.train", "--run.backend", "fsdp", *TINY_RUN, *flags,
                               "--run.output_dir", str(tmp_path / "sliced"), "--run.resume", "true"],
                              cwd=ROOT, env=rank_env(), capture_output=True, text=True, timeout=600)
    assert one_rank.returncode != 0
    assert one_rank.stderr.strip().splitlines()[-1] == (f"error: checkpoint {tmp_path / 'sliced' / 'checkpoints' / 'step-1'} "
                                                         "was written by 2 ranks; this run has 1: resume it with 2 ranks "
                                                         "(torchrun --nproc_per_node 2)")
    train_run("fsdp", tmp_path / "sliced", *flags, "--run.resume", "true")
    whole = AutoModelForCausalLM.from_pretrained(tmp_path / "whole" / "policy").state_dict()
    sliced = AutoModelForCausalLM.from_pretrained(tmp_path / "sliced" / "policy").state_dict()
    assert whole.keys() == sliced.keys()
    for name, value in whole.items():
        torch.testing.assert_close(sliced[name], value, atol=0, rtol=0, msg=name)


def test_the_layers_are_the_models_list_of_like_blocks():
    policy = load_policy(ModelConfig(tiny_layers=3, tiny_hidden=32, tiny_heads=2))
    layers = decoder_layers(policy.model)
    assert len(layers) == 3 and layers[0] is policy.lm.model.layers[0]
    assert decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2))) == []
