"""The learning benchmark through TRL: ``--quick`` runs the warm start, TRL's ``GRPOTrainer`` through the adapter
and our trainer from it, on the same questions, and writes the table, the curves and the figure (the warm
start's cache is tested in test_warm_start_cache.py). Skipped when TRL (an optional extra) is absent."""
import json
import math
import os

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "yaml")
skip_without("trl", "trl", "datasets")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from benchmarks import trl_learning  # noqa: E402

STEPS = 2


@pytest.mark.slow
def test_quick_trains_both_trainers_from_one_warm_start_and_reports_them(tmp_path, capsys):
    assert trl_learning.main(["--quick", "--steps", str(STEPS), "--output-dir", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert {"command", "date", "machine", "settings", "warm_start", "trainers", "summary", "same_questions"} <= set(results)
    assert results["settings"]["steps"] == STEPS and results["settings"]["quick"]
    assert results["same_questions"] is True  # both trained on the same questions, step by step
    per_step = results["settings"]["questions_per_step"]
    trainers = results["trainers"]
    assert set(trainers) == {"TRL", "ours"}
    for name, side in trainers.items():
        assert [s["step"] for s in side["steps"]] == list(range(1, STEPS + 1)), name
        assert all(len(s["questions"]) == per_step for s in side["steps"]), name
        # --quick evaluates before RL and after every step
        assert [p["step"] for p in side["curve"]] == list(range(STEPS + 1)), name
        for point in side["curve"]:
            assert 0.0 <= point["em_1hop"] <= 1.0 and 0.0 <= point["em_2hop"] <= 1.0, name
        assert all(s["reward"] is not None and math.isfinite(s["reward"]) for s in side["steps"]), name
    # One warm start: both trainers' evaluations before RL are of the same weights, by the same evaluation.
    assert trainers["TRL"]["curve"][0] == trainers["ours"]["curve"][0]
    # TRL trained: its loss and gradient were not all zero (the adapter's rewards and masks reached the update).
    trl_steps = trainers["TRL"]["steps"]
    assert any(s["loss"] != 0 for s in trl_steps) and any(s["grad_norm"] > 0 for s in trl_steps)
    assert all(s["loss"] is not None and s["grad_norm"] is not None for side in trainers.values() for s in side["steps"])
    rows = {row["trainer"]: row for row in results["summary"]}
    assert set(rows) == {"TRL", "ours"}
    for row in rows.values():
        assert row["steps"] == STEPS
        for key in ("em_1hop_before", "em_2hop_before", "em_1hop_after", "em_2hop_after", "em_2hop_best"):
            assert 0.0 <= row[key] <= 1.0
    table = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "| TRL |" in table and "| ours |" in table
    assert (tmp_path / "results.png").stat().st_size > 0
    assert not results["warm_start"]["reused"] and results["warm_start"]["policy_dir"].startswith(str(tmp_path / "warm_start"))

