"""The algorithm benchmark's ladder of tasks: every rung's runs pass the trainer's config checks, rung
selection and its one-line errors, probed data, the per-rung and summary outputs worked out by hand on
synthetic records, and a tiny ladder end to end (per-rung folders, a resumed ladder, --jobs 2 against 1)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.test_algorithms import AGENTS_EXTRA, TINY
from tests.conftest import skip_without

PNG = b"\x89PNG\r\n\x1a\n"


# --- the rungs ---------------------------------------------------------------------------------------


def test_every_rung_of_both_sizes_builds_runs_the_trainer_accepts_with_the_rungs_changes() -> None:
    skip_without(*AGENTS_EXTRA)
    from agents.training.run_checks import recipe_warnings
    from benchmarks.algorithms import VARIANTS, variant_config
    from benchmarks.common.ladder import LADDERS, RUNGS
    from benchmarks.learning import demo_config

    assert [r.name for r in RUNGS] == ["1hop", "2hop", "3hop", "distractors", "noisy"]
    for size in LADDERS.values():
        assert len(size.seeds) >= (3 if size.name == "quick" else 5) and size.budget
        for rung in RUNGS:
            base = demo_config([*(f"{k}={v}" for k, v in {**size.changes, **rung.changes}.items())])
            for variant in VARIANTS:
                config = variant_config(base, variant, seed=0, policy_dir="/cache/policy", output_dir="/out")
                config.validate()
                assert recipe_warnings(config) == [], (size.name, rung.name, variant.name)
            assert base.data.world_max_hops == {"1hop": 1, "3hop": 3}.get(rung.name, 2)
            assert base.env.top_k == (1 if rung.name == "distractors" else 2)
            assert (rung.probe is not None) == (rung.name == "noisy")


def test_rungs_are_selected_in_the_ladders_order_and_an_unknown_one_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    skip_without(*AGENTS_EXTRA)
    from benchmarks.algorithms import main
    from benchmarks.common.ladder import FULL, QUICK, RUNGS, select_rungs

    assert [r.name for r in select_rungs(["noisy", "1hop", "noisy"])] == ["1hop", "noisy"]
    assert select_rungs(None) == select_rungs(["all"]) == select_rungs(["all"], QUICK) == list(RUNGS)
    # a size's default rungs, in the ladder's order whatever the order they are listed in
    assert [r.name for r in select_rungs(None, QUICK)] == [r.name for r in RUNGS if r.name in QUICK.rungs]
    assert select_rungs(None, FULL) == list(RUNGS)
    for argv, message in ((["--ladder", "quick", "--rungs", "2hop", "5hop"],
                           "--rungs 5hop: no such rung; known: 1hop, 2hop, 3hop, distractors, noisy (or all)"),
                          (["--rungs", "2hop"], "--rungs selects rungs of --ladder quick|full"),
                          (["--ladder", "quick", "--quick"], "--quick and --ladder are two sizes"),
                          (["--ladder", "huge"], "invalid choice: 'huge'"),
                          (["--ladder", "quick", "--jobs", "0"], "--jobs must be >= 1")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and "Traceback" not in err, argv
        assert len(err.strip().splitlines()[-1]) < 200


def test_probed_data_wraps_every_training_and_held_out_source_and_closes_them() -> None:
    skip_without(*AGENTS_EXTRA)
    from agents.training.data import RunData
    from benchmarks.common.ladder import Probe, probed_data
    from search_env import BM25Source, ProbeSource

    closed = []

    class Closing(BM25Source):
        def close(self) -> None:
            closed.append(self.name)

    passages = [{"id": str(i), "title": f"t{i}", "text": f"the river {i} flows north"} for i in range(4)]
    train, held = Closing(passages, name="wiki"), Closing(passages, name="news")
    data = probed_data(RunData((["q"], {"wiki": train}), (["h"], {"news": held}), {"a": 1}), Probe("empty", 1.0), seed=3)
    assert data.train[0] == ["q"] and data.held_out[0] == ["h"] and data.settings == {"a": 1}
    for part, source in ((data.train, train), (data.held_out, held)):
        (name, probed), = part[1].items()
        assert isinstance(probed, ProbeSource) and probed.source is source and probed.name == name
        assert (probed.probe, probed.share, probed.seed) == ("empty", 1.0, 3)
        assert probed.search(["river"], k=2) == [[]]  # share 1: every query finds nothing
    data.close()
    assert sorted(closed) == ["news", "wiki"]


# --- the outputs on synthetic records -------------------------------------------------------------


def _record(algorithm: str, seed: int, em: list[float], steps: tuple[int, ...] = (0, 5, 10)):
    from benchmarks.common.algorithm_runs import RunRecord

    # every step costs 6 process CPU seconds (0.1 min)
    stages = ["start", *([None] * (len(steps) - 2)), "final"]
    return RunRecord(algorithm, seed, f"/runs/{algorithm}/{seed}",
                     steps=[{"step": s, "episodes": 4 * s, "cpu_s": 6.0 * s} for s in steps if s > 0],
                     evaluations=[{"step": s, "stage": st, "heldout_em": v, "heldout_em_2hop": None}
                                  for s, st, v in zip(steps, stages, em)], cpu_s=6.0 * steps[-1])


def test_the_em_band_is_the_mean_over_seeds_within_the_bootstrap_interval_worked_by_hand(tmp_path: Path) -> None:
    skip_without("matplotlib")
    from benchmarks.common.algorithm_report import em_band, plot_em_band

    records = [_record("a", 0, [0.0, 0.5, 1.0]), _record("a", 1, [0.0, 0.3, 0.6]), _record("b", 0, [0.2, 0.2, 0.2])]
    bands = em_band(records, reps=2000)
    assert bands["a"]["steps"] == [0.0, 5.0, 10.0]
    assert bands["a"]["mean"] == pytest.approx([0.0, 0.4, 0.8])
    # two seeds: a resample's mean is the lower one, the mid-point or the higher one (a quarter of the time
    # each extreme), so the 2.5% and 97.5% percentiles are the two seeds' values
    assert bands["a"]["low"] == pytest.approx([0.0, 0.3, 0.6]) and bands["a"]["high"] == pytest.approx([0.0, 0.5, 1.0])
    assert bands["b"] == {"steps": [0.0, 5.0, 10.0], "mean": [0.2] * 3, "low": [0.2] * 3, "high": [0.2] * 3}  # one seed
    # a step only one seed evaluated is left out of the mean
    uneven = em_band([_record("c", 0, [0.0, 0.5, 1.0]), _record("c", 1, [0.0, 1.0], steps=(0, 10))])
    assert uneven["c"]["steps"] == [0.0, 10.0] and uneven["c"]["mean"] == pytest.approx([0.0, 1.0])
    assert plot_em_band(bands, tmp_path / "band.png").read_bytes()[:8] == PNG


def test_the_ladder_summary_counts_seeds_that_never_reach_a_threshold_as_censored(tmp_path: Path) -> None:
    skip_without("matplotlib")
    from benchmarks.common.algorithm_report import format_ladder_table, ladder_summary, plot_ladder_summary, steps_to_threshold

    fast = [_record("fast", s, em) for s, em in enumerate([[0.1, 0.6, 0.9], [0.1, 0.5, 0.8], [0.1, 0.7, 0.9], [0.1, 0.2, 0.6]])]
    slow = [_record("slow", s, [0.1, 0.1, 0.2]) for s in range(4)]
    assert steps_to_threshold(fast[0], 0.5) == (5.0, True) and steps_to_threshold(fast[3], 0.8) == (11.0, False)
    untimed = _record("fast", 0, [0.1, 0.6, 0.9])
    for point in untimed.steps:
        del point["cpu_s"]
    rows = ladder_summary({"2hop": fast + slow, "1hop": fast[:1], "3hop": [untimed]}, reps=500)
    by = {(r["rung"], r["algorithm"]): r for r in rows}
    row = by[("2hop", "fast")]
    # steps to 0.5: 5, 5, 5, 10 -> the interquartile mean drops one from each end: (5 + 5) / 2
    assert row["steps_to_0.5"]["value"] == 5.0 and row["reached_0.5"] == 4
    # steps to 0.8: 10, 10, 10 and 11 (never: last step + 1) -> (10 + 10) / 2; three of four seeds reached it
    assert row["steps_to_0.8"]["value"] == 10.0 and row["reached_0.8"] == 3
    # CPU minutes at 0.1 per step: to 0.5, 0.5 0.5 0.5 1.0 -> 0.5; to 0.8, 1.0 for the three that reached it
    # and the censored seed's whole run (10 steps: 1.0) -> 1.0; a record without CPU times has none
    assert row["cpu_minutes_to_0.5"]["value"] == pytest.approx(0.5) and row["cpu_minutes_to_0.8"]["value"] == pytest.approx(1.0)
    assert by[("3hop", "fast")]["cpu_minutes_to_0.5"] is None and by[("3hop", "fast")]["steps_to_0.5"]["value"] == 5.0
    # areas (trapezoids over 10 steps): 0.55, 0.475, 0.6, 0.275 -> IQM of the middle two, 0.475 and 0.55
    assert row["auc"]["value"] == pytest.approx((0.475 + 0.55) / 2)
    assert row["auc"]["low"] <= row["auc"]["value"] <= row["auc"]["high"]
    assert by[("2hop", "slow")]["auc"] == {"value": pytest.approx(0.125), "low": pytest.approx(0.125), "high": pytest.approx(0.125)}
    assert by[("2hop", "slow")]["reached_0.5"] == 0 and by[("2hop", "slow")]["steps_to_0.5"]["value"] == 11.0
    table = format_ladder_table(rows)
    assert "| 2hop | fast | 4 | 0.51" in table and "(3/4) |" in table and table.count("\n") == len(rows) + 1
    # the CPU minutes say how many seeds reached the threshold, as the steps do; a record without CPU times has none
    assert "| 1.00 [1.00, 1.00] (3/4) |" in table and table.splitlines()[-1].endswith("| - | - |")
    assert plot_ladder_summary(rows, tmp_path / "ladder.png").read_bytes()[:8] == PNG


# --- the command ------------------------------------------------------------------------------------


def test_a_tiny_ladder_writes_a_folder_per_rung_and_a_summary_and_resumes(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    skip_without(*AGENTS_EXTRA)
    import agents.training.cpu_threads
    from benchmarks.algorithms import main

    # without --jobs, the command runs as many jobs as the cores other work leaves free: one, then two
    free = [1]
    monkeypatch.setattr(agents.training.cpu_threads, "free_cpu_cores", lambda own_threads=1: free[0])
    # a size's changes of one rung come after the rung's own and before --set
    import dataclasses

    import benchmarks.algorithms
    from benchmarks.common.ladder import QUICK

    sized = dataclasses.replace(QUICK, rung_changes={"1hop": {"env.top_k": 1}, "noisy": {"run.steps": 9}})
    monkeypatch.setattr(benchmarks.algorithms, "LADDERS", {"quick": sized})
    out = tmp_path / "out"
    argv = ["--ladder", "quick", "--rungs", "noisy", "1hop", "--algorithms", "grpo", "--seeds", "0", "1", "--bootstrap-reps", "50",
            "--policy-cache", str(tmp_path / "cache"), "--output-dir", str(out), "--set", *TINY]
    assert main(argv) == 0
    printed = capfd.readouterr().out
    # the quick ladder's seeds share seed 0's warm start (and every rung does)
    assert printed.startswith("4 runs (2 tasks x 2 seeds x 1 algorithms) after 1 warm start of 2 steps (seed 0, shared by every seed), "
                              "in 1 job")
    assert printed.count("warm start made") == 1
    for rung in ("1hop", "noisy"):
        assert f"[{rung}] grpo seed 1: starts, 2 questions x 2 per step, 2 steps" in printed
        for name in ("table.md", "table.csv", "runs.csv", "results.json"):
            assert (out / rung / name).stat().st_size > 0
        assert (out / rung / "heldout_em_band.png").read_bytes()[:8] == PNG
        results = json.loads((out / rung / "results.json").read_text())
        assert results["rung"]["name"] == rung and [(r["algorithm"], r["seed"]) for r in results["runs"]] == [("grpo", 0), ("grpo", 1)]
        assert all(Path(r["output_dir"]).parent.parent.parent == out / rung for r in results["runs"])
        assert results["warm_starts"]["0"] == results["warm_starts"]["1"]
        assert set(results["heldout_em_band"]) == {"grpo"}
    one_hop, noisy = (json.loads((out / rung / "results.json").read_text()) for rung in ("1hop", "noisy"))
    assert one_hop["config"]["data"]["world_max_hops"] == 1 and one_hop["rung"]["probe"] is None
    assert noisy["rung"]["probe"] == {"kind": "empty", "share": 0.3}
    assert one_hop["config"]["env"]["top_k"] == 1 and noisy["config"]["env"]["top_k"] == 2
    assert one_hop["rung"]["changes"] == {"data.world_max_hops": 1, "env.top_k": 1} and noisy["rung"]["changes"] == {"run.steps": 9}
    assert noisy["config"]["run"]["steps"] == 2  # --set wins
    ladder = json.loads((out / "ladder.json").read_text())
    assert [(r["rung"], r["algorithm"], r["seeds"]) for r in ladder["summary"]] == [("1hop", "grpo", 2), ("noisy", "grpo", 2)]
    assert (out / "ladder_auc.png").read_bytes()[:8] == PNG and "| noisy | grpo | 2 |" in (out / "ladder.md").read_text()
    # again, with two cores free (two spawned jobs): every run is taken from its folder
    free[0] = 2
    assert main(argv) == 0
    printed = capfd.readouterr().out
    assert "in 2 jobs ->" in printed.splitlines()[0] and printed.count("finished already") == 4
    assert "starts," not in printed and printed.count("reused from the cache") == 1


@pytest.mark.slow
def test_two_jobs_give_the_records_one_job_gives(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    skip_without(*AGENTS_EXTRA)
    from benchmarks.algorithms import main

    def records(jobs: int) -> list[dict]:
        out = tmp_path / f"jobs{jobs}"
        assert main(["--ladder", "quick", "--rungs", "2hop", "--algorithms", "grpo", "rloo", "--seeds", "0", "1", "--jobs", str(jobs),
                     "--policy-cache", str(tmp_path / "cache"), "--output-dir", str(out), "--set", *TINY]) == 0
        return json.loads((out / "2hop" / "results.json").read_text())["runs"]

    one, two = records(1), records(2)
    assert "in 2 jobs" in capsys.readouterr().out
    assert [(r["algorithm"], r["seed"]) for r in two] == [(r["algorithm"], r["seed"]) for r in one] == [
        ("grpo", 0), ("rloo", 0), ("grpo", 1), ("rloo", 1)]
    for a, b in zip(one, two):
        assert a["evaluations"] == b["evaluations"] and a["episodes"] == b["episodes"]
        # every step's numbers are equal, but for its CPU time (measured: it rises step by step in both)
        untimed = [[{k: v for k, v in p.items() if k != "cpu_s"} for p in r["steps"]] for r in (a, b)]
        assert untimed[0] == untimed[1]
        for r in (a, b):
            cpu = [p["cpu_s"] for p in r["steps"]]
            assert cpu == sorted(cpu) and cpu[0] > 0
