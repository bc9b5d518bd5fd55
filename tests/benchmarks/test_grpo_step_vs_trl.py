"""The GRPO-step benchmark against TRL: the benchmark runs end to end and reports both sides (the peer's
rollout is the public TRL adapter, tested in tests/search_env/integrations/test_trl.py). Skipped when TRL
(an optional extra) is absent."""
import json
import os

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "yaml")
skip_without("trl", "trl", "datasets")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from benchmarks import grpo_step_vs_trl  # noqa: E402
from benchmarks.peers.trl_grpo import StepClock  # noqa: E402


def test_step_clock_times_each_step_and_calls_between_in_order():
    calls = []
    clock = StepClock(lambda step: calls.append((step, len(clock.step_seconds))))
    clock.on_train_begin(None, None, None)
    clock.on_step_end(None, None, None)
    clock.on_step_end(None, None, None)
    assert calls == [(1, 1), (2, 2)]
    assert all(s >= 0 for s in clock.step_seconds)


def test_benchmark_runs_both_sides_on_the_same_work(capsys):
    args = ["--steps", "1", "--warmup", "1", "--prompts", "2", "--group", "2", "--max-new-tokens", "8",
            "--micro-batch", "2", "--warm-start-steps", "0"]
    trl_records, our_records = grpo_step_vs_trl.run(grpo_step_vs_trl.parse_args(args))
    assert len(trl_records) == len(our_records) == 2
    for trl_step, our_step in zip(trl_records, our_records):
        assert trl_step.episodes == our_step.episodes == 4
        # The same questions, so the same prompts; both sample up to the same agent budget.
        assert trl_step.prompt_tokens == our_step.prompt_tokens
        assert 0 < trl_step.agent_tokens <= 4 * 8 and 0 < our_step.agent_tokens <= 4 * 8
        assert 0 < trl_step.rollout_s < trl_step.total_s and 0 < our_step.rollout_s < our_step.total_s
    table = grpo_step_vs_trl.report(trl_records, our_records, grpo_step_vs_trl.parse_args(args))
    rows = {line.split()[0] for line in table.splitlines() if line}
    assert {"TRL", "ours", "TRL/ours", "target:"} <= rows


def test_bad_batch_split_is_refused():
    with pytest.raises(SystemExit):
        grpo_step_vs_trl.parse_args(["--prompts", "3", "--group", "3", "--micro-batch", "2"])


def test_the_command_writes_the_medians_and_ratios_of_the_timed_steps(tmp_path, monkeypatch, capsys):
    def record(rollout_s, total_s, agent_tokens=40):
        return grpo_step_vs_trl.StepRecord(rollout_s=rollout_s, total_s=total_s, episodes=4, prompt_tokens=48,
                                           agent_tokens=agent_tokens, env_tokens=20, searches=2, reward=0.5)

    # a warm-up step per side (dropped from the medians), then three timed ones
    trl_records = [record(9.0, 90.0), record(2.0, 6.0), record(3.0, 8.0), record(4.0, 7.0)]
    our_records = [record(5.0, 50.0), record(1.0, 2.0), record(1.0, 4.0), record(2.0, 3.0, agent_tokens=60)]
    monkeypatch.setattr(grpo_step_vs_trl, "run", lambda args: (trl_records, our_records))
    argv = ["--steps", "3", "--warmup", "1", "--prompts", "2", "--group", "2", "--micro-batch", "2", "--output-dir", str(tmp_path)]
    assert grpo_step_vs_trl.main(argv) == 0
    assert "target: ours >= 1.5x faster per step: met (2.33x)" in capsys.readouterr().out  # 7 s / 3 s
    saved = json.loads((tmp_path / "grpo_step_vs_trl.json").read_text(encoding="utf-8"))
    assert saved["command"] == "python -m benchmarks.grpo_step_vs_trl " + " ".join(argv)
    trl, ours = saved["summary"]
    assert (trl["side"], trl["rollout_s"], trl["update_s"], trl["total_s"]) == ("TRL", 3.0, 4.0, 7.0)
    assert (ours["side"], ours["rollout_s"], ours["update_s"], ours["total_s"]) == ("ours", 1.0, 1.0, 3.0)  # updates 1, 3, 1 s
    assert ours["agent_tokens_per_s"] == 20.0 and ours["agent_tokens_per_episode"] == 10.0 and ours["searches_per_episode"] == 0.5
    assert saved["trl_over_ours"] == {"rollout_s": 3.0, "update_s": 4.0, "total_s": 7 / 3}
    assert [step["warmup"] for step in saved["steps"]["ours"]] == [True, False, False, False]
    assert saved["steps"]["TRL"][0]["update_s"] == 81.0
    markdown = (tmp_path / "grpo_step_vs_trl.md").read_text(encoding="utf-8")
    assert "| ours | 1 | 1 | 3 | 20.0 | 4 | 10.0 | 5 | 12.0 | 0.5 | 0.5 |" in markdown
    assert "TRL / ours: rollout 3.00x, update 4.00x, whole step 2.33x. target: ours >= 1.5x faster per step: met (2.33x)." in markdown
    assert (tmp_path / "grpo_step_vs_trl.csv").read_text(encoding="utf-8").splitlines()[2].startswith("ours,1.0,1.0,3.0,20.0,4,")
