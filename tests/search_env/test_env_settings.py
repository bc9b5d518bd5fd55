"""Settings that default to the protocol's say so with ``None``, never with a sentinel number."""
from __future__ import annotations

import pytest

from search_env.data.example import QAExample
from search_env.env import SearchQAEnv
from search_env.protocols import get_protocol
from tests.conftest import CountingSource

EXAMPLES = [QAExample("q1", "Who founded Zarbo?", ["Bob Smith"])]


def make(tokenizer, protocol="search-r1", **kwargs) -> SearchQAEnv:
    return SearchQAEnv(protocol, dataset=EXAMPLES, sources=CountingSource(), tokenizer=tokenizer, **kwargs)


def test_none_means_the_protocols_turn_budget_and_top_k(split_tag_tokenizer):
    for name in ("search-r1", "r-search", "research"):
        env = make(split_tag_tokenizer, name)
        protocol = get_protocol(name)
        assert (env.max_turns, env.top_k) == (protocol.max_turns, protocol.top_k)
    assert get_protocol("research").max_turns is None  # a protocol without a budget: unlimited
    env = make(split_tag_tokenizer, max_turns=0, top_k=1)
    assert (env.max_turns, env.top_k) == (0, 1)


def test_lifting_a_protocols_budget_is_a_protocol_option(split_tag_tokenizer):
    unlimited = get_protocol("search-r1").with_options(name="search-r1-unlimited", max_turns=None)
    env = make(split_tag_tokenizer, unlimited)
    assert env.max_turns is None
    env.reset(seed=0)
    for turn in range(12):  # more than search-r1's 10
        env.step(env.codec.encode(f"<search> q{turn} </search>"))
    assert env.trajectory.counters["searches"] == 12 and env.trajectory.counters["budget_exhausted_calls"] == 0


@pytest.mark.parametrize("setting, value", [("max_turns", -1), ("max_turns", 2.5), ("max_turns", True), ("top_k", 0)])
def test_a_sentinel_or_a_bad_budget_is_a_one_line_error(split_tag_tokenizer, setting, value):
    with pytest.raises(ValueError, match=f"{setting} must be an int >= ., or None for the protocol's; got {value!r}"):
        make(split_tag_tokenizer, **{setting: value})
