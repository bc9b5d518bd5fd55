"""The default environment passes both env checkers; the batch env batches searches per source."""
from __future__ import annotations

import gymnasium as gym
import pytest

import search_env
from search_env import BatchSearchQAEnv
from search_env.data.example import QAExample
from search_env.env import SearchQAEnv
from search_env.wrappers import FixedWindowObservation, FullContextObservation
from tests.conftest import CountingSource, skip_without


@pytest.fixture(scope="module")
def default_env():
    env = gym.make("SearchQA-v0")
    yield env
    env.close()


def test_gymnasium_env_checker_passes(default_env):
    from gymnasium.utils.env_checker import check_env

    check_env(default_env.unwrapped, skip_render_check=False)


def test_stable_baselines3_env_checker_passes_through_the_fixed_window_wrapper():
    skip_without("sb3", "stable_baselines3")
    from stable_baselines3.common import env_checker as sb3
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


class ShortSource(CountingSource):
    """A buggy plug-in: one result list fewer than the queries it was asked."""

    def search(self, queries, k):
        return super().search(queries, k)[:-1]


class ClosingSource(CountingSource):
    def __init__(self, name: str = "all") -> None:
        super().__init__(name)
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_batch_env_turns_a_source_returning_too_few_lists_into_error_observations(split_tag_tokenizer):
    examples = [QAExample(f"q{i}", f"Question {i}?", [f"ans{i}"]) for i in range(3)]
    batch = BatchSearchQAEnv(3, dataset=examples, sources=ShortSource("short"), tokenizer=split_tag_tokenizer)
    batch.reset(options=[{"index": i} for i in range(3)])
    codec = batch.envs[0].codec
    obs, rewards, terminated, truncated, infos = batch.step([codec.encode(f"<search> query {i} </search>") for i in range(3)])
    for env, ob in zip(batch.envs, obs):
        assert "source 'short' returned 2 result lists for 3 queries" in codec.decode(ob["token_ids"])
        assert env.trajectory.counters["source_errors"] == 1
    assert not terminated.any() and not truncated.any()


def test_batch_env_runs_plans_like_single_envs_and_close_releases_everything(split_tag_tokenizer):
    import threading

    examples = [QAExample(f"q{i}", f"Question {i}?", [f"ans{i}"]) for i in range(3)]
    wiki, news = ClosingSource("wiki"), ClosingSource("news")
    kwargs = dict(protocol="reasoning-search", dataset=examples, tokenizer=split_tag_tokenizer)
    batch = BatchSearchQAEnv(3, sources={"wiki": wiki, "news": news}, **kwargs)
    batch.reset(options=[{"index": i} for i in range(3)])
    codec = batch.envs[0].codec
    plans = [f"<search>Nodes:\nA: who {i} (News)\nB: where {{A}} (General)\nEdges:\nA -> B\n</search>" for i in range(3)]
    obs, rewards, terminated, truncated, infos = batch.step([codec.encode(plan) for plan in plans])
    assert sorted(q for call in news.calls for q in call) == ["who 0", "who 1", "who 2"]
    for i, plan in enumerate(plans):
        single = SearchQAEnv(sources={"wiki": CountingSource("wiki"), "news": CountingSource("news")}, **kwargs)
        single.reset(options={"index": i})
        assert single.step(codec.encode(plan))[0] == obs[i], "a plan gives the same observation batched or alone"
        assert [n["label"] for n in single.trajectory.tool_calls[0].nodes] == ["A", "B"]
    obs, rewards, terminated, truncated, infos = batch.step([codec.encode(f"<answer> ans{i} </answer>") for i in range(3)])
    assert terminated.all() and all(info["reward_components"]["dag_valid"] for info in infos)
    assert any(t.name.startswith("searchqa-plans") for t in threading.enumerate())
    batch.close()
    assert (wiki.closed, news.closed) == (1, 1), "sources shared by the envs are closed once"
    assert not any(t.name.startswith("searchqa-plans") for t in threading.enumerate()), "the plan threads are gone"


def test_the_public_batched_stepping_pieces_give_what_step_gives(split_tag_tokenizer):
    examples = [QAExample("q0", "Question?", ["ans"])]
    text = "<search> first </search> then <search> second </search> and <answer> ans </answer>"
    stepped = SearchQAEnv(dataset=examples, sources=CountingSource(), tokenizer=split_tag_tokenizer)
    stepped.reset(seed=0)
    expected = stepped.step(stepped.codec.encode(text))

    source = CountingSource()
    env = SearchQAEnv(dataset=examples, sources=source, tokenizer=split_tag_tokenizer)
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="no step in progress"):
        env.finish_step()
    request = env.start_step(env.codec.encode(text))
    assert request == env.pending_request and (request.source, request.query, request.k) == ("all", "first", 3)
    with pytest.raises(RuntimeError, match="step is in progress"):
        env.start_step([1])
    with pytest.raises(RuntimeError, match="waits on its search request"):
        env.finish_step()
    queries = []
    while request is not None:
        queries.append(request.query)
        request = env.take_results(source.search([request.query], request.k)[0])
    assert queries == ["first", "second"] and env.pending_request is None
    with pytest.raises(RuntimeError, match="no search request is pending"):
        env.take_results([])
    result = env.finish_step()
    assert result[:4] == expected[:4] and result[4]["events"] == expected[4]["events"]
    assert env.done and env.terminated and not env.truncated
    assert env.trajectory.token_ids == stepped.trajectory.token_ids


def test_a_failure_handed_to_take_results_is_an_error_observation(split_tag_tokenizer):
    env = SearchQAEnv(dataset=[QAExample("q0", "Question?", ["ans"])], sources=CountingSource(), tokenizer=split_tag_tokenizer)
    env.reset(seed=0)
    env.start_step(env.codec.encode("<search> q </search>"))
    assert env.take_results(TimeoutError("too slow")) is None
    obs, *_ = env.finish_step()
    assert "Search failed: TimeoutError: too slow" in env.codec.decode(obs["token_ids"])


def test_batch_env_checks_every_action_before_any_episode_steps(split_tag_tokenizer):
    """A bad action anywhere in the batch raises before any episode moves, so none is left mid-step."""
    batch = BatchSearchQAEnv(3, sources=CountingSource(), tokenizer=split_tag_tokenizer, dataset=[QAExample("q", "Who?", ["x"])])
    batch.reset(seed=0)
    lengths = [len(env.trajectory.token_ids) for env in batch.envs]
    codec = batch.envs[0].codec
    good = codec.encode("<search> who </search>")
    with pytest.raises(ValueError, match="integers"):
        batch.step([good, good, [1.5]])
    assert [len(env.trajectory.token_ids) for env in batch.envs] == lengths
    assert all(env.pending_request is None for env in batch.envs)
    observations, *_ = batch.step([good, good, good])  # the batch is still usable
    assert all(len(obs["token_ids"]) > len(good) for obs in observations)
    batch.close()
