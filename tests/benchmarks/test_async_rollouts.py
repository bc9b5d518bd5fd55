"""The async-rollout benchmark's table and files, from stand-in runs (no server: the runs themselves are the
trainer's, checked in tests/agents/rollout/test_async_server.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import async_rollouts


def steps(*rows: tuple[float, float, float]) -> list[dict[str, float]]:
    """Steps of (step time, rollout time, update time), 100 agent tokens each."""
    return [{"time/step": s, "tokens_per_s": 100 / s, "time/rollout": r, "time/update": u} for s, r, u in rows]


def test_a_row_is_the_median_of_the_steps_after_the_first():
    run = steps((9.0, 9.0, 9.0), (3.0, 1.0, 2.0), (5.0, 2.0, 2.5), (4.0, 1.5, 3.0))
    run[2]["time/update_waited"] = 0.5  # only one step has it: its median is its value
    row = async_rollouts.summarize("synchronous", "tiny", run)
    assert row["steps"] == 3 and row["step s"] == 4.0 and row["rollout s"] == 1.5 and row["update s"] == 2.5
    assert row["agent tokens/s"] == pytest.approx(25.0) and row["update waited s"] == 0.5
    assert row["engine idle s"] is None and row["sync s"] is None


def test_the_note_compares_the_step_with_the_longer_phase():
    rows = [async_rollouts.summarize("synchronous", "tiny", steps((1, 1, 1), (3.0, 1.0, 2.0))),
            async_rollouts.summarize("max_staleness 1", "tiny", steps((1, 1, 1), (2.4, 1.0, 2.0)))]
    assert async_rollouts.overlap_note(rows) == ["- tiny: 3.00 s -> 2.40 s per step (1.25x); the longer phase of a "
                                                 "synchronous step takes 2.00 s"]


def test_the_command_writes_one_row_per_model_and_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    class Server:
        urls = ["http://127.0.0.1:9"]
        closed = 0

        def close(self):
            Server.closed += 1

    monkeypatch.setattr(async_rollouts, "launch_server", lambda model, args, folder: Server())
    monkeypatch.setattr(async_rollouts, "run_mode", lambda model, k, url, args, folder:
                        steps((1.0, 0.5, 0.5), (2.0, 1.0, 1.0)) if k == 0 else steps((1.0, 0.5, 0.5), (1.25, 1.0, 1.0)))
    assert async_rollouts.main(["--vllm-python", "python", "--models", "tiny", "smollm2", "--steps", "2",
                                "--output-dir", str(tmp_path)]) == 0
    assert Server.closed == 2
    data = json.loads((tmp_path / "async_rollouts.json").read_text())
    assert [(r["model"], r["mode"], r["step s"]) for r in data["rows"]] == [
        ("tiny", "synchronous", 2.0), ("tiny", "max_staleness 1", 1.25),
        ("smollm2", "synchronous", 2.0), ("smollm2", "max_staleness 1", 1.25)]
    assert "(1.60x)" in (tmp_path / "async_rollouts.md").read_text()


def test_bad_arguments_are_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("SEARCHQA_VLLM_PYTHON", raising=False)
    for argv in (["--steps", "1", "--vllm-python", "python"], []):
        with pytest.raises(SystemExit) as caught:
            async_rollouts.main(argv)
        assert caught.value.code == 2
