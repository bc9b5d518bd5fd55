"""Paths that learners and users rely on: the trajectory's masks, where a rollout stops generating, the
result cap, a tokenizer given as a path, and the oracle reaching each protocol's maximum reward."""
from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

import search_env
from agents.scripted.agents import OracleAgent, run_episode
from search_env import AGENT, get_protocol
from search_env.data.example import QAExample
from search_env.env import SearchQAEnv
from tests.conftest import CountingSource

EXAMPLE = QAExample("q1", "Who founded Zarbo", ["Bob Smith"])
BUILTIN_TOKENIZER_JSON = Path(search_env.__file__).parent / "assets" / "searchqa_bpe.json"


def test_trajectory_masks_and_response_ids(split_tag_tokenizer):
    quiet = get_protocol("search-r1").with_options(name="search-r1-quiet-think", untrained_agent_spans=(("<think>", "</think>"),))
    env = SearchQAEnv(quiet, dataset=[EXAMPLE], sources=CountingSource(), tokenizer=split_tag_tokenizer)
    env.reset(seed=0)
    codec = env.codec
    think, call, answer = codec.encode("<think> hm </think>"), codec.encode("<search> zarbo </search>"), codec.encode("<answer> Bob Smith </answer>")
    env.step(think + call)
    env.step(answer)
    traj = env.trajectory
    docs = quiet.format_docs(CountingSource().search(["zarbo"], quiet.top_k)[0])
    results = codec.encode(quiet.result_prefix + docs + quiet.result_suffix)
    p = traj.prompt_length
    assert traj.response_ids == think + call + results + answer and traj.token_ids[:p] == codec.encode(env.render_prompt(EXAMPLE.question))
    agent = [False] * p + [True] * (len(think) + len(call)) + [False] * len(results) + [True] * len(answer)
    assert traj.agent_mask.dtype == bool and traj.agent_mask.tolist() == agent
    trained = [False] * p + [False] * len(think) + [True] * len(call) + [False] * len(results) + [True] * len(answer)
    assert traj.trained_mask.dtype == bool and traj.trained_mask.tolist() == trained, "the think span is agent text, not trained on"


STOPS = {
    "search-r1": ("</search>", "</answer>"),
    "r1-searcher": ("<|end_of_query|>", "</answer>"),
    "research": ("</search>",),  # ReSearch runs on past the answer to EOS, which stops generation anyway
    "r-search": ("</search>", "</answer>"),
    "reasoning-search": ("</search>", "</answer>"),
}


@pytest.mark.parametrize("protocol", list(STOPS))
def test_stop_strings_are_where_the_environment_acts(split_tag_tokenizer, protocol):
    p = get_protocol(protocol)
    assert p.stop_strings == STOPS[protocol]
    env = SearchQAEnv(protocol, dataset=[EXAMPLE], sources={"wiki": CountingSource("wiki")}, tokenizer=split_tag_tokenizer)
    env.reset(seed=0)
    query = "Nodes:\nA: zarbo founder (wiki)" if p.call_kind == "dag" else "zarbo founder"
    generation = f"<think> hm </think>{p.call_open} {query} {p.call_close} and then more text"
    chunk = generation[: generation.index(p.stop_strings[0]) + len(p.stop_strings[0])]  # a rollout stops here
    ids = env.codec.encode(chunk)
    obs, _, terminated, _, info = env.step(ids)
    assert [e["event"] for e in info["events"]] == ["results"] and info["consumed"] == len(ids) and not terminated
    assert list(obs["producers"][: len(ids)]) == [AGENT] * len(ids) and AGENT not in obs["producers"][len(ids) :]


def test_max_result_tokens_caps_the_documents_and_keeps_the_closing_tag(split_tag_tokenizer):
    p = get_protocol("search-r1")
    capped = SearchQAEnv(p, dataset=[EXAMPLE], sources=CountingSource(), tokenizer=split_tag_tokenizer, max_result_tokens=5)
    whole = SearchQAEnv(p, dataset=[EXAMPLE], sources=CountingSource(), tokenizer=split_tag_tokenizer)
    call = split_tag_tokenizer.encode("<search> zarbo </search>").ids
    docs = p.format_docs(CountingSource().search(["zarbo"], 3)[0])
    encode = lambda text: split_tag_tokenizer.encode(text).ids  # noqa: E731
    for env, expected in [
        (capped, encode(p.result_prefix) + encode(docs)[:5] + encode(p.result_suffix)),
        (whole, encode(p.result_prefix + docs + p.result_suffix)),
    ]:
        env.reset(seed=0)
        obs, *_ = env.step(call)
        assert list(obs["token_ids"][len(call) :]) == expected
    assert capped.response_text.endswith("</information>\n\n") and len(encode(docs)) > 5


@pytest.mark.parametrize("as_path", [str, Path], ids=["str", "Path"])
def test_a_tokenizer_given_as_a_path_is_the_tokenizer_it_names(as_path, split_tag_tokenizer, tmp_path):
    default = SearchQAEnv(dataset=[EXAMPLE], sources=CountingSource())
    by_path = SearchQAEnv(dataset=[EXAMPLE], sources=CountingSource(), tokenizer=as_path(BUILTIN_TOKENIZER_JSON))
    assert by_path.codec.vocab_size == default.codec.vocab_size
    assert by_path.reset(seed=0)[0] == default.reset(seed=0)[0]
    saved = tmp_path / "tokenizer.json"
    split_tag_tokenizer.save(str(saved))
    env = gym.make("SearchQA-v0", dataset=[EXAMPLE], sources=CountingSource(), tokenizer=as_path(saved))
    obs, _ = env.reset(seed=0)
    assert list(obs["token_ids"]) == split_tag_tokenizer.encode(env.unwrapped.render_prompt(EXAMPLE.question)).ids
    assert env.unwrapped.action_space.n == split_tag_tokenizer.get_vocab_size()


# The maximum of each protocol's reward (PROTOCOLS.md): EM, F1 + no penalty, F1, 0.2 + 0.2 + answer F1
# (+ evidence F1, which needs an evidence model: without one it is skipped), 0.25 + 0.25 + 0.5 * F1.
ORACLE_MAX = {"search-r1": 1.0, "r1-searcher": 1.0, "research": 1.0, "r-search": 1.4, "reasoning-search": 1.0}


@pytest.fixture(scope="module")
def small_world_envs():
    return {protocol: SearchQAEnv(protocol, world_size=40) for protocol in ORACLE_MAX}


@pytest.mark.parametrize("protocol", list(ORACLE_MAX))
def test_the_oracle_reaches_each_protocols_maximum_reward_on_the_synthetic_world(small_world_envs, protocol):
    env = small_world_envs[protocol]
    hops = set()
    for index in range(0, 40, 2):
        trajectory = run_episode(env, OracleAgent(), options={"index": index})
        assert trajectory.reward == pytest.approx(ORACLE_MAX[protocol]), (index, trajectory.reward_components)
        assert trajectory.counters["source_errors"] == trajectory.counters["invalid_plans"] == 0
        hops.add(len(env.example.decomposition))
    if protocol == "r-search":
        assert trajectory.reward_components["evidence_skipped"] is True
    assert len(hops) > 1, "the sample spans questions of several hops"
