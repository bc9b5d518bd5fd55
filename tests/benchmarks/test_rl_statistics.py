"""The aggregate statistics of the RL benchmark against values worked out by hand on small arrays, and the
bootstrap against a plain-loop re-implementation driven by the same generator."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.common.rl_statistics import (
    Interval,
    iqm,
    performance_profile,
    probability_of_improvement,
    stratified_bootstrap_ci,
)


def test_iqm_cuts_a_quarter_from_each_end_without_fractional_weights() -> None:
    # 1..8 sorted: cut floor(8/4) = 2 from each end -> 3 4 5 6, mean 4.5
    assert iqm(list(range(1, 9))) == 4.5
    # the same scores as 4 runs x 2 tasks: all runs and tasks pooled
    assert iqm([[1, 5], [2, 6], [3, 7], [4, 8]]) == 4.5
    # 1..5: cut floor(5/4) = 1 from each end -> 2 3 4, mean 3
    assert iqm([5, 1, 4, 2, 3]) == 3.0
    # an outlier: 1 2 3 100 -> 2 3, mean 2.5 (the mean would be 26.5)
    assert iqm([100, 1, 2, 3]) == 2.5
    # three runs: floor(3/4) = 0 cut, the plain mean (1 + 2 + 9) / 3 = 4
    assert iqm([1, 2, 9]) == 4.0
    with pytest.raises(ValueError, match="finite"):
        iqm([1.0, float("nan")])


def test_iqm_agrees_with_scipy_trim_mean() -> None:
    stats = pytest.importorskip("scipy.stats")
    scores = np.random.default_rng(3).normal(size=(7, 3))
    assert iqm(scores) == pytest.approx(stats.trim_mean(scores, 0.25, axis=None))


def test_probability_of_improvement_counts_ties_as_half() -> None:
    # x = 1 2 3, y = 2 2: the six pairs give 0 0 (1 < 2), 1/2 1/2 (ties), 1 1 (3 > 2): 3 / 6
    assert probability_of_improvement([1, 2, 3], [2, 2], reps=10).value == 0.5
    # x = 3 4, y = 1 3: (3,1) 1, (3,3) 1/2, (4,1) 1, (4,3) 1 -> 3.5 / 4
    assert probability_of_improvement([3, 4], [1, 3], reps=10).value == 0.875
    # a second task where x = 0 0 is below y = 1 1 on every pair (0): mean over tasks (0.875 + 0) / 2
    assert probability_of_improvement([[3, 0], [4, 0]], [[1, 1], [3, 1]], reps=10).value == 0.4375
    # every resample of x above every resample of y: the interval is [1, 1]
    assert probability_of_improvement([5, 6, 7], [1, 2], reps=200) == Interval(1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="same tasks"):
        probability_of_improvement([[1, 2]], [[1]])


def test_a_bootstrap_of_three_runs_has_the_hand_worked_percentiles() -> None:
    # runs 0 0 1, statistic the mean: a resample's mean is k/3 with k ~ Binomial(3, 1/3):
    # P(0) = 8/27 = .296, P(1/3) = 12/27, P(2/3) = 6/27, P(1) = 1/27 = .037.
    # 2.5th percentile: P(0) > .025 -> 0; 97.5th: P(< 1) = 26/27 = .963 < .975 -> 1; median: 1/3
    ci = stratified_bootstrap_ci([0, 0, 1], np.mean, reps=4000, seed=0)
    assert ci.value == pytest.approx(1 / 3) and (ci.low, ci.high) == (0.0, 1.0)
    middle = stratified_bootstrap_ci([0, 0, 1], np.mean, reps=4000, confidence=0.01, seed=0)
    assert middle.low == pytest.approx(1 / 3) and middle.high == pytest.approx(1 / 3)
    # one run per task: every resample is the run itself
    assert stratified_bootstrap_ci([[0.4, 0.6]], reps=50) == Interval(0.5, 0.5, 0.5)


def _linear_percentile(values: list[float], q: float) -> float:
    """numpy's default ("linear") percentile, by hand: position q/100 * (n - 1) between sorted values."""
    ordered = sorted(values)
    position = q / 100 * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


def _iqm_by_hand(values: list[float]) -> float:
    ordered = sorted(values)
    cut = len(ordered) // 4
    kept = ordered[cut:len(ordered) - cut]
    return sum(kept) / len(kept)


