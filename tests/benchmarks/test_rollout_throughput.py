"""The rollout throughput benchmark's command line, on the scripted searching model with the HF sampler
(the vLLM engine needs its own virtualenv; ``tests/agents/rollout/test_vllm_engine.py`` runs it)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
from benchmarks.rollout_throughput import main  # noqa: E402


def test_every_row_splits_the_rollout_time_of_episodes_that_searched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "scripted", "--engines", "hf", "--batch-sizes", "2", "4", "--repeats", "1", "--threads", "1",
            "--output-dir", str(tmp_path)]
    result = main(argv)
    rows = result["rows"]
    assert [(row["engine"], row["batch"]) for row in rows] == [("hf", 2), ("hf", 4)]
    for row in rows:
        # Search-R1's scripted episode: <search> studied </search>, results, <answer> yes </answer>.
        assert row["searches"] == 1.0 and row["tokens"] == 6 * row["batch"]
        parts = [row["generation"], row["env"], row["search"]]
        assert min(parts) >= 0 and 0 < sum(parts) <= 1
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("hf ")]
    assert len(printed) == 2 and all("generation" in line and "1.00 searches/episode" in line for line in printed)
    saved = json.loads((tmp_path / "rollout_throughput.json").read_text(encoding="utf-8"))
    assert saved["command"] == "python -m benchmarks.rollout_throughput " + " ".join(argv) and saved["rows"] == rows
    with open(tmp_path / "rollout_throughput.csv", encoding="utf-8", newline="") as handle:
        written = list(csv.DictReader(handle))
    assert [(r["engine"], r["batch"], float(r["tokens"]), float(r["searches"])) for r in written] == [("hf", "2", 12, 1), ("hf", "4", 24, 1)]
    assert "| hf | 4 | " in (tmp_path / "rollout_throughput.md").read_text(encoding="utf-8")


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert " ".join(capsys.readouterr().out.split()).count("(default: ") >= 6
