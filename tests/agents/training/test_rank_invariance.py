"""One command, one result, whatever the number of ranks: ``agents.train`` run from the command line as one
process (torch backend) and under ``torchrun`` on two ranks (DeepSpeed ZeRO-2) samples the same episodes
(each episode's stream is keyed by the run's seed, the step and the episode's place in the global batch,
never by the rank) and ends with the same parameters, to float rounding."""
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
from safetensors.torch import load_file  # noqa: E402

from agents.policies.config import ModelConfig  # noqa: E402
from agents.policies.loading import load_policy  # noqa: E402
from tests.agents.training.torchrun import ROOT, rank_env, torchrun  # noqa: E402

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]

#: The command whose two runs differed: a tiny model, two steps of four questions sampled twice each.
COMMAND = ("--algo", "grpo", "--model.name", "tiny", "--run.steps", "2", "--rollout.questions_per_step", "4",
           "--algorithm.group_size", "2", "--run.seed", "3")
#: What keeps it cheap and shows the episodes: no evaluation or loggers, every step's first episodes as text.
QUIET = ("--eval.questions", "0", "--run.report_to", "[]", "--run.sample_every", "1")
#: Parameters agree within this share of the largest change the update made (float sums taken in another
#: order, over 8 rows in one process and 4 on each rank) and within this absolute difference, besides a few
#: float32 roundings of the parameter itself (RTOL: the updates, about 2e-6, are below a unit parameter's last bit).
SHARE_OF_UPDATE, ATOL, RTOL = 0.01, 1e-5, 1e-6


def _one_process(out: Path) -> None:
    command = [sys.executable, "-m", "agents.train", *COMMAND, *QUIET, "--run.output_dir", str(out)]
    done = subprocess.run(command, cwd=ROOT, env=rank_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_one_process_and_two_deepspeed_ranks_sample_the_same_episodes_and_end_at_the_same_parameters(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    _one_process(one)
    torchrun(2, "-m", "agents.train", *COMMAND, *QUIET, "--run.output_dir", str(two),
             "--run.backend", "deepspeed", "--backend.zero_stage", "2")

    # The episodes: the first questions' first samples as text (rank 0's share starts the global batch), and
    # every step's episode means; step 1's rollout is the same initial model's on both.
    assert _lines(two / "samples.jsonl") == _lines(one / "samples.jsonl")
    assert [r["step"] for r in _lines(one / "samples.jsonl")] == [1, 1, 2, 2]
    steps = {"one": _lines(one / "metrics.jsonl"), "two": _lines(two / "metrics.jsonl")}
    assert [m["step"] for m in steps["one"]] == [m["step"] for m in steps["two"]] == [1, 2]
    for single, ranks in zip(steps["one"], steps["two"]):
        for key in ("reward", "em", "searches", "response_tokens", "rows", "episodes"):
            assert ranks[key] == pytest.approx(single[key], rel=1e-12), (single["step"], key)
        for key in ("entropy", "loss/total"):
            assert ranks[key] == pytest.approx(single[key], rel=1e-5), (single["step"], key)
    assert steps["two"][1]["kl"] == pytest.approx(steps["one"][1]["kl"], rel=1e-3, abs=1e-12)

    # The parameters, against the update both took from the same initial model.
    config = json.loads((one / "config.json").read_text(encoding="utf-8"))
    initial = load_policy(ModelConfig(**config["model"]), seed=config["run"]["seed"]).lm.state_dict()
    single, ranks = load_file(one / "policy" / "model.safetensors"), load_file(two / "policy" / "model.safetensors")
    assert single.keys() == ranks.keys()
    update = max(float((single[name] - initial[name]).abs().max()) for name in single)
    assert update > 0
    for name, value in single.items():
        torch.testing.assert_close(ranks[name], value, atol=min(SHARE_OF_UPDATE * update, ATOL), rtol=RTOL,
                                   msg=lambda text: f"{name}, against an update of {update:.3g}: {text}")
