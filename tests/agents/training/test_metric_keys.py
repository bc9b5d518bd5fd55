"""Every key a run writes to ``metrics.jsonl`` has an entry in :mod:`agents.training.metric_keys`, the list the
documentation's metrics glossary is generated from: a new key without one fails here."""
from __future__ import annotations

import pytest

from agents.training.metric_keys import METRIC_KEYS, describe, measures_the_machine
from tests.agents.training.tiny import records, run, small_config


#: Rollouts two steps ahead on an engine with its own checked copy of the weights (the asynchronous tests' engine):
#: the staleness, waiting, weight-sync, sync-check and engine/trainer log-prob keys.
AHEAD = {"rollout.engine": "test-copy", "rollout.max_staleness": 2, "run.steps": 4}


@pytest.mark.parametrize("algo, own_keys, changes", [
    ("grpo", {"warm_start/loss_last", "groups/informative_frac"}, {}),
    ("ppo", {"loss/value", "value/mean"}, {}),
    ("gigpo", {"gigpo/shared_turn_frac"}, {}),
    ("grpo", {"rollout/staleness_max", "rollout/sync_gap", "time/weight_sync", "time/rollout_waited",
              "rollout/logprob_gap_mean"}, AHEAD),
])
def test_every_key_of_a_tiny_run_has_an_entry(tmp_path, algo, own_keys, changes):
    # A warm start and an evaluation every step: the episode, update, time, warm-start and eval keys, and the
    # algorithm's own (PPO's critic, GiGPO's turn groups), or the asynchronous rollouts' own.
    if changes.get("rollout.engine") == AHEAD["rollout.engine"]:
        import tests.agents.training.test_async_rollout  # noqa: F401  (registers the engine)
    config = small_config(algo, tmp_path / "run", {"eval.every": 1, "warm_start.steps": 1, **changes})
    run(config)
    logged = {key for record in records(tmp_path / "run" / "metrics.jsonl") for key in record}
    assert {"step", "loss/total", "time/step", "eval/greedy/em", *own_keys} <= logged  # the run logged what it should
    missing = sorted(key for key in logged if not _has_entry(key))
    assert not missing, f"logged metrics without an entry in agents.training.metric_keys: {missing}"


def _has_entry(key: str) -> bool:
    try:
        describe(key)
    except KeyError:
        return False
    return True


def test_a_family_matches_one_segment_and_an_exact_entry_wins():
    assert describe("eval/sampled/f1").pattern == "eval/{decoding}/f1"
    assert describe("rollout/logprob_gap_turn2_max").pattern == "rollout/logprob_gap_turn{turn}_max"
    assert describe("reward").pattern == "reward"
    with pytest.raises(KeyError, match="no entry"):
        describe("eval/a/b/em")  # {decoding} is one segment
    with pytest.raises(KeyError, match="no entry"):
        describe("time/unheard_of")


def test_entries_are_unique_and_complete():
    patterns = [entry.pattern for entry in METRIC_KEYS]
    assert len(patterns) == len(set(patterns))
    assert all(entry.meaning.endswith(".") and entry.unit for entry in METRIC_KEYS)


def test_the_keys_that_measure_the_machine_are_the_times_rates_and_threads():
    """A new time or rate key that MACHINE_KEYS misses would make a reproduction on another machine differ; a
    result key it caught would hide a real difference."""
    machine = {key.pattern for key in METRIC_KEYS if measures_the_machine(key.pattern)}
    assert machine == {key.pattern for key in METRIC_KEYS if key.unit in ("s", "tokens/s")} | {"warm_start/threads"}
