"""benchmarks.gpu_check off a GPU: it says no GPU is present and exits 1, parses its options, picks the cases
whose packages are installed, reduces a case's metrics to its figures, and appends its table to a RESULTS
file under its own section, before the generated sections, keeping what was there."""
from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks import gpu_check
from benchmarks.gpu_check import (CASES, SECTION, CaseResult, append_results, available_cases, case_command, measure, parse_args,
                                  skip_lines)
from tests.conftest import REPO_ROOT, skip_without


def test_without_a_gpu_it_says_so_and_exits_1():
    skip_without("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--no-write"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.startswith("gpu_check: no CUDA GPU is available here") and "nothing measured" in done.stderr


def test_options(monkeypatch, tmp_path):
    args = parse_args(["--model", "tiny", "--steps", "3", "--cases", "torch+hf", "--results", str(tmp_path / "R.md"), "--no-write"])
    assert (args.model, args.steps, args.cases, args.results, args.no_write) == ("tiny", 3, ["torch+hf"], tmp_path / "R.md", True)
    with pytest.raises(SystemExit):
        parse_args(["--steps", "1"])
    with pytest.raises(SystemExit):
        parse_args(["--cases", "torch+sglang"])
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: None)  # nothing optional installed
    assert parse_args([]).model == "tiny"
    assert available_cases(None) == ["torch+hf"] and available_cases(["deepspeed+hf"]) == []
    assert parse_args(["--time-limit", "60"]).time_limit == 60 and parse_args([]).time_limit == gpu_check.TIME_LIMIT_S


def test_cases_that_lack_a_package_are_skipped_with_a_line_naming_it(monkeypatch):
    installed = {"vllm"}
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: object() if name in installed else None)
    assert available_cases(None) == ["torch+hf", "torch+vllm", "fsdp+vllm", "torch+vllm-server"]
    assert skip_lines(None) == ["deepspeed+hf: skipped, deepspeed not installed", "zero3+vllm: skipped, deepspeed not installed"]
    installed.clear()
    assert skip_lines(["zero3+vllm", "torch+hf"]) == ["zero3+vllm: skipped, deepspeed, vllm not installed"]


def test_layout_cases_launch_one_rank_under_torchrun_or_a_server_on_the_same_gpu(tmp_path):
    args = parse_args(["--model", "tiny", "--steps", "3", "--cases", "zero3+vllm"])
    zero3 = case_command("zero3+vllm", args, tmp_path)
    assert zero3[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    assert zero3[6:] == ["-m", "benchmarks.gpu_check", "--child", "zero3+vllm", "--model", "tiny", "--steps", "3",
                         "--output-dir", str(tmp_path / "zero3+vllm")]
    assert case_command("torch+vllm-server", args, tmp_path)[1:4] == ["-m", "benchmarks.gpu_check", "--child"]
    flags = gpu_check._case_flags("zero3+vllm", "tiny", 3, tmp_path)
    assert flags[flags.index("--run.backend") + 1] == "deepspeed" and flags[flags.index("--backend.zero_stage") + 1] == "3"
    assert flags[flags.index("--rollout.engine") + 1] == "vllm"
    server = gpu_check._case_flags("torch+vllm-server", "tiny", 3, tmp_path)
    assert server[server.index("--rollout.engine") + 1] == "vllm-server" and server[server.index("--engine.gpus") + 1] == '["0"]'
    assert {name for name, case in CASES.items() if case.torchrun} == {"fsdp+vllm", "zero3+vllm"}


def test_the_layout_cases_flags_make_a_valid_run_config(tmp_path):
    skip_without("agents", "torch")
    from agents.train import parse_config

    for name in ("fsdp+vllm", "zero3+vllm", "torch+vllm-server"):
        config = parse_config(gpu_check._case_flags(name, "tiny", 3, tmp_path / name))
        assert (config.run.backend, config.rollout.engine) == (CASES[name].backend, CASES[name].engine)
        assert config.engine.memory_fraction == 0.3


def test_a_cases_figures_from_its_metrics():
    records = [
        {"step": 1, "time/step": 9.0, "tokens_per_s": 10.0, "time/rollout": 5.0, "time/env": 5.0, "time/search": 0.0},
        {"step": 2, "time/step": 2.0, "tokens_per_s": 100.0, "time/rollout": 1.0, "time/env": 0.1, "time/search": 0.1,
         "rollout/logprob_gap_mean": 0.02},
        {"step": 2, "stage": "final", "eval/greedy/em": 0.5},
        {"step": 3, "time/step": 4.0, "tokens_per_s": 300.0, "time/rollout": 3.0, "time/env": 0.3, "time/search": 0.2,
         "rollout/logprob_gap_mean": 0.04},
    ]
    got = measure(records, 3 * 2**20, "torch+vllm")
    assert (got.step_s, got.tokens_per_s, got.peak_memory_mib) == (3.0, 200.0, 3.0)  # medians of steps 2 and 3
    # the environment's and the search's time over the rollout's
    assert got.logprob_gap == pytest.approx(0.03) and got.env_share == pytest.approx((0.2 + 0.5) / (1.0 + 3.0))


def test_the_writer_appends_a_section_before_the_generated_ones_then_entries_in_it(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Earlier\n\n- kept\n\n<!-- generated section suite: begin -->\nx\n"
                       "<!-- generated section suite: end -->\n")
    fake = [CaseResult("torch+hf", True, step_s=0.5, tokens_per_s=1234.4, peak_memory_mib=812.0, logprob_gap=0.0, env_share=0.25),
            CaseResult("deepspeed+hf", False, error="exit 1: ValueError: boom")]
    append_results(results, fake, machine="NVIDIA H100 80GB HBM3, 81559 MiB, 580.1", command="python -m benchmarks.gpu_check",
                   model="tiny", steps=4, date="2030-01-02")
    append_results(results, fake[:1], machine="NVIDIA H200", command="python -m benchmarks.gpu_check --steps 3",
                   model="smollm2", steps=3, date="2030-01-03")
    text = results.read_text()
    assert text.startswith("# Benchmark results\n\n## Earlier\n\n- kept\n\n" + SECTION + "\n")
    assert text.index("2030-01-02") < text.index("2030-01-03") < text.index("<!-- generated section suite: begin -->")
    assert text.count(SECTION) == 1 and text.endswith("x\n<!-- generated section suite: end -->\n")
    assert ("- 2030-01-02, NVIDIA H100 80GB HBM3, 81559 MiB, 580.1: `python -m benchmarks.gpu_check` (tiny, 4 GRPO steps a "
            "case, bf16, 8 questions x 4 samples of up to 256 tokens; the first step not timed)") in text
    assert "| torch+hf | 0.500 | 1234 | 812 | 0.00e+00 | 25.0% |" in text
    assert "| deepspeed+hf | failed: exit 1: ValueError: boom | | | | |" in text
    fresh = tmp_path / "NEW.md"
    append_results(fresh, fake[:1], machine="GPU", command="c", model="tiny", steps=2, date="2030-01-04")
    assert fresh.read_text().startswith("# Benchmark results\n" + "\n" + SECTION + "\n") or SECTION in fresh.read_text()
