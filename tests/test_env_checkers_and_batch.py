"""The default environment passes both env checkers; the batch env batches searches per source."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import search_env
from search_env import BatchSearchQAEnv
from search_env.data.example import QAExample
from search_env.env import SearchQAEnv
from search_env.wrappers import FixedWindowObservation, FullContextObservation
from tests.conftest import CountingSource


@pytest.fixture(scope="module")
def default_env():
    env = gym.make("SearchQA-v0")
    yield env
    env.close()


def test_gymnasium_env_checker_passes(default_env):
    from gymnasium.utils.env_checker import check_env

    check_env(default_env.unwrapped, skip_render_check=False)


def test_stable_baselines3_env_checker_passes_through_the_fixed_window_wrapper():
    sb3 = pytest.importorskip("stable_baselines3.common.env_checker")
    sb3.check_env(FixedWindowObservation(gym.make("SearchQA-v0"), window=32), warn=True)


def test_default_env_answers_a_synthetic_question_with_its_gold_passage(default_env):
    env = default_env.unwrapped
    obs, info = default_env.reset(seed=3)
    example = env.example
    assert search_env.ENVIRONMENT in obs["producers"] and set(obs["producers"]) == {search_env.ENVIRONMENT}
    first_hop = example.decomposition[0]
    default_env.step(env.codec.encode(f"<search> {first_hop.query} </search>"))
    call = env.trajectory.tool_calls[0]
    assert set(call.passage_ids) & set(example.gold_passage_ids), "BM25 over the world should find the first hop"
    *_, terminated, _, info = default_env.step(env.codec.encode(f"<answer> {example.golden_answers[0]} </answer>"))
    assert terminated and info["reward_components"] and env.trajectory.reward == 1.0


def test_fixed_window_keeps_the_latest_tokens(split_tag_tokenizer):
    env = FixedWindowObservation(
        SearchQAEnv("search-r1", dataset=[QAExample("q", "Who?", ["x"])], sources=CountingSource(), tokenizer=split_tag_tokenizer),
        window=8,
    )
    obs, _ = env.reset(seed=0)
    assert obs["attention_mask"].all() and not obs["producers"].any()
    ids = env.unwrapped.codec.encode("the answer is")
    for t in ids:
        obs, *_ = env.step(t)
    assert obs["token_ids"][-len(ids):].tolist() == ids and obs["producers"][-len(ids):].all()
    full = FullContextObservation(env.unwrapped)
    obs, _ = full.reset(seed=0)
    obs, *_ = full.step(ids)
    assert obs["token_ids"][-len(ids):] == tuple(ids) and len(obs["token_ids"]) == len(full.unwrapped.trajectory.token_ids)


def test_batch_env_sends_one_batch_per_source_and_matches_single_envs(split_tag_tokenizer):
    examples = [QAExample(f"q{i}", f"Question {i}?", [f"ans{i}"]) for i in range(6)]
    source = CountingSource()
    batch = BatchSearchQAEnv(4, dataset=examples, sources=source, tokenizer=split_tag_tokenizer)
    batch.reset(options=[{"index": i} for i in range(4)])
    codec = batch.envs[0].codec
    chunks = [codec.encode(f"<search> query {i} </search> then <answer> ans{i} </answer>") for i in range(4)]
    chunks[3] = codec.encode("no call yet")
    obs, rewards, terminated, truncated, infos = batch.step(chunks)
    assert source.calls == [["query 0", "query 1", "query 2"]], "one batched call for the three pending queries"
    assert terminated.tolist() == [True, True, True, False] and rewards.tolist() == [1.0, 1.0, 1.0, 0.0]

    single = SearchQAEnv("search-r1", dataset=examples, sources=CountingSource(), tokenizer=split_tag_tokenizer)
    single.reset(options={"index": 1})
    s_obs, s_reward, *_ = single.step(chunks[1])
    assert obs[1] == s_obs and s_reward == rewards[1]
    assert single.trajectory.token_ids == batch.envs[1].trajectory.token_ids

    obs, rewards, terminated, truncated, infos = batch.step([None, None, None, codec.encode("<search> late </search>")])
    assert source.calls[-1] == ["late"] and obs[0] == {"token_ids": (), "producers": ()}
    with pytest.raises(RuntimeError):
        batch.step([codec.encode("x")] + [None] * 3)
