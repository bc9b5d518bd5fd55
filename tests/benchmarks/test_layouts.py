"""benchmarks.layouts: the figures of a row from hand-made parameters and metrics, the layouts a subset needs,
the table and the one-line errors; and one quick run of the one-process reference against 2 ZeRO-2 ranks with the
HF sampler, which must end at the one process's parameters (every other layout has its own test elsewhere)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.layouts import (LAYOUTS, MAX_REL_DIFF, chosen_layouts, error_line, layout_row, param_rel_diff,
                                results_markdown, step_seconds, sync_gap)
from tests.conftest import REPO_ROOT, skip_without


def test_param_rel_diff_is_the_distance_over_the_references_update():
    skip_without("torch")
    import torch

    initial = {"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([1.0])}
    reference = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([5.0])}  # update (3, 0, 4): norm 5
    params = {"a": torch.tensor([3.0, 1.0]), "b": torch.tensor([5.0])}  # 1 away from the reference
    assert param_rel_diff(params, reference, initial) == pytest.approx(0.2)
    assert param_rel_diff(reference, reference, initial) == 0.0
    with pytest.raises(ValueError, match="update is zero"):
        param_rel_diff(params, initial, initial)
    with pytest.raises(ValueError, match="different tensors"):
        param_rel_diff({"a": params["a"]}, reference, initial)


def test_step_time_and_sync_gap_from_metrics():
    records = [{"step": 1, "time/step": 9.0, "rollout/sync_gap": 3e-6, "rollout/sync_gap_rank0": 3e-6, "rollout/sync_gap_rank1": 5e-6},
               {"step": 2, "time/step": 2.0, "rollout/sync_gap": 1e-7},
               {"step": 3, "time/step": 4.0},
               {"step": 3, "stage": "final", "eval/greedy/em": 0.5}]
    assert step_seconds(records) == 3.0  # the median of steps 2 and 3; step 1 warms up
    assert step_seconds(records[:1]) is None
    assert sync_gap(records) == 5e-6
    assert sync_gap([{"step": 1, "time/step": 1.0}]) is None  # the HF sampler has no sync


def test_rows_and_table():
    records = [{"time/step": 5.0, "rollout/sync_gap_rank1": 2e-6}, {"time/step": 0.5}, {"time/step": 0.7}]
    good = layout_row("zero3-vllm", LAYOUTS["zero3-vllm"], ok=True, records=records, rel_diff=1.5e-5, peak_rss_mb=[1250.04, 1261.0])
    assert good == {"layout": "zero3-vllm", "ranks": 2, "backend": "ZeRO-3", "engine": "vllm", "max_staleness": 0, "ok": True,
                    "error": None, "reference": "one-vllm", "param_rel_diff": 1.5e-5, "sync_gap": 2e-6, "step_s": 0.6,
                    "peak_rss_mb": [1250.0, 1261.0]}
    refused = layout_row("zero2-server-stale1", LAYOUTS["zero2-server-stale1"], ok=False, error="rollout.max_staleness 1 runs on one process")
    assert (refused["reference"], refused["param_rel_diff"], refused["step_s"], refused["max_staleness"]) == (None, None, None, 1)
    table = results_markdown([good, refused]).splitlines()
    assert table[0].startswith("| layout | ranks | backend | engine | max_staleness | ok | param_rel_diff |")
    assert table[2] == "| zero3-vllm | 2 | ZeRO-3 | vllm | 0 | True | 1.5e-05 | one-vllm | 2e-06 | 0.6 | 1,250 1,261 | - |"
    assert table[3].endswith("| False | - | - | - | - | - | rollout.max_staleness 1 runs on one process |")


def test_a_subset_runs_the_references_it_needs_in_order():
    assert chosen_layouts(["fsdp-vllm", "zero2-hf"]) == ["one-hf", "one-vllm", "zero2-hf", "fsdp-vllm"]
    assert chosen_layouts(["zero2-server-stale1"]) == ["zero2-server-stale1"]  # not compared: one step behind
    assert chosen_layouts(None) == list(LAYOUTS)


def test_a_failed_runs_line_is_the_trainers_error():
    output = "loading\n[rank1]: error: rollout.engine vllm-server serves one trainer process\nTraceback...\nChildFailedError\n"
    assert error_line(output, 1) == "rollout.engine vllm-server serves one trainer process"
    assert error_line("a\nKilled\n\n", -9) == "exit -9: Killed"


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.timeout(600)
def test_two_zero2_ranks_end_at_the_one_process_update(tmp_path):
    skip_without("agents", "torch", "safetensors", "deepspeed")
    done = subprocess.run([sys.executable, "-m", "benchmarks.layouts", "--quick", "--layouts", "one-hf", "zero2-hf",
                           "--python", sys.executable, "--output-dir", str(tmp_path)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = {row["layout"]: row for row in json.loads((tmp_path / "results.json").read_text())["rows"]}
    assert list(rows) == ["one-hf", "zero2-hf"] and all(row["ok"] for row in rows.values())
    two = rows["zero2-hf"]
    assert two["reference"] == "one-hf" and two["param_rel_diff"] < MAX_REL_DIFF
    assert two["step_s"] > 0 and len(two["peak_rss_mb"]) == 2 and min(two["peak_rss_mb"]) > 100
    assert len(rows["one-hf"]["peak_rss_mb"]) == 1 and rows["one-hf"]["param_rel_diff"] is None
    assert "| zero2-hf | 2 | ZeRO-2 | hf |" in (tmp_path / "table.md").read_text()
