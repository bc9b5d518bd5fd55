"""The real-model benchmark: its bootstrap against hand-worked and normal-approximation values, its rows and
table from harness episodes written here, the committed record's shape, and every stage at --quick on
SmolLM2 and the real data (slow)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks.common.real_model_report import (
    OUTCOMES, bootstrap_average, episode_outcome, format_outcomes, format_table, paired_difference, read_jsonl, read_rows,
    step_differences,
)
from search_env.data.splits import HELD_OUT_SETS

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "benchmarks" / "results" / "real_model"
ROLES = {"baseline", "untrained", "cold-start", "trained", "trained-empty-source"}


def test_the_average_weighs_every_set_the_same_and_a_constant_set_has_no_spread():
    result = bootstrap_average([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0]], reps=200)
    assert result == {"mean": 0.5, "ci_low": 0.5, "ci_high": 0.5}  # pooled over questions it would be 4/6


def test_the_interval_matches_the_normal_approximation():
    """One set of 400 questions with EM 0.25: 0.25 +- 1.96 sqrt(0.25 x 0.75 / 400) = 0.25 +- 0.0424; two sets:
    the mean of their means, with the variance of each mean added and divided by 4."""
    one = [1.0] * 100 + [0.0] * 300
    result = bootstrap_average([one], reps=4000, seed=3)
    half = 1.96 * math.sqrt(0.25 * 0.75 / 400)
    assert result["mean"] == 0.25
    assert result["ci_low"] == pytest.approx(0.25 - half, abs=0.006) and result["ci_high"] == pytest.approx(0.25 + half, abs=0.006)
    other = [1.0] * 160 + [0.0] * 40  # EM 0.8 over 200
    both = bootstrap_average([one, other], reps=4000, seed=4)
    half = 1.96 * math.sqrt(0.25 * 0.75 / 400 + 0.8 * 0.2 / 200) / 2
    assert both["mean"] == pytest.approx(0.525)
    assert both["ci_low"] == pytest.approx(0.525 - half, abs=0.006) and both["ci_high"] == pytest.approx(0.525 + half, abs=0.006)


def test_an_empty_set_is_refused():
    with pytest.raises(ValueError, match="at least one question"):
        bootstrap_average([[1.0], []])


def _episode(dataset: str, agent: str, em: float, searches: float, *, end: str = "answer", results: str = "") -> dict:
    text = f"<search> q </search><information>{results}</information><answer> a </answer>" if searches else "<answer> a </answer>"
    return {"dataset": dataset, "agent": agent, "metrics": {"em": em, "f1": em, "cover_em": em, "searches": searches},
            "protocol": "search-r1", "end_reason": end, "golden_answers": ["New York"], "text": text}


def test_each_wrong_episode_is_told_apart_by_where_it_went_astray():
    assert episode_outcome(_episode("nq", "a", 1.0, 0)) == "right"
    assert episode_outcome(_episode("nq", "a", 0.0, 1, end="max_new_tokens", results="New York")) == "no answer"
    assert episode_outcome(_episode("nq", "a", 0.0, 0)) == "no search"
    assert episode_outcome(_episode("nq", "a", 0.0, 1, results="Doc 1 (Title: Boston) a city")) == "not retrieved"
    assert episode_outcome(_episode("nq", "a", 0.0, 2, results="Doc 1 (Title: NYC) new york, a city")) == "misread"
    # the gold in the question or the answer, outside the result tags, is not a retrieved one
    outside = _episode("nq", "a", 0.0, 1, results="Boston")
    outside["text"] = "Question: is it New York? " + outside["text"] + " New York"
    assert episode_outcome(outside) == "not retrieved"


def test_rows_from_harness_episodes(tmp_path):
    sets = ["nq@held-out", "popqa@held-out"]
    episodes = [_episode("nq@held-out", "hf:m", 1.0, 1), _episode("nq@held-out", "hf:m", 0.0, 0),
                _episode("popqa@held-out", "hf:m", 1.0, 2), _episode("nq@held-out", "direct:m", 0.0, 0),
                _episode("hotpotqa@held-out", "hf:m", 0.0, 1)]  # not one of the table's sets: left out
    path = tmp_path / "episodes.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in episodes), encoding="utf-8")
    rows = read_rows(read_jsonl(path), [("trained", "trained", "hf:m"), ("direct", "baseline", "direct:m")], sets)
    assert [row.name for row in rows] == ["trained"]  # direct has no popqa episode yet: left out
    row = rows[0]
    assert row.per_set["nq@held-out"]["em"] == 0.5 and row.per_set["popqa@held-out"]["questions"] == 1.0
    assert row.average["em"]["mean"] == 0.75  # (0.5 + 1.0) / 2
    assert row.searches_per_episode == 1.0 and row.no_search_share == pytest.approx(1 / 3)
    assert row.outcomes == {"right": 2 / 3, "no answer": 0.0, "no search": 1 / 3, "not retrieved": 0.0, "misread": 0.0}
    record = row.as_record()
    assert record["avg_em"] == 0.75 and record["role"] == "trained" and set(record["per_set"]) == set(sets)
    assert record["outcomes"] == row.outcomes
    # per set: nq's two questions (1, 0) resample to 0, 0.5 or 1; popqa's one question has no spread
    nq, popqa = row.per_set["nq@held-out"], row.per_set["popqa@held-out"]
    assert (nq["em_ci_low"], nq["em_ci_high"], popqa["f1_ci_low"], popqa["f1_ci_high"]) == (0.0, 1.0, 1.0, 1.0)
    table = format_table(rows, sets)
    assert "| trained | trained | 0.500 | 1.000 | 0.750 [" in table and "| nq | popqa | avg EM [95% CI] | avg F1 |" in table
    with_intervals = format_table(rows, sets, "f1", intervals=True)
    assert "| trained | trained | 0.500 [0.00, 1.00] | 1.000 [1.00, 1.00] | 0.750 [" in with_intervals
    assert with_intervals.splitlines()[0].endswith("| avg F1 [95% CI] |")
    assert format_outcomes(rows).splitlines()[2] == "| trained | 0.67 | 0.00 | 0.33 | 0.00 | 0.00 |"
    assert format_outcomes(rows).splitlines()[0] == "| system | " + " | ".join(OUTCOMES) + " |"


def test_a_paired_difference_resamples_each_question_s_two_scores_together():
    def played(agent: str, ems: dict[tuple[str, str], float]) -> list[dict]:
        return [{"dataset": s, "example_id": q, "agent": agent, "metrics": {"em": em}} for (s, q), em in ems.items()]

    # nq: a right on q1 and q2, b right on q2 only -> differences 1, 0; popqa: both right on q3 -> 0; q9 only a played
    a = played("a", {("nq", "q1"): 1.0, ("nq", "q2"): 1.0, ("popqa", "q3"): 1.0, ("popqa", "q9"): 1.0})
    b = played("b", {("nq", "q1"): 0.0, ("nq", "q2"): 1.0, ("popqa", "q3"): 1.0})
    gain = paired_difference(a, "a", b, "b", ["nq", "popqa"])
    assert gain["mean"] == 0.25 and gain["ci_low"] == 0.0 and gain["ci_high"] == 0.5  # (0.5 + 0) / 2; nq resamples 0..1
    # the same scores on every question: no difference and no spread, however wide each row's own interval is
    ten = {("nq", f"q{i}"): float(i % 2) for i in range(10)}
    assert paired_difference(played("a", ten), "a", played("b", ten), "b", ["nq"]) == {"mean": 0.0, "ci_low": 0.0, "ci_high": 0.0}
    with pytest.raises(ValueError, match="at least one question"):
        paired_difference(a, "a", b, "b", ["nq", "hotpotqa"])


def _metrics(tmp_path: Path, name: str, entries: list[dict]) -> Path:
    (tmp_path / name).mkdir()
    (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    return tmp_path / name


def test_a_reproduction_matches_the_record_bit_for_bit_machine_keys_aside(tmp_path, capsys):
    from benchmarks import real_model

    record = [{"step": 0, "stage": "start", "eval/greedy/em": 0.0},
              {"step": 0, "stage": "warm start", "warm_start/loss_last": 0.5, "warm_start/seconds": 700.0,
               "warm_start/threads": 2.0},
              {"step": 1, "reward": 0.25, "loss/total": 0.1, "time/step": 300.0, "tokens_per_s": 9.0},
              {"step": 2, "reward": 0.5, "loss/total": 0.2, "time/step": 310.0, "tokens_per_s": 9.0}]
    same = [dict(record[0]), {**record[1], "warm_start/seconds": 900.0, "warm_start/threads": 1.0},
            {**record[2], "time/step": 100.0, "tokens_per_s": 30.0}]
    assert step_differences(record, same) == []
    off = [dict(record[0]), {**record[2], "loss/total": 0.1 + 2e-16}, {"step": 3, "reward": 0.0}]  # a last-bit change
    assert step_differences(record, off) == [
        "step 1 (update) loss/total: 0.1000000000000002 here, 0.1 in the record", "step 3 (update): not in the record"]
    missing = [{**record[2], "extra": 1}]
    assert step_differences(record, missing) == ["step 1 (update) extra: 1 here, None in the record"]
    # the command line: exit 0 and a verdict when the steps match, 1 and each difference when not
    recorded = _metrics(tmp_path, "record", record)
    with pytest.raises(SystemExit) as ok:
        real_model.main(["--reproduces", str(_metrics(tmp_path, "same", same)), "--record", str(recorded)])
    assert ok.value.code == 0 and "steps 0-1" in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:
        real_model.main(["--reproduces", str(_metrics(tmp_path, "off", off)), "--record", str(recorded)])
    assert bad.value.code == 1 and "loss/total" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="does not exist"):
        real_model.main(["--reproduces", str(tmp_path / "nowhere"), "--record", str(recorded)])


def check_summary(summary: dict, metrics_lines: list[str]) -> None:
    """The shape of a real-model record: the command and one row per system with its role and numbers."""
    command = summary["command"]
    assert isinstance(command, list) and command[:3] == ["python", "-m", "agents.train"]
    assert summary["rows"], "no rows"
    for row in summary["rows"]:
        assert row["role"] in ROLES and isinstance(row["name"], str)
        assert row["ci_low"] <= row["avg_em"] <= row["ci_high"]
        assert row["searches_per_episode"] >= 0
        assert set(row["per_set"]) == {f"{s}@held-out" for s in HELD_OUT_SETS}
    for difference in summary["differences"]:
        assert -1 <= difference["ci_low"] <= difference["ci_high"] <= 1 and isinstance(difference["name"], str)
    assert metrics_lines and all("step" in json.loads(line) for line in metrics_lines)


def test_the_committed_record_has_its_shape():
    if not (RECORD / "summary.json").is_file():
        pytest.skip(f"no record committed yet in {RECORD}: python -m benchmarks.real_model --record {RECORD.relative_to(REPO)}")
    summary = json.loads((RECORD / "summary.json").read_text())
    check_summary(summary, (RECORD / "metrics.jsonl").read_text().splitlines())
    assert {row["role"] for row in summary["rows"]} == ROLES  # every row of the table was played


def test_the_readme_quotes_the_committed_record():
    """The README's real-model table and RL's paired gain are the record's numbers, so a new record without
    a new README (or the reverse) fails here."""
    if not (RECORD / "summary.json").is_file():
        pytest.skip(f"no record committed yet in {RECORD}")
    summary = json.loads((RECORD / "summary.json").read_text())
    readme = (REPO / "README.rst").read_text(encoding="utf-8")
    section = readme[readme.index("A pretrained model on real questions"):readme.index(".. real-model-gpu-start")]
    for row in summary["rows"]:
        assert f'{row["avg_em"]:.3f} [{row["ci_low"]:.3f}, {row["ci_high"]:.3f}]' in section, row["name"]
        assert f'"{row["average"]["f1"]["mean"]:.3f}"' in section, row["name"]
    rl = next(d for d in summary["differences"] if d["name"] == "RL over the cold start")
    assert f"{rl['avg_em']:+.3f} [{rl['ci_low']:+.3f}, {rl['ci_high']:+.3f}]" in " ".join(section.split())


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_quick_runs_every_stage_and_resumes(tmp_path, shared_data, monkeypatch):
    """--quick on SmolLM2 and the real split: baselines, cold start and RL, the trained policy with and without
    a source, and the report; then the same command again finds every stage done."""
    from benchmarks import real_model

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("SEARCHQA_DATA", str(shared_data))
    out, record = tmp_path / "out", tmp_path / "record"
    argv = ["--quick", "--output-dir", str(out), "--record", str(record),
            "--set", f"data.corpus={shared_data / 'corpus.jsonl'}"]
    real_model.main(argv)
    summary = json.loads((out / "summary.json").read_text())
    check_summary(summary, (record / "metrics.jsonl").read_text().splitlines())
    assert {row["role"] for row in summary["rows"]} == ROLES
    assert [d["name"] for d in summary["differences"]] == [name for name, _, _ in real_model.DIFFERENCES]
    assert (out / "run" / "warm_start_policy" / "config.json").is_file() and (out / "training.png").is_file()
    empty = next(row for row in summary["rows"] if row["role"] == "trained-empty-source")
    assert all(s["searches"] >= 0 for s in empty["per_set"].values())
    episodes = (out / "eval" / "empty" / "episodes.jsonl").read_text().splitlines()
    calls = [call for line in episodes for call in json.loads(line)["tool_calls"]]
    assert all(call["passage_ids"] == [] for call in calls)
    steps = len((out / "run" / "metrics.jsonl").read_text().splitlines())
    real_model.main(argv)  # everything done: nothing is trained or played again
    assert len((out / "run" / "metrics.jsonl").read_text().splitlines()) == steps
    assert np.isclose(json.loads((out / "summary.json").read_text())["rows"][0]["avg_em"], summary["rows"][0]["avg_em"])
