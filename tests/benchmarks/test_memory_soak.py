"""The memory soak (:mod:`benchmarks.memory_soak`) runs a few tiny steps with the environment worker and
reports both processes' memory; the figures themselves are the benchmark's business."""
from __future__ import annotations

import csv
import json
import math

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")


@pytest.mark.timeout(300)
def test_the_soak_samples_the_trainer_and_its_worker(tmp_path, capsys):
    from benchmarks.memory_soak import main

    out = tmp_path / "soak.json"
    argv = ["--steps", "4", "--every", "2", "--tracemalloc", "--json", str(out), "--output-dir", str(tmp_path / "out")]
    result = main(argv)
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    saved = json.loads((tmp_path / "out" / "memory_soak.json").read_text())
    assert saved["command"] == "python -m benchmarks.memory_soak " + " ".join(argv) and saved["machine"]["cores"] >= 1
    assert saved["samples"] == json.loads(json.dumps(result["samples"])) and saved["growth_per_100_steps"] == result["growth_per_100_steps"]
    with open(tmp_path / "out" / "memory_soak.csv", encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in rows] == [1, 2, 4] and float(rows[-1]["trainer_rss_mb"]) == result["samples"][-1]["trainer_rss_mb"]
    table = (tmp_path / "out" / "memory_soak.md").read_text()
    assert "| figure | steps 1-1 | steps 1-2 | steps 2-3 | steps 3-4 |" in table and "| objects | " in table
    assert (tmp_path / "out" / "memory_soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # matplotlib: in the agents extra
    assert [s["step"] for s in result["samples"]] == [1, 2, 4]
    for sample in result["samples"]:
        assert sample["trainer_rss_mb"] > 0 and sample["objects"] > 0
        assert not math.isnan(sample["worker_rss_mb"]) and sample["worker_rss_mb"] >= sample["worker_uss_mb"] > 0
    assert set(result["growth_per_100_steps"]) == {"trainer_rss_mb", "trainer_uss_mb", "worker_rss_mb", "worker_uss_mb", "objects"}
    assert all(len(values) == 4 for values in result["growth_per_100_steps"].values())
    assert result["tracemalloc"]  # allocations listed between the two snapshots
    assert "growth per 100 steps" in capsys.readouterr().out
