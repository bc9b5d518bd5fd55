"""Budgets end episodes the Gymnasium way, and bad input becomes an observation, never an exception."""
from __future__ import annotations

import gymnasium as gym
import pytest

from search_env.data.example import QAExample
from search_env.env import MAX_QUERY_CHARS, SearchQAEnv
from search_env.protocols import SEARCH_R1_INVALID_ACTION
from tests.conftest import CountingSource

EXAMPLES = [QAExample("q1", "Who founded Zarbo?", ["Bob Smith"]), QAExample("q2", "Where is Quell?", ["Mirth"])]


def make(tokenizer, protocol="search-r1", source=None, **kwargs) -> SearchQAEnv:
    env = SearchQAEnv(protocol, dataset=EXAMPLES, sources=source or CountingSource(), tokenizer=tokenizer, **kwargs)
    env.reset(seed=0, options={"index": 0})
    return env


def feed(env: SearchQAEnv, text: str):
    return env.step(env.codec.encode(text))


def test_max_new_tokens_truncates(split_tag_tokenizer):
    env = make(split_tag_tokenizer, max_new_tokens=5)
    ids = env.codec.encode("the answer is in the search results about the question")
    outcomes = [env.step(t) for t in ids[:5]]
    assert [o[3] for o in outcomes] == [False] * 4 + [True]
    assert not outcomes[-1][2], "a budget truncates, it does not terminate"
    assert env.trajectory.end_reason == "max_new_tokens"
    with pytest.raises(gym.error.ResetNeeded):
        env.step(ids[5])


def test_max_context_truncates_and_cuts_an_observation(split_tag_tokenizer):
    env = make(split_tag_tokenizer, max_context=10_000)
    room = len(env.trajectory.token_ids) + 30
    env = make(split_tag_tokenizer, max_context=room)
    *_, terminated, truncated, info = feed(env, "<search> zarbo </search>")
    assert truncated and not terminated and env.trajectory.end_reason == "max_context"
    assert len(env.trajectory.token_ids) == room


def test_max_turns_gives_an_error_observation_then_allows_an_answer(split_tag_tokenizer):
    source = CountingSource()
    env = make(split_tag_tokenizer, source=source, max_turns=1)
    feed(env, "<search> a </search>")
    feed(env, "<search> b </search>")
    assert source.calls == [["a"]]
    assert env.trajectory.counters["budget_exhausted_calls"] == 1
    assert "budget" in env.response_text
    *_, terminated, truncated, _ = feed(env, "<answer> Bob Smith </answer>")
    assert terminated and env.trajectory.reward == 1.0


def test_eos_ends_the_episode(split_tag_tokenizer):
    env = make(split_tag_tokenizer)
    eos = min(env.codec.eos_ids)
    _, reward, terminated, truncated, info = env.step(eos)
    assert terminated and not truncated and info["end_reason"] == "eos" and reward == 0.0


@pytest.mark.parametrize(
    "text,counter,observed",
    [
        ("hello </search>", "invalid_calls", SEARCH_R1_INVALID_ACTION),
        ("<search>   </search>", "empty_queries", SEARCH_R1_INVALID_ACTION),
        ("oops </answer>", "invalid_calls", SEARCH_R1_INVALID_ACTION),
    ],
)
def test_invalid_calls_become_the_protocols_error_observation(split_tag_tokenizer, text, counter, observed):
    env = make(split_tag_tokenizer)
    obs, reward, terminated, truncated, info = feed(env, text)
    assert not (terminated or truncated)
    assert env.trajectory.counters[counter] == 1
    assert env.response_text == text + observed
    assert env.codec.decode(obs["token_ids"]) == text + observed
    assert list(obs["producers"]) == [1] * len(env.codec.encode(text)) + [0] * len(env.codec.encode(observed))


def test_r1_searcher_empty_query_ends_the_episode(split_tag_tokenizer):
    env = make(split_tag_tokenizer, protocol="r1-searcher")
    *_, terminated, truncated, info = feed(env, '</think><|begin_of_query|> "" <|end_of_query|>')
    assert terminated and info["end_reason"] == "empty_query"