def test_the_stratified_bootstrap_matches_a_loop_that_resamples_each_task_s_runs() -> None:
    scores = [[0.1, 0.7], [0.4, 0.2], [0.9, 0.5]]  # 3 runs x 2 tasks
    reps, seed = 60, 7
    indices = np.random.default_rng(seed).integers(0, 3, size=(reps, 3, 2))  # the draws the function makes
    statistics = []
    for rep in range(reps):
        sample = []
        for run in range(3):
            for task in range(2):
                sample.append(scores[int(indices[rep, run, task])][task])  # a run of the same task
        statistics.append(_iqm_by_hand(sample))
    ci = stratified_bootstrap_ci(scores, reps=reps, seed=seed)
    assert ci.value == pytest.approx(_iqm_by_hand([v for row in scores for v in row]))  # (0.2+0.4+0.5+0.7)/4
    assert ci.value == pytest.approx(0.45)
    assert ci.low == pytest.approx(_linear_percentile(statistics, 2.5))
    assert ci.high == pytest.approx(_linear_percentile(statistics, 97.5))
    assert stratified_bootstrap_ci(scores, reps=reps, seed=seed) == ci  # the seed fixes it
    with pytest.raises(ValueError, match="reps"):
        stratified_bootstrap_ci(scores, reps=0)


def test_performance_profile_fractions_above_each_threshold() -> None:
    # 0.1 0.5 0.5 0.9: above 0 all four; above 0.5 only 0.9 (strictly above); above 0.9 none
    profile = performance_profile([0.1, 0.5, 0.5, 0.9], [0.0, 0.5, 0.9], reps=200)
    assert profile.fractions == [1.0, 0.25, 0.0]
    assert profile.low[0] == profile.high[0] == 1.0 and profile.low[2] == profile.high[2] == 0.0
    assert profile.low[1] <= 0.25 <= profile.high[1]
    # two tasks: above 0.5, task 1 has 1 of 2 runs (0.8), task 2 both (0.6 0.6): (1/2 + 1) / 2
    assert performance_profile([[0.2, 0.6], [0.8, 0.6]], [0.5], reps=10).fractions == [0.75]
    with pytest.raises(ValueError, match="taus"):
        performance_profile([0.1], [])


# --- the benchmark's per-run metrics and tables ----------------------------------------------------


def _record(algorithm: str, seed: int, ems: list[tuple[int, float]], episodes_per_step: int = 4):  # -> RunRecord
    from benchmarks.common.algorithm_runs import METRICS, RunRecord

    last = ems[-1][0]
    step_metrics = {name: 0.0 for name, (_, heldout) in METRICS.items() if not heldout}
    stages = ["start"] + [None] * (len(ems) - 2) + ["final"]
    return RunRecord(algorithm, seed, f"/runs/{algorithm}/{seed}",
                     steps=[{"step": s, **step_metrics, "episodes": s * episodes_per_step, "cpu_s": 3.0 * s}
                            for s in range(1, last + 1)],
                     evaluations=[{"step": s, "stage": stage, "heldout_em": em, "heldout_em_2hop": None}
                                  for (s, em), stage in zip(ems, stages)],
                     episodes=last * episodes_per_step)


def test_area_under_the_em_curve_and_steps_to_thresholds_by_hand() -> None:
    pytest.importorskip("torch")
    from benchmarks.common.algorithm_tables import area_under_curve, to_threshold

    # evaluations at steps 0, 2, 6 with EM 0, 0.6, 0.9: trapezoids 2 * (0 + 0.6) / 2 = 0.6 and
    # 4 * (0.6 + 0.9) / 2 = 3.0; area 3.6 over the span 6 -> 0.6
    run = _record("x", 0, [(0, 0.0), (2, 0.6), (6, 0.9)], episodes_per_step=8)
    assert area_under_curve(run) == pytest.approx(0.6)
    # EM 0.5 first reached at step 2 (16 episodes rolled out by then, 2 x 3 CPU s = 0.1 min), 0.8 at step 6
    # (48 episodes, 18 s = 0.3 min); 0.95 never
    assert to_threshold(run, 0.5) == {"step": 2, "episodes": 16, "cpu_minutes": pytest.approx(0.1)}
    assert to_threshold(run, 0.8) == {"step": 6, "episodes": 48, "cpu_minutes": pytest.approx(0.3)}
    assert to_threshold(run, 0.95) is None
    # a warm start already above the threshold reaches it at step 0, before any episode or CPU second
    assert to_threshold(_record("x", 0, [(0, 0.7), (1, 0.4)]), 0.5) == {"step": 0, "episodes": 0, "cpu_minutes": 0.0}
    # a record whose steps kept no CPU time still has its step and episodes
    for point in run.steps:
        del point["cpu_s"]
    assert to_threshold(run, 0.5) == {"step": 2, "episodes": 16, "cpu_minutes": None}
    assert area_under_curve(_record("x", 0, [(0, 0.7)])) is None  # one evaluation has no area


