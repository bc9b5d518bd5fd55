"""The DeepSpeed backend keeps the maths of one process: two ranks under ZeRO-2 or ZeRO-3 (``torchrun``, gloo
on the CPU), each holding one question group of uneven rows, take the same two optimiser steps on the same
global batch as the single-process torch backend, to float32 rounding (parameters within 1e-5; the updates
move them by about 2e-3), for GRPO, REINFORCE++ and PPO with a value head or a separate critic (whose own
engine, learning rate and warm-up must match the torch backend's critic too), also when DAPO's dynamic
sampling leaves a rank without rows; a warm start leaves every rank with the single process's weights. A
2-rank run stopped after a checkpoint and resumed ends where the uninterrupted run does, a separate
critic's engine included. Bad setups are one line."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
skip_without("deepspeed", "deepspeed")
import torch  # noqa: E402

from agents.training.config import TrainConfig  # noqa: E402
from agents.training.backends.deepspeed_setup import deepspeed_config  # noqa: E402
from agents.training.backends.settings import BackendSettings  # noqa: E402
from agents.training.backends.distributed import check_world  # noqa: E402
from tests.agents.training.torchrun import ROOT, equivalence_run, rank_env, train_run  # noqa: E402

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]

#: Parameters of the two runs agree within this (float32 sums taken in another order; Adam steps of 1e-3).
ATOL = 1e-5


def _update(tmp_path: Path, algo: str, backend: str, zero: int = 2, critic: str = "head", *flags: str) -> dict:
    return equivalence_run(tmp_path / f"{algo}-{critic}-{backend}-{zero}.pt", backend, "--algo", algo, "--zero", str(zero),
                           "--critic", critic, *flags)


@pytest.mark.parametrize("algo, zero, critic", [("grpo", 2, "head"), ("grpo", 3, "head"), ("ppo", 3, "head"),
                                               ("ppo", 2, "separate"), ("ppo", 3, "separate"), ("reinforce++", 2, "head"),
                                               ("reinforce++", 3, "head")])
def test_two_ranks_take_the_single_process_steps(tmp_path, algo, zero, critic):
    single = _update(tmp_path, algo, "torch", critic=critic)
    ranks = _update(tmp_path, algo, "deepspeed", zero, critic=critic)
    from tests.agents.training.ds_equivalence import main  # noqa: F401  (the worker imports)

    assert single["params"].keys() == ranks["params"].keys()
    assert single["critic"].keys() == ranks["critic"].keys() and bool(single["critic"]) == (critic == "separate")
    for group in ("params", "critic"):  # a separate critic's engine takes the single process's critic steps too
        for name, value in single[group].items():
            torch.testing.assert_close(ranks[group][name], value, atol=ATOL, rtol=0, msg=f"{group}: {name}")
    for key, value in single["loss"].items():  # the logged losses are the whole batch's
        assert ranks["loss"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert ranks["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)


@pytest.mark.parametrize("zero", [2, 3])
def test_dynamic_sampling_that_empties_a_rank_takes_the_single_process_steps(tmp_path, zero):
    """DAPO's dynamic sampling drops the second question group, all of rank 1's rows: rank 1 runs idle passes
    (a zero loss) beside rank 0's two micro-batches, so that the engines' collectives line up, and the two
    optimiser steps are the single process's on the three rows left."""
    single = _update(tmp_path, "grpo", "torch", 2, "head", "--dynamic-sampling")
    ranks = _update(tmp_path, "grpo", "deepspeed", zero, "head", "--dynamic-sampling")
    assert single["rows"] == [3] and ranks["rows"] == [3, 0]
    for name, value in single["params"].items():
        torch.testing.assert_close(ranks["params"][name], value, atol=ATOL, rtol=0, msg=name)
    for key, value in single["loss"].items():
        assert ranks["loss"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert ranks["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)


#: A warm start's parameters agree within this: its Adam steps (3e-3, five of them) normalise a few near-zero
#: gradients whose float sums ZeRO-3 takes in another order; a lost micro-batch gradient moves them by ~6e-3.
WARM_ATOL = 1e-4


@pytest.mark.parametrize("zero", [2, 3])
def test_every_rank_starts_rl_from_the_single_process_warm_start(tmp_path, zero):
    """Both ranks run the whole warm start (copy warm-up, then demonstrations in two micro-batches per step):
    their weights are the same to the bit, those of the single process's warm start, and the RL update
    from there is the single process's too (the warm start's moments and settings are gone)."""
    single = _update(tmp_path, "grpo", "torch", 2, "head", "--warm-start")
    ranks = _update(tmp_path, "grpo", "deepspeed", zero, "head", "--warm-start")
    assert len(single["warm"]) == 1 and len(ranks["warm"]) == 2
    # the whole batch's gradient on every rank, not the sum over ranks (Adam would hide a scale)
    assert len(single["warm_norms"]) == 5 and ranks["warm_norms"] == pytest.approx(single["warm_norms"], rel=1e-4)
    first, second = (warm["params"] for warm in ranks["warm"])
    for name, value in single["warm"][0]["params"].items():
        torch.testing.assert_close(first[name], second[name], atol=0, rtol=0, msg=name)
        torch.testing.assert_close(first[name], value, atol=WARM_ATOL, rtol=0, msg=name)
        torch.testing.assert_close(ranks["params"][name], single["params"][name], atol=WARM_ATOL, rtol=0, msg=name)


def test_a_warm_start_whose_loss_differs_between_ranks_is_one_line():
    from agents.training.backends.deepspeed import DeepSpeedBackend

    class TwoRanks:  # all_reduce(MAX) over this rank's [loss, -loss] and another rank's at 2.5
        class ReduceOp:
            MAX = "max"

        @staticmethod
        def all_reduce(tensor, op):
            tensor.copy_(torch.maximum(tensor, torch.tensor([2.5, -2.5], dtype=tensor.dtype)))

    backend = object.__new__(DeepSpeedBackend)
    backend._world, backend._device, backend._dist = 2, torch.device("cpu"), TwoRanks
    backend._check_same_on_every_rank(2.5)
    with pytest.raises(ValueError, match=r"^the warm start's loss differs between ranks \(2\.4 to 2\.5\): every rank must"):
        backend._check_same_on_every_rank(2.4)


def test_a_separate_critic_is_checkpointed_by_its_own_engine(tmp_path):
    """2 ranks under ZeRO-3 save after one PPO update, take a second, load the checkpoint and take the second
    again: policy and critic end where they did, to the bit (the critic's weights, moments and warm-up
    position come back from its engine's checkpoint; left out, its values and so the policy's GAE move)."""
    ranks = _update(tmp_path, "ppo", "deepspeed", 3, "separate", "--resume")
    for group in ("params", "critic"):
        assert ranks["uninterrupted"][group].keys() == ranks["resumed"][group].keys() == ranks[group].keys()
        moved = max(float((ranks["uninterrupted"][group][n] - v).abs().max()) for n, v in ranks[group].items())
        assert moved > 1e-4, group  # the second update moves the weights, so an unrestored one shows
        for name, value in ranks["uninterrupted"][group].items():
            torch.testing.assert_close(ranks["resumed"][group][name], value, atol=0, rtol=0, msg=f"{group}: {name}")


def _train(tmp_path: Path, out: str, *flags: str) -> None:
    train_run("deepspeed", tmp_path / out, "--backend.zero_stage", "3", "--eval.questions", "2",
              "--optim.learning_rate", "1e-3", *flags)


def test_a_stopped_two_rank_run_resumes_to_the_uninterrupted_parameters(tmp_path):
    from transformers import AutoModelForCausalLM

    _train(tmp_path, "whole")
    _train(tmp_path, "sliced", "--run.stop_after", "1")
    assert not (tmp_path / "sliced" / "policy").exists()
    _train(tmp_path, "sliced", "--run.resume", "true")
    whole = AutoModelForCausalLM.from_pretrained(tmp_path / "whole" / "policy").state_dict()
    sliced = AutoModelForCausalLM.from_pretrained(tmp_path / "sliced" / "policy").state_dict()
    for name, value in whole.items():
        torch.testing.assert_close(sliced[name], value, atol=0, rtol=0, msg=name)
    steps = [json.loads(line)["step"] for line in (tmp_path / "sliced" / "metrics.jsonl").read_text().splitlines()
             if "stage" not in json.loads(line)]
    assert steps == [1, 2]  # one rank logs


def test_a_world_size_that_does_not_divide_the_questions_is_one_line():
    config = TrainConfig("grpo").updated({"rollout.questions_per_step": 3})
    with pytest.raises(ValueError, match=r"^2 ranks cannot share rollout.questions_per_step=3 .*multiple of 2$"):
        check_world(config, 2)
    check_world(config, 3)


def test_the_engine_config_is_derived_and_overridden_by_the_json_file(tmp_path):
    config = TrainConfig("grpo").updated({"optim.micro_batch_size": 4, "optim.max_grad_norm": 0.5, "run.backend": "deepspeed",
                                          "backend.zero_stage": 3})
    derived = deepspeed_config(BackendSettings.of(config), 2, on_gpu=False, bf16_ok=False, hidden_size=64)
    assert derived["train_micro_batch_size_per_gpu"] == 4 and derived["train_batch_size"] == 8
    assert derived["gradient_clipping"] == 0.5 and derived["zero_optimization"]["stage"] == 3
    assert derived["bf16"] == {"enabled": False} and derived["managed_gradient_accumulation"] is False
    assert deepspeed_config(BackendSettings.of(config), 2, on_gpu=True, bf16_ok=True)["bf16"] == {"enabled": True}
    overrides = tmp_path / "ds.json"
    overrides.write_text(json.dumps({"zero_optimization": {"reduce_bucket_size": 1000}, "steps_per_print": 5}))
    merged = deepspeed_config(BackendSettings.of(config.updated({"backend.config": str(overrides)})), 2, on_gpu=False, bf16_ok=False)
    assert merged["zero_optimization"]["reduce_bucket_size"] == 1000 and merged["zero_optimization"]["stage"] == 3
    assert merged["steps_per_print"] == 5
    overrides.write_text(json.dumps({"gradient_clipping": "auto"}))
    with pytest.raises(ValueError, match="leaves gradient_clipping as \"auto\""):
        deepspeed_config(BackendSettings.of(config.updated({"backend.config": str(overrides)})), 2, on_gpu=False, bf16_ok=False)


def test_a_zero_stage_other_than_2_or_3_is_one_line():
    with pytest.raises(ValueError, match="backend.zero_stage must be 2 or 3, got 1"):
        TrainConfig("grpo").updated({"run.backend": "deepspeed", "backend.zero_stage": 1})


def test_deepspeed_missing_is_one_line_naming_the_extra(monkeypatch):
    from agents.training.backends.deepspeed_setup import import_deepspeed

    monkeypatch.setitem(sys.modules, "deepspeed", None)
    with pytest.raises(ImportError, match=r"^run.backend deepspeed needs the deepspeed package: pip install 'searchqa-gym\[deepspeed\]'$"):
        import_deepspeed()


def test_deepspeeds_own_log_lines_stay_off_stdout():
    """DeepSpeed logs to the stdout of its import (the accelerator it picked, its warnings); imported
    through the backend, they go to stderr, and a training command's stdout keeps only its own lines."""
    code = ("from agents.training.backends.deepspeed_setup import import_deepspeed\n"
            "deepspeed = import_deepspeed()\n"
            "from deepspeed.accelerator import get_accelerator\n"
            "get_accelerator()\n"
            "deepspeed.utils.logger.warning('a warning of deepspeed')\n"
            "print('ours')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=rank_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "ours\n"
    assert "a warning of deepspeed" in done.stderr
