"""The learner's batch, question groups, waves and the rollout's time accounting (no model needed)."""
from __future__ import annotations

import time

import pytest

from tests.conftest import CountingSource, skip_without

skip_without("agents", "torch", "transformers")

from agents.scripted.rollout_agent import ScriptedRolloutAgent  # noqa: E402
from agents.rollout.collect import _search_time, collect_rollouts  # noqa: E402
from agents.rollout.batch import build_batch  # noqa: E402
from agents.scripted.agents import OracleAgent  # noqa: E402
from search_env import BatchSearchQAEnv  # noqa: E402
from search_env.data.example import QAExample  # noqa: E402
from search_env.trajectory import ToolCall, Trajectory  # noqa: E402


def _traj(ids, producers, trained, reward, example_id="q"):
    return Trajectory(question="?", golden_answers=[], protocol="search-r1", example_id=example_id, prompt_length=2,
                      token_ids=list(ids), producers=bytearray(producers), trained=bytearray(trained), reward=reward)


def test_build_batch_pads_right_and_puts_the_reward_on_the_last_trained_token():
    a = _traj([10, 11, 12, 13, 14, 15], [0, 0, 1, 1, 0, 1], [0, 0, 1, 1, 0, 0], 2.0)  # last agent token untrained
    b = _traj([20, 21, 22, 23], [0, 1, 1, 0], [0, 1, 1, 0], -1.0)
    c = _traj([30, 31, 32], [0, 0, 1], [0, 0, 1], 0.5)
    batch = build_batch([a, b, c], ["q2", "q1", "q2"], pad_id=99)
    assert batch.input_ids.tolist() == [[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 99, 99], [30, 31, 32, 99, 99, 99]]
    assert batch.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 3, 3], [0, 1, 2, 2, 2, 2]]
    assert batch.trained_mask.tolist() == [[0, 0, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0]]
    assert batch.token_rewards.tolist() == [[0, 0, 0, 2.0, 0, 0], [0, 0, -1.0, 0, 0, 0], [0, 0, 0.5, 0, 0, 0]]
    assert batch.scores.tolist() == [2.0, -1.0, 0.5]
    assert batch.group_index.tolist() == [0, 1, 0] and batch.group_ids == ["q2", "q1", "q2"]
    assert batch.trajectories == [a, b, c] and batch.old_logprobs is None


def test_build_batch_refuses_training_on_environment_tokens_and_inconsistent_records():
    with pytest.raises(ValueError, match="not produced by the agent"):
        build_batch([_traj([1, 2, 3], [0, 1, 0], [0, 1, 1], 1.0)], ["q"], 0)
    with pytest.raises(ValueError, match="3 ids but 2 trained flags"):
        build_batch([_traj([1, 2, 3], [0, 1, 1], [0, 1], 1.0)], ["q"], 0)
    with pytest.raises(ValueError, match="2 trajectories but 1 group ids"):
        build_batch([_traj([1], [0], [0], 0.0)] * 2, ["q"], 0)


def test_search_time_is_the_part_a_steps_overlapping_calls_share():
    calls = [(0.0, 1.0), (0.5, 1.5), (3.0, 1.0), (3.2, 0.1)]  # [0, 1] and [0.5, 2]; [3, 4] and [3.2, 3.3]
    trajs = [_traj([1], [0], [0], 0.0) for _ in range(2)]
    trajs[0].tool_calls = [ToolCall(1, "query", "a", ["all"], 3, started_at=s, duration_s=d) for s, d in calls[:2]]
    trajs[1].tool_calls = [ToolCall(1, "query", "b", ["all"], 3, started_at=s, duration_s=d) for s, d in calls[2:]]
    assert _search_time(trajs) == pytest.approx(0.5 + 0.1)


@pytest.fixture(scope="module")
def oracle_env():
    return BatchSearchQAEnv(4, protocol="search-r1")


def test_groups_are_keyed_by_question_id_across_waves(oracle_env):
    questions = [5, 2, 9]
    rollout = collect_rollouts(ScriptedRolloutAgent(OracleAgent), oracle_env, questions, group_size=3)  # 9 episodes, 3 waves
    ids = [oracle_env.envs[0].examples[q].id for q in questions]
    assert rollout.group_ids == [ids[0]] * 3 + [ids[1]] * 3 + [ids[2]] * 3
    assert [t.example_id for t in rollout.trajectories] == rollout.group_ids
    assert build_batch(rollout.trajectories, rollout.group_ids, 0).group_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert rollout.sampled_logprobs is None  # a scripted agent gives none
    assert all(t.reward == 1.0 for t in rollout.trajectories)
    stats = rollout.stats()
    assert stats["episodes"] == 9 and stats["reward_mean"] == 1.0 and stats["searches_mean"] >= 1


def test_one_id_for_two_questions_is_refused(oracle_env):
    twins = [QAExample("same", "Who?", ["a"]), QAExample("same", "Where?", ["b"])]
    with pytest.raises(ValueError, match="names two different questions"):
        collect_rollouts(ScriptedRolloutAgent(OracleAgent), oracle_env, twins)


class SleepySource(CountingSource):
    """Answers after a pause, so search time is measurable; counts its batched calls."""

    def search(self, queries, k):
        time.sleep(0.05)
        return super().search(queries, k)


def test_search_time_is_one_pause_per_batched_round_and_not_env_time():
    source = SleepySource()
    examples = [QAExample(f"q{i}", f"Who founded Zarbo {i}?", ["Bob"]) for i in range(4)]
    env = BatchSearchQAEnv(4, dataset=examples, sources=source)
    rollout = collect_rollouts(ScriptedRolloutAgent(_TwoSearches), env, examples)
    t = rollout.timings
    rounds = len(source.calls)
    assert rounds == 2 and all(len(batch) == 4 for batch in source.calls)  # one batch per round, 4 episodes each
    summed = sum(c.duration_s for traj in rollout.trajectories for c in traj.tool_calls)
    assert 0.05 * rounds <= t.search_s < summed  # 8 calls overlapped in 2 rounds
    assert t.env_s >= 0 and t.generation_s >= 0
    assert t.generation_s + t.env_s + t.search_s <= t.total_s
    assert sum(t.shares().values()) == pytest.approx(1.0)


class _TwoSearches:
    """Searches twice (its own queries, or the same ones as every other episode), then answers."""

    def __init__(self, shared_queries=False):
        self.shared_queries = shared_queries

    def start(self, example):
        self.left = 2
        self.name = "zarbo" if self.shared_queries else example.id

    def next_text(self, writer, observation_text):
        if self.left:
            self.left -= 1
            return writer.call(f"{self.name} {self.left}")
        return writer.answer("Bob")


def test_a_query_several_episodes_ask_in_one_round_is_searched_once():
    source = CountingSource()
    examples = [QAExample(f"q{i}", f"Who founded Zarbo {i}?", ["Bob"]) for i in range(4)]
    env = BatchSearchQAEnv(4, dataset=examples, sources=source)
    rollout = collect_rollouts(ScriptedRolloutAgent(lambda: _TwoSearches(shared_queries=True)), env, examples)
    assert source.calls == [["zarbo 1"], ["zarbo 0"]]
    for traj in rollout.trajectories:  # every episode still gets its results
        assert [c.content for c in traj.tool_calls] == ["zarbo 1", "zarbo 0"] and all(c.passage_ids for c in traj.tool_calls)
