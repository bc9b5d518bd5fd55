"""The data-parallel benchmark's memory target, counted (not timed): two ZeRO-3 ranks each hold at most 0.6x
the parameter and optimiser bytes of one process, all three setups in fp32 - 6N bytes against 12N for N
parameters (a shard of the parameters and of the AdamW moments, the master weights sharing the shard's
buffer), and ZeRO-2 8N (whole parameters, a shard of the moments). And the command's table and files, from
the ranks' reports (stand-ins: no training)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from benchmarks import data_parallel
from tests.conftest import skip_without


@pytest.mark.deepspeed
@pytest.mark.slow
def test_zero3_ranks_hold_at_most_six_tenths_of_one_process(tmp_path):
    skip_without("agents", "torch", "transformers")
    skip_without("deepspeed", "deepspeed")
    from benchmarks.data_parallel import run

    common = ["--hidden", "128", "--layers", "2", "--steps", "1"]
    single = run("single", 1, ["--backend", "torch"], tmp_path, common)[0]["held_bytes"]
    zero2 = max(r["held_bytes"] for r in run("zero2", 2, ["--backend", "deepspeed", "--zero", "2"], tmp_path, common))
    zero3 = max(r["held_bytes"] for r in run("zero3", 2, ["--backend", "deepspeed", "--zero", "3"], tmp_path, common))
    assert zero3 <= 0.6 * single
    assert zero3 / single == pytest.approx(6 / 12, abs=0.01) and zero2 / single == pytest.approx(8 / 12, abs=0.01)


def test_the_command_prints_and_writes_one_row_per_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    mib = 2**20
    reports = {"single": [{"params": 2_500_000, "step_s": 1.5, "held_bytes": 12 * mib, "peak_rss_bytes": 300 * mib, "losses": [0.5, 0.25]}],
               "zero2": [{"params": 2_500_000, "step_s": s, "held_bytes": h * mib, "peak_rss_bytes": 200 * mib, "losses": [0.5, 0.25]}
                         for s, h in ((1.0, 8), (1.25, 7))],
               "zero3": [{"params": 2_500_000, "step_s": 2.0, "held_bytes": 6 * mib, "peak_rss_bytes": r * mib, "losses": [0.5, 0.25]}
                         for r in (150, 180)]}
    calls = []

    def run(label: str, ranks: int, extra, out: Path, common) -> list[dict]:
        calls.append((label, ranks, tuple(extra), list(common)))
        return reports[label]

    monkeypatch.setattr(data_parallel, "run", run)
    argv = ["--hidden", "128", "--layers", "2", "--steps", "2", "--output-dir", str(tmp_path)]
    assert data_parallel.main(argv) == 0
    assert [(label, ranks) for label, ranks, _, _ in calls] == [("single", 1), ("zero2", 2), ("zero3", 2)]
    assert calls[2][2] == ("--backend", "deepspeed", "--zero", "3") and calls[0][3] == ["--hidden", "128", "--layers", "2", "--steps", "2"]
    out = capsys.readouterr().out
    assert "policy: 2.5M parameters; global batch 6 rows; medians of 1 updates" in out
    assert "2 ranks ZeRO-2           1.25                   8.0      0.67                200  0.500000 0.250000" in out
    saved = json.loads((tmp_path / "data_parallel.json").read_text(encoding="utf-8"))
    assert saved["command"] == "python -m benchmarks.data_parallel " + " ".join(argv) and saved["params"] == 2_500_000
    # the slowest rank's update, the fullest rank's bytes and its multiple of one process's, the largest peak
    assert [(s["setup"], s["ranks"], s["step_s"], s["held_mib"], s["held_x_single"], s["peak_rss_mib"]) for s in saved["setups"]] == [
        ("1 process (torch)", 1, 1.5, 12.0, 1.0, 300.0), ("2 ranks ZeRO-2", 2, 1.25, 8.0, 8 / 12, 200.0),
        ("2 ranks ZeRO-3", 2, 2.0, 6.0, 0.5, 180.0)]
    assert saved["ranks"]["2 ranks ZeRO-3"] == reports["zero3"]
    with open(tmp_path / "data_parallel.csv", encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["setup"], r["held_x_single"], r["losses"]) for r in rows][2] == ("2 ranks ZeRO-3", "0.5", "0.5 0.25")
    assert "| 2 ranks ZeRO-3 | 2 | 2 | 6 | 0.5 | 180.0 | 0.5 0.25 |" in (tmp_path / "data_parallel.md").read_text(encoding="utf-8")