def test_the_share_of_episodes_without_a_search_is_recorded_and_tabled_per_algorithm() -> None:
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from benchmarks.common.algorithm_runs import AlgorithmCurve, RunRecord
    from benchmarks.common.algorithm_tables import format_table, summarize

    # the trainer's rollout/zero_search_frac of each step is what the record keeps
    curve = AlgorithmCurve(RunRecord("mute", 0, "/runs/mute/0"))
    for step, share in ((1, 0.5), (2, 1.0), (3, 1.0)):
        curve.on_update(SimpleNamespace(step=step), {"reward": 0.0, "searches": 1.0 - share, "rollout/zero_search_frac": share})
    assert [p["zero_search_frac"] for p in curve.record.steps] == [0.5, 1.0, 1.0]
    mute = _record("mute", 0, [(0, 0.0), (3, 0.0)])
    mute.steps = [{**p, **kept} for p, kept in zip(mute.steps, curve.record.steps)]
    searching = _record("searching", 0, [(0, 0.0), (3, 0.5)])  # zero_search_frac 0.0 at every step
    older = _record("older", 0, [(0, 0.0), (3, 0.5)])  # a record made before the share was kept
    for point in older.steps:
        del point["zero_search_frac"]
    rows = summarize([mute, searching, older], window=2, reps=50)
    assert [row["zero_search_frac"]["mean"] for row in rows] == [1.0, 0.0, None]  # the mean of the last 2 steps
    header, _, *lines = format_table(rows).splitlines()
    column = [cell.strip() for cell in header.split("|")].index("no-search share")
    assert [[cell.strip() for cell in line.split("|")][column] for line in lines] == ["1.00", "0.00", "-"]


def test_the_tables_carry_iqm_intervals_thresholds_and_improvements() -> None:
    pytest.importorskip("torch")
    from benchmarks.common.algorithm_tables import PROFILE_TAUS, format_improvements, format_table, improvements, profiles, summarize

    # "fast" reaches 0.8 by step 2 in both seeds, "slow" never: final EM 0.8 / 0.9 against 0.3 / 0.4
    records = [_record("fast", 0, [(0, 0.0), (2, 0.8), (4, 0.8)]), _record("fast", 1, [(0, 0.0), (2, 0.9), (4, 0.9)]),
               _record("slow", 0, [(0, 0.0), (2, 0.1), (4, 0.3)]), _record("slow", 1, [(0, 0.0), (2, 0.2), (4, 0.4)])]
    rows = summarize(records, window=1, reps=200)
    fast = rows[0]
    # two seeds: nothing is trimmed, the IQM is the mean (0.8 + 0.9) / 2; resamples lie within [0.8, 0.9]
    assert fast["heldout_em_iqm"]["value"] == pytest.approx(0.85)
    assert 0.8 <= fast["heldout_em_iqm"]["low"] <= fast["heldout_em_iqm"]["high"] <= 0.9
    # areas: seed 0 (2 * 0.4 + 2 * 0.8) / 4 = 0.6, seed 1 (2 * 0.45 + 2 * 0.9) / 4 = 0.675
    assert fast["heldout_em_auc"]["mean"] == pytest.approx(0.6375)
    assert fast["to_threshold"]["0.8"] == [{"step": 2, "episodes": 8, "cpu_minutes": pytest.approx(0.1)}] * 2
    assert rows[1]["to_threshold"]["0.5"] == [None, None]
    table = format_table(rows)
    assert "EM IQM [95% CI]" in table and "| 2, 2 |" in table and "| -, - |" in table and "| 0.10, 0.10 |" in table
    pairs = improvements(records, window=1, reps=200)
    # every fast run above every slow run, on the final EM and on the area: P = 1 in every resample
    assert pairs == [{"x": "fast", "y": "slow", "heldout_em": {"value": 1.0, "low": 1.0, "high": 1.0},
                      "heldout_em_auc": {"value": 1.0, "low": 1.0, "high": 1.0}}]
    assert "| fast | slow | 1.000 | 1.000 |" in format_improvements(pairs)
    curves = profiles(records, window=1, reps=50)
    # final EMs 0.8 0.9 (fast) and 0.3 0.4 (slow): above tau 0.35 one slow seed of two, above 0.85 one fast seed
    assert curves["slow"]["fractions"][PROFILE_TAUS.index(0.35)] == 0.5
    assert curves["fast"]["fractions"][PROFILE_TAUS.index(0.85)] == 0.5
    assert curves["fast"]["fractions"][PROFILE_TAUS.index(0.5)] == 1.0 and curves["slow"]["fractions"][-1] == 0.0
    # one seed of an algorithm: no pair to compare
    assert improvements(records[::2], window=1, reps=10) == [] and format_improvements([]) == ""
