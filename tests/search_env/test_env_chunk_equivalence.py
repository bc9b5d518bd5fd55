"""A chunk of ids must give exactly the episode that feeding the same ids one at a time gives: the same
observations, events and reward, and the same trajectory record (answer, spans, tool calls, counters,
reward components), end-of-sequence ids included."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from search_env.data.example import QAExample
from search_env.env import SearchQAEnv
from tests.conftest import CountingSource

EXAMPLES = [QAExample("q1", "Who founded the city?", ["Bob Smith"])]

FRAGMENTS = [
    "<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>", "<information>",
    "<|begin_of_query|>", "<|end_of_query|>", "<result>", "</result>", "<original_evidence>",
    "</original_evidence>", "Nodes:\nA: who founded (News)\n", "Edges:\nA -> B\n", "B: where {A} (General)\n",
    " the city", " Bob Smith", "who", " ", "\n", "<", ">", "</", "search", "answer", "<foo>", "\\boxed{x}",
    "é", "日本", "\ufffd",
    "<|endoftext|>", " <answer> Bob Smith </answer><|endoftext|>",  # both test tokenizers read it as their EOS id
    # native tool calls: whole and broken calls, unknown tools, wrong argument types, a call left open
    "<tool_call>", "</tool_call>", '{"name": "wiki", "arguments": {"query": "who"}}', '{"name": "all", "parameters": {"query": "x"}}',
    '{"name": "nope", "arguments": {"query": "x"}}', '{"name": "news", "arguments": {"query": 7}}', '{"name": ', "[", "]", "}",
    '"', "<|python_tag|>", "[TOOL_CALLS]", "<tool_call>\n{\"name\": \"all\", \"arguments\": {\"query\": \"city\"}}\n</tool_call><|endoftext|>",
]


def run_steps(env: SearchQAEnv, actions):
    """Step ``actions`` until the episode ends; collect what every step returned."""
    obs_ids, producers, events, reward, end = [], [], [], 0.0, (False, False)
    for action in actions:
        obs, r, term, trunc, info = env.step(action)
        obs_ids.extend(obs["token_ids"])
        producers.extend(obs["producers"])
        events.extend(info.get("events", []))
        reward += r
        end = (term, trunc)
        if term or trunc:
            break
    return obs_ids, producers, events, reward, end


def run_single(env: SearchQAEnv, ids: list[int]):
    return run_steps(env, ids)


def run_chunked(env: SearchQAEnv, ids: list[int], cuts: list[int]):
    bounds = sorted({c % (len(ids) + 1) for c in cuts} | {0, len(ids)})
    return run_steps(env, (np.asarray(ids[lo:hi]) for lo, hi in zip(bounds, bounds[1:])))


def comparable(env: SearchQAEnv) -> dict:
    data = env.trajectory.to_dict()
    for call in data["tool_calls"]:
        call.pop("started_at")
        call.pop("duration_s")
        for node in call["nodes"]:
            node.pop("start", None), node.pop("end", None), node.pop("started_at", None), node.pop("duration_s", None)
    return data


def make_env(tokenizer, protocol: str, max_new_tokens: int, max_turns: int | None) -> SearchQAEnv:
    sources = {"all": CountingSource("all"), "wiki": CountingSource("wiki"), "news": CountingSource("news")}
    return SearchQAEnv(
        protocol, dataset=EXAMPLES, sources=sources, tokenizer=tokenizer,
        max_new_tokens=max_new_tokens, max_turns=max_turns, max_context=4096,
    )


def check_equivalent(tokenizer, protocol, ids, cuts, max_new_tokens, max_turns):
    single, chunked = make_env(tokenizer, protocol, max_new_tokens, max_turns), make_env(tokenizer, protocol, max_new_tokens, max_turns)
    single.reset(seed=0)
    chunked.reset(seed=0)
    a = run_single(single, ids)
    b = run_chunked(chunked, ids, cuts)
    assert a[0] == b[0], "observed token ids differ"
    assert a[1] == b[1], "producer flags differ"
    assert a[2] == b[2], "events differ"
    assert a[3] == pytest.approx(b[3])
    assert a[4] == b[4]
    assert comparable(single) == comparable(chunked)



@pytest.fixture(params=["tags-split-across-tokens", "builtin-tags-as-single-tokens"])
def stream_tokenizer(request, split_tag_tokenizer):
    if request.param == "tags-split-across-tokens":
        return split_tag_tokenizer
    from search_env.synthetic import load_builtin_tokenizer

    return load_builtin_tokenizer()


@pytest.mark.parametrize("protocol", ["search-r1", "r1-searcher", "research", "r-search", "reasoning-search", "tool-calls",
                                      "tool-calls-llama3", "tool-calls-mistral"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fragments=st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=40),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
    max_new_tokens=st.integers(3, 300),
    max_turns=st.sampled_from([None, 0, 1, 3]),
)
def test_chunks_equal_single_steps_on_scripted_streams(stream_tokenizer, protocol, fragments, cuts, max_new_tokens, max_turns):
    ids = stream_tokenizer.encode("".join(fragments)).ids
    check_equivalent(stream_tokenizer, protocol, ids, cuts, max_new_tokens, max_turns)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
    max_new_tokens=st.integers(1, 400),
)
def test_chunks_equal_single_steps_on_random_ids(split_tag_tokenizer, data, cuts, max_new_tokens):
    vocab = split_tag_tokenizer.get_vocab_size()
    tag_ids = split_tag_tokenizer.encode("</search><search>q</answer><answer>").ids
    protocol = data.draw(st.sampled_from(["search-r1", "research"]))  # research runs on past its answer to EOS
    ids = data.draw(st.lists(st.one_of(st.integers(0, vocab - 1), st.sampled_from(tag_ids)), max_size=300))  # EOS included
    check_equivalent(split_tag_tokenizer, protocol, ids, cuts, max_new_tokens, None)


def test_research_answer_then_eos_records_the_answer_token_by_token_as_in_one_chunk(split_tag_tokenizer):
    ids = split_tag_tokenizer.encode("<think> ok </think> <answer> \\boxed{Bob Smith} </answer>").ids
    eos = split_tag_tokenizer.token_to_id("<|endoftext|>")
    single, chunked = make_env(split_tag_tokenizer, "research", 500, None), make_env(split_tag_tokenizer, "research", 500, None)
    single.reset(seed=0)
    chunked.reset(seed=0)
    run_single(single, ids + [eos])
    run_chunked(chunked, ids + [eos], [])
    assert single.trajectory.answer == chunked.trajectory.answer == "\\boxed{Bob Smith}"
    assert single.trajectory.end_reason == "eos" and comparable(single) == comparable(chunked)


def test_a_chunk_that_runs_past_a_closing_tag_continues_after_the_results(split_tag_tokenizer):
    env = make_env(split_tag_tokenizer, "search-r1", 500, None)
    env.reset(seed=0)
    ids = split_tag_tokenizer.encode("<search> who </search> more text <answer> Bob Smith </answer> ignored").ids
    obs, reward, terminated, truncated, info = env.step(ids)
    assert terminated and not truncated
    assert [e["event"] for e in info["events"]] == ["results", "end"]
    assert info["consumed"] < len(ids), "ids after the answer's close tag must be left unconsumed"
    text = env.trajectory.response_text
    assert text.index("</information>") < text.index("more text"), "text after the call must follow the results"
    assert reward == 1.0
