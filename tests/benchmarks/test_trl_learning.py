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
    assert {"command", "date", "machine", "settings", "warm_start", "runs", "summary", "same_questions"} <= set(results)
    assert results["settings"]["steps"] == STEPS and results["settings"]["quick"] and results["settings"]["seeds"] == [0]
    assert results["same_questions"] is True  # both trained on the same questions, step by step
    per_step = results["settings"]["questions_per_step"]
    (seed_run,) = results["runs"]
    assert seed_run["seed"] == 0 and seed_run["same_questions"] is True
    trainers = seed_run["trainers"]
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
    assert set(rows) == {"TRL", "ours"} and len(results["summary"]) == 2  # one seed: no median rows
    for row in rows.values():
        assert row["steps"] == STEPS and row["seed"] == 0
        for key in ("em_1hop_before", "em_2hop_before", "em_1hop_after", "em_2hop_after", "em_2hop_best"):
            assert 0.0 <= row[key] <= 1.0
    table = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "| TRL |" in table and "| ours |" in table
    assert (tmp_path / "results.png").stat().st_size > 0
    assert not results["warm_start"]["reused"] and results["warm_start"]["policy_dir"].startswith(str(tmp_path / "warm_start"))



def test_several_seeds_add_each_trainers_median_row():
    def side(em_after, seconds):
        return {"curve": [{"step": 0, "em_1hop": 1.0, "em_2hop": 0.0}, {"step": 5, "em_1hop": 0.9, "em_2hop": em_after}],
                "steps": [{"step": i, "reward": 0.5, "seconds": seconds} for i in range(1, 6)], "minutes": seconds * 5 / 60}

    settings = {"questions_per_step": 8, "group_size": 8}
    runs = [{"seed": seed, "trainers": {"TRL": side(trl, 2.0 + seed), "ours": side(ours, 1.0)}}
            for seed, trl, ours in ((0, 0.2, 0.9), (1, 0.6, 0.7), (2, 0.4, 0.8))]
    rows = trl_learning.summary_rows({"settings": settings, "runs": runs})
    assert [(row["trainer"], row["seed"]) for row in rows] == [
        ("TRL", 0), ("TRL", 1), ("TRL", 2), ("TRL", "median"), ("ours", 0), ("ours", 1), ("ours", 2), ("ours", "median")]
    medians = {row["trainer"]: row for row in rows if row["seed"] == "median"}
    assert medians["TRL"]["em_2hop_after"] == 0.4 and medians["ours"]["em_2hop_after"] == 0.8
    assert medians["TRL"]["s_per_step"] == 3.0 and medians["TRL"]["em_2hop_before"] == 0.0
    assert rows[0]["episodes_per_step"] == 64 and rows[0]["em_2hop_best"] == 0.2
