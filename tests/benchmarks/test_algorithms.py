"""The RL algorithm benchmark: its collapse rule on curves worked out by hand, equal sample budgets and
shared settings across the algorithms, the KL probe, and a --quick run whose tables agree with the runs'
own metrics.jsonl (its warm-start cache: test_warm_start_cache.py)."""
from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest

from benchmarks.common.collapse import collapse_step, rolling_mean
from tests.conftest import skip_without

AGENTS_EXTRA = ("agents", "torch", "transformers", "yaml", "matplotlib")

#: The --quick run made smaller still: a 50-question world, a 2-step warm start, 2 steps of 2 x 2 episodes.
TINY = ["run.steps=2", "eval.every=1", "eval.questions=2", "warm_start.steps=2", "warm_start.examples=16", "warm_start.copy_steps=1",
        "data.world_size=50", "data.world_scale=1", "rollout.questions_per_step=2", "algorithm.group_size=2",
        "rollout.env_worker=false"]


# --- the collapse rule -----------------------------------------------------------------------------


def test_rolling_mean_is_trailing_and_shorter_at_the_start() -> None:
    assert rolling_mean([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert rolling_mean([3.0, 6.0], 5) == [3.0, 4.5]
    with pytest.raises(ValueError, match="window"):
        rolling_mean([1.0], 0)


def test_a_curve_that_falls_below_half_its_peak_and_stays_there_collapses_where_the_fall_begins() -> None:
    # rolling means (window 3): .2 .3 .4 .6 .733 .8 .567 .3 .033 0; peak .8, threshold .4: the last mean at
    # or above it is the 7th (step 7), so the stretch below starts at step 8 and holds 3 steps
    values = [0.2, 0.4, 0.6, 0.8, 0.8, 0.8, 0.1, 0.0, 0.0, 0.0]
    assert collapse_step(list(range(1, 11)), values, fraction=0.5, window=3) == 8
    # a stricter fraction, threshold .16: the last mean at or above it is .3 (step 8), leaving two steps < window
    assert collapse_step(list(range(1, 11)), values, fraction=0.2, window=3) is None
    # window 2: means .2 .3 .5 .7 .8 .8 .45 .05 0 0; below .16 from step 8 on, three steps
    assert collapse_step(list(range(1, 11)), values, fraction=0.2, window=2) == 8


def test_a_dip_that_recovers_a_late_fall_and_a_curve_that_never_rose_are_not_collapses() -> None:
    steps = list(range(12))
    assert collapse_step(steps, [0.8] * 4 + [0.0] * 4 + [0.8] * 4, fraction=0.5, window=2) is None
    assert collapse_step(steps[:10], [0.8] * 8 + [0.0] * 2, fraction=0.5, window=3) is None  # 1 step below < window
    assert collapse_step(steps, [0.0] * 12, fraction=0.5, window=3) is None
    assert collapse_step(steps[:3], [-1.0, -2.0, -3.0], fraction=0.5, window=1) is None


def test_missing_points_are_left_out_and_bad_arguments_refused() -> None:
    # points kept: (1, 1) (3, 1) (4, 0) (5, 0) (6, 0); window 1: from step 4 on below 0.5
    assert collapse_step([1, 2, 3, 4, 5, 6], [1.0, None, 1.0, 0.0, float("nan"), 0.0], fraction=0.5, window=1) == 4
    with pytest.raises(ValueError, match="fraction"):
        collapse_step([1], [1.0], fraction=1.0, window=1)
    with pytest.raises(ValueError, match="2 steps but 1 values"):
        collapse_step([1, 2], [1.0], fraction=0.5, window=1)


# --- the algorithms' configs -----------------------------------------------------------------------


def test_every_algorithm_gets_the_same_episodes_per_step_the_shared_settings_and_its_own() -> None:
    skip_without(*AGENTS_EXTRA)
    from benchmarks.algorithms import VARIANTS, variant_config
    from benchmarks.learning import demo_config

    base = demo_config(["algorithm.kl_coef=0.002", "algorithm.clip_low=0.1"])
    episodes = base.rollout.questions_per_step * base.algorithm.group_size
    configs = {v.name: variant_config(base, v, seed=3, policy_dir="/cache/policy", output_dir=f"/out/{v.name}") for v in VARIANTS}
    assert set(configs) == {"ppo", "grpo", "dr-grpo", "dapo", "reinforce++", "reinforce++-baseline", "rloo", "gspo", "gigpo"}
    for name, config in configs.items():
        assert config.rollout.questions_per_step * config.algorithm.group_size == episodes, name
        assert config.algorithm.kl_coef == 0.002, name
        assert config.algorithm.clip_low == (3e-4 if name == "gspo" else 0.1), name
        assert (config.model.name, config.warm_start.steps, config.run.seed) == ("/cache/policy", 0, 3), name
        assert config.run.log_entropy and config.optim == base.optim and config.env == base.env, name
    assert {n: c.algorithm.group_size for n, c in configs.items()} == {
        "ppo": 1, "reinforce++": 1, "grpo": 8, "dr-grpo": 8, "dapo": 8, "reinforce++-baseline": 8, "rloo": 8, "gspo": 8, "gigpo": 8}
    assert configs["ppo"].algorithm.critic == "separate" and configs["ppo"].algorithm.critic_lr == pytest.approx(1e-3)
    dr, dapo = configs["dr-grpo"].algorithm, configs["dapo"].algorithm
    assert (dr.scale_rewards, dr.loss_agg_mode) == (False, "seq-mean-token-sum-norm")
    assert (dapo.clip_high, dapo.dynamic_sampling, dapo.dynamic_sampling_rounds, dapo.overlong_buffer) == (0.28, True, 1, 19)
    assert configs["grpo"].algorithm.clip_high == base.algorithm.clip_high and configs["grpo"].algorithm.scale_rewards
    gspo, gigpo = configs["gspo"].algorithm, configs["gigpo"].algorithm
    assert (gspo.clip_low, gspo.clip_high, gspo.dual_clip) == (3e-4, 4e-4, None)  # the paper's sequence clip, not the shared one
    assert (gigpo.step_weight, gigpo.step_gamma, gigpo.anchor) == (1.0, 0.95, "observations")


def test_a_recipe_a_grouped_algorithm_cannot_run_is_refused_before_anything_trains(capsys: pytest.CaptureFixture[str]) -> None:
    skip_without(*AGENTS_EXTRA)
    from benchmarks.algorithms import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--algorithms", "ppo", "grpo", "--set", "algorithm.group_size=1", "rollout.questions_per_step=4"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "group_size must be >= 2" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exit_info:
        main(["--seeds", "1", "1"])
    assert exit_info.value.code == 2 and "repeats a seed" in capsys.readouterr().err


# --- the KL probe ------------------------------------------------------------------------------


def test_the_kl_probe_is_zero_against_itself_and_positive_against_another_policy() -> None:
    skip_without(*AGENTS_EXTRA)
    import copy

    import torch

    from agents.policies.config import ModelConfig
    from agents.policies.loading import load_policy
    from agents.rollout.collect import collect_rollouts
    from agents.rollout.hf_sampler import HFSampler
    from benchmarks.common.algorithm_runs import kl_to_reference
    from search_env import BatchSearchQAEnv

    policy = load_policy(ModelConfig(tiny_layers=1, tiny_hidden=32, tiny_heads=2))
    env = BatchSearchQAEnv(3, tokenizer=policy.codec, max_new_tokens=8)
    trajectories = collect_rollouts(HFSampler(policy, seed=0), env, [0, 1, 2]).trajectories
    env.close()
    assert kl_to_reference(policy, policy, trajectories, temperature=1.0) == 0.0
    other = copy.deepcopy(policy)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    kl = kl_to_reference(policy, other, trajectories, temperature=1.0)
    assert kl is not None and kl > 0
    assert kl_to_reference(policy, other, trajectories, temperature=1.0, rows_per_pass=1) == pytest.approx(kl, rel=1e-5)


# --- the command -----------------------------------------------------------------------------------


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _heldout_em(record: dict) -> float:
    """Greedy EM over every held-out question of an evaluation record, from the per-hop means."""
    hops = [key.split("/")[2] for key in record if key.startswith("eval/greedy/") and key.endswith("/em")]
    episodes = [record[f"eval/greedy/{h}/episodes"] for h in hops]
    return sum(record[f"eval/greedy/{h}/em"] * n for h, n in zip(hops, episodes)) / sum(episodes)


def test_quick_writes_tables_and_plots_that_agree_with_the_runs_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    skip_without(*AGENTS_EXTRA)
    import search_env.synthetic
    from benchmarks.algorithms import main
    from benchmarks.common.algorithm_runs import METRICS

    worlds: list[int] = []
    generate_world = search_env.synthetic.generate_world

    def counted(*args, **options):
        worlds.append(options["seed"])
        return generate_world(*args, **options)

    monkeypatch.setattr(search_env.synthetic, "generate_world", counted)
    out = tmp_path / "out"
    assert main(["--quick", "--algorithms", "grpo", "reinforce++", "--seeds", "0", "--window", "2", "--jobs", "1", "--policy-cache",
                 str(tmp_path / "cache"), "--output-dir", str(out), "--set", *TINY]) == 0
    printed = capsys.readouterr().out
    assert "reinforce++ seed 0: starts, 4 questions x 1 per step, 2 steps" in printed
    assert "reinforce++ seed 0: done in " in printed
    # the warm start's trainer makes the trained world; the two runs share one copy of it and of the held-out world
    assert worlds == [10, 10, 11] and "the world, its indexes and the held-out world built in" in printed
    for name in ("table.md", "table.csv", "runs.csv", "results.json"):
        assert (out / name).stat().st_size > 0
    for metric in METRICS:
        assert (out / f"{metric}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "results.json").read_text())
    assert (out / "table.md").read_text() == printed.split("\ntable:\n")[1].split("\n(tables, plots")[0] + "\n"
    assert [(r["algorithm"], r["seed"]) for r in results["runs"]] == [("grpo", 0), ("reinforce++", 0)]
    start_ems = set()
    for run in results["runs"]:
        records = _metrics(Path(run["output_dir"]))
        steps = [r for r in records if "stage" not in r]
        assert [r["step"] for r in steps] == [p["step"] for p in run["steps"]] == [1, 2]
        for logged, kept in zip(steps, run["steps"]):
            for key in ("reward", "searches", "response_tokens", "entropy"):
                assert kept[key] == logged[key], key
            assert kept["zero_search_frac"] == logged["rollout/zero_search_frac"]
        evaluations = [r for r in records if any(k.startswith("eval/greedy/") for k in r)]
        assert [_heldout_em(r) for r in evaluations] == pytest.approx([p["heldout_em"] for p in run["evaluations"]])
        assert [p["stage"] for p in run["evaluations"]] == ["start", None, "final"]
        assert run["episodes"] == 2 * 4  # the same budget: 2 steps of 4 episodes, grouped or not
        start_ems.add(run["evaluations"][0]["heldout_em"])
    assert len(start_ems) == 1  # both start from the same cached warm start
    with open(out / "table.csv", newline="") as handle:
        table = {row["algorithm"]: row for row in csv.DictReader(handle)}
    for run in results["runs"]:
        rewards = [r["reward"] for r in _metrics(Path(run["output_dir"])) if "stage" not in r][-2:]
        final = [p["heldout_em"] for p in run["evaluations"] if p["stage"] == "final"][0]
        row = table[run["algorithm"]]
        assert float(row["reward_mean"]) == pytest.approx(statistics.fmean(rewards))
        assert float(row["heldout_em_mean"]) == pytest.approx(final) and float(row["reward_std"]) == 0.0
        shares = [r["rollout/zero_search_frac"] for r in _metrics(Path(run["output_dir"])) if "stage" not in r][-2:]
        assert float(row["zero_search_frac_mean"]) == pytest.approx(statistics.fmean(shares))
        assert row["episodes_per_step"] == "4"
    assert results["warm_starts"]["0"]["reused"] is False and results["machine"]["cores"] >= 1

    # the same command again takes the finished runs from their folders: nothing is built or trained
    table_before, worlds[:] = (out / "table.md").read_text(), []
    argv = ["--quick", "--algorithms", "grpo", "reinforce++", "--seeds", "0", "--jobs", "1", "--policy-cache", str(tmp_path / "cache"),
            "--output-dir", str(out), "--set", *TINY]
    assert main([*argv, "--window", "2"]) == 0
    assert capsys.readouterr().out.count("finished already") == 2 and worlds == []
    assert (out / "table.md").read_text() == table_before
    # other settings (here the collapse window) train the runs again
    assert main([*argv, "--window", "1"]) == 0
    assert "finished already" not in capsys.readouterr().out and worlds == [10, 11]


def test_an_algorithm_a_user_registers_runs_through_the_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    skip_without(*AGENTS_EXTRA)
    from benchmarks.algorithms import main

    # an unknown name is refused in one line that says how to register more, before anything runs
    with pytest.raises(SystemExit) as exit_info:
        main(["--algorithms", "tiny-pg", "--output-dir", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "tiny-pg: not a benchmark variant or a registered algorithm" in err and "--import" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["--import", "tests.benchmarks.no_such_module", "--algorithms", "grpo"])
    assert exit_info.value.code == 2 and "--import tests.benchmarks.no_such_module" in capsys.readouterr().err

    out = tmp_path / "out"
    assert main(["--quick", "--import", "tests.benchmarks.tiny_algorithm", "--algorithms", "tiny-pg", "--seeds", "0", "1", "--jobs", "1",
                 "--bootstrap-reps", "50", "--policy-cache", str(tmp_path / "cache"), "--output-dir", str(out), "--set", *TINY]) == 0
    printed = capsys.readouterr().out
    # a registered algorithm samples group_size answers per question: 2 questions x 2 answers
    assert "tiny-pg seed 0: starts, 2 questions x 2 per step, 2 steps" in printed
    results = json.loads((out / "results.json").read_text())
    assert [(r["algorithm"], r["seed"]) for r in results["runs"]] == [("tiny-pg", 0), ("tiny-pg", 1)]
    assert results["variants"]["tiny-pg"]["algo"] == "tiny-pg"
    for run in results["runs"]:
        assert [p["episodes"] for p in run["steps"]] == [4, 8]  # the training episodes by each step
    row = results["summary"][0]
    assert row["heldout_em_iqm"]["low"] <= row["heldout_em_iqm"]["value"] <= row["heldout_em_iqm"]["high"]
    assert set(row["to_threshold"]) == {"0.5", "0.8"} and results["improvements"] == []  # one algorithm: no pair
    assert (out / "heldout_em_profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and set(results["profiles"]) == {"tiny-pg"}
    with open(out / "runs.csv", newline="") as handle:
        runs = list(csv.DictReader(handle))
    assert [r["algorithm"] for r in runs] == ["tiny-pg", "tiny-pg"] and all(r["heldout_em_auc"] for r in runs)


def test_a_folders_table_covers_every_finished_run_of_its_task_and_names_those_it_leaves_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    skip_without(*AGENTS_EXTRA)
    from benchmarks.algorithms import QUICK_NOTE, main
    from benchmarks.common.algorithm_report import ONE_SEED_NOTE

    out = tmp_path / "out"
    argv = ["--quick", "--seeds", "0", "--jobs", "1", "--policy-cache", str(tmp_path / "cache"), "--output-dir", str(out), "--set", *TINY]
    assert main([*argv, "--algorithms", "grpo", "reinforce++", "--window", "2"]) == 0
    capsys.readouterr()

    def table_rows() -> list[str]:
        return [line.split("|")[1].strip() for line in (out / "table.md").read_text().splitlines()
                if line.startswith("| ") and not line.startswith("| algorithm")]

    # a later command with one of the algorithms: the table still shows both finished runs
    assert main([*argv, "--algorithms", "reinforce++", "--window", "2"]) == 0
    printed = capsys.readouterr().out
    assert "finished already" in printed and table_rows() == ["reinforce++", "grpo"]
    text = (out / "table.md").read_text()
    assert text.startswith(QUICK_NOTE + "\n") and ONE_SEED_NOTE in text
    assert "this command's 1 and 1 finished earlier (grpo)" in text and "Not shown" not in text
    results = json.loads((out / "results.json").read_text())
    assert [(r["algorithm"], r["seed"]) for r in results["runs"]] == [("reinforce++", 0), ("grpo", 0)]
    with open(out / "runs.csv", newline="") as handle:
        assert [row["algorithm"] for row in csv.DictReader(handle)] == ["reinforce++", "grpo"]
    # a run of other settings (its collapse window) is left out, and the header says which and why
    assert main([*argv, "--algorithms", "grpo", "--window", "1"]) == 0
    assert table_rows() == ["grpo"]
    assert "Not shown: 1 finished run in the folder of other settings (reinforce++ seed 0: collapse window 2 (here 1))" in \
        (out / "table.md").read_text()