def test_call_inside_answer_is_counted_not_run(split_tag_tokenizer):
    source = CountingSource()
    env = make(split_tag_tokenizer, source=source)
    *_, terminated, _, _ = feed(env, "<answer> Bob <search> x </search> Smith </answer>")
    assert terminated and source.calls == []
    assert env.trajectory.counters["calls_inside_answer"] == 1
    assert env.trajectory.answer == "Bob <search> x </search> Smith"


def test_unknown_tags_long_queries_and_invalid_utf8_do_not_raise(split_tag_tokenizer):
    source = CountingSource()
    env = make(split_tag_tokenizer, source=source, max_new_tokens=4000, max_context=30_000)
    feed(env, "<foo> <bar/> </baz>")
    long_query = "word " * 300  # 1500 characters
    feed(env, f"<search>{long_query}</search>")
    assert len(source.calls[0][0]) == MAX_QUERY_CHARS and env.trajectory.counters["queries_cut"] == 1
    lone_lead_byte = env.codec.tokenizer.token_to_id("Ã")  # byte 0xC3 in the byte-level alphabet
    assert env.codec.token_bytes[lone_lead_byte] == b"\xc3"
    feed(env, "<search> caf")
    env.step(lone_lead_byte)
    obs, reward, terminated, truncated, info = feed(env, " </search>")
    assert source.calls[-1][0] == "caf\ufffd"
    assert not (terminated or truncated)


def test_source_failure_is_an_error_observation(split_tag_tokenizer):
    env = make(split_tag_tokenizer, source=CountingSource(fail=True))
    obs, *_ = feed(env, "<search> zarbo </search>")
    assert "Search failed" in env.response_text and env.trajectory.counters["source_errors"] == 1
    assert env.trajectory.tool_calls[0].error.startswith("SourceError")


def test_unterminated_call_at_budget_end_is_counted(split_tag_tokenizer):
    env = make(split_tag_tokenizer, max_new_tokens=4)
    ids = env.codec.encode("<search> the answer is in the")
    for t in ids[:4]:
        *_, truncated, _ = env.step(t)
    assert truncated and env.trajectory.counters["unterminated_calls"] == 1


def test_out_of_vocabulary_ids_are_rejected(split_tag_tokenizer):
    env = make(split_tag_tokenizer)
    with pytest.raises(ValueError):
        env.step(-1)
    with pytest.raises(ValueError):
        env.step([1, 2, env.action_space.n])


def test_step_before_reset_raises(split_tag_tokenizer):
    env = SearchQAEnv("search-r1", dataset=EXAMPLES, sources=CountingSource(), tokenizer=split_tag_tokenizer)
    with pytest.raises(gym.error.ResetNeeded):
        env.step(3)


def test_seeding_is_deterministic(split_tag_tokenizer):
    many = [QAExample(f"q{i}", f"Question {i}?", [str(i)]) for i in range(50)]
    env = SearchQAEnv("search-r1", dataset=many, sources=CountingSource(), tokenizer=split_tag_tokenizer)
    first = [env.reset(seed=s)[1]["example_id"] for s in range(10)]
    again = [env.reset(seed=s)[1]["example_id"] for s in range(10)]
    assert first == again and len(set(first)) > 3


def test_export_is_plain_json(split_tag_tokenizer):
    import json

    env = make(split_tag_tokenizer)
    feed(env, "<search> zarbo </search><answer> Bob Smith </answer>")
    data = json.loads(json.dumps(env.trajectory.to_dict()))
    assert data["reward"] == 1.0 and data["tool_calls"][0]["content"] == "zarbo"
    assert len(data["producers"]) == len(data["token_ids"]) == len(data["trained"])


class SlowSource(CountingSource):
    def search(self, queries, k):
        import time

        time.sleep(0.5)
        return super().search(queries, k)


def test_env_options_cache_repeated_queries_and_time_out_slow_sources(split_tag_tokenizer):
    source = CountingSource()
    env = make(split_tag_tokenizer, source=source, cache_size=16)
    feed(env, "<search> zarbo </search><search> zarbo </search>")
    assert source.calls == [["zarbo"]] and env.trajectory.counters["searches"] == 2
    slow = make(split_tag_tokenizer, source=SlowSource(), source_timeout_s=0.05)
    feed(slow, "<search> zarbo </search>")
    assert slow.trajectory.counters["source_errors"] == 1 and "Search failed" in slow.response_text
    assert "SourceError" in slow.trajectory.tool_calls[0].error
