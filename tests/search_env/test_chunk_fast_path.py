"""The chunk path's shortcuts keep its rules: ids outside the action space are refused whatever the form,
the attention set is the attention table, and a chunk that runs past the token where something happens
is taken back to that token and goes on after it exactly as token-by-token feeding does."""
from __future__ import annotations

import pytest

from search_env.data.example import QAExample
from search_env.env import SearchQAEnv
from tests.conftest import CountingSource

EXAMPLES = [QAExample("q1", "Who founded the city?", ["Bob Smith"])]


def make(tokenizer, **kwargs) -> SearchQAEnv:
    env = SearchQAEnv("search-r1", dataset=EXAMPLES, sources=CountingSource(), tokenizer=tokenizer, **kwargs)
    env.reset(options={"index": 0})
    return env


@pytest.mark.parametrize("make_action", [
    lambda vocab: [-1], lambda vocab: [3, vocab], lambda vocab: (5, -3), lambda vocab: [vocab + 7],
])
def test_ids_outside_the_action_space_in_a_chunk_are_a_value_error_that_changes_nothing(split_tag_tokenizer, make_action):
    env = make(split_tag_tokenizer)
    before = list(env.trajectory.token_ids)
    with pytest.raises(ValueError, match=r"must lie in \[0, "):
        env.step(make_action(env.codec.vocab_size))
    assert env.trajectory.token_ids == before and not env.done


def test_the_attention_set_is_the_attention_table(split_tag_tokenizer):
    env = make(split_tag_tokenizer)
    scanner = env._transition.scanner
    assert scanner.attention_ids == {i for i, flag in enumerate(scanner.attention) if flag}
    assert env.codec.eos_ids <= scanner.attention_ids
    assert env.codec.attention_ids(frozenset(b">")) is env.codec.attention_ids(frozenset(b">"))  # built once


@pytest.mark.parametrize("text", [
    "<search> who founded the city </search> and then <answer> Bob Smith </answer> trailing",
    "<answer> Bob Smith </answer> ignored after the end",
    " plain text <|endoftext|> after the end of sequence",
    "</answer> without its opening, then <answer> Bob Smith </answer>",
])
def test_a_chunk_past_its_event_equals_feeding_its_ids_one_by_one(split_tag_tokenizer, text):
    ids = split_tag_tokenizer.encode(text).ids
    chunked, single = make(split_tag_tokenizer), make(split_tag_tokenizer)
    obs, reward, terminated, truncated, info = chunked.step(ids)
    fed = [single.step(t) for t in ids[: info["consumed"]]]
    assert obs["token_ids"] == tuple(t for o, *_ in fed for t in o["token_ids"])
    assert (reward, terminated, truncated) == (sum(r for _, r, *_ in fed), fed[-1][2], fed[-1][3])
    assert chunked.trajectory.spans == single.trajectory.spans
    assert chunked.trajectory.token_ids == single.trajectory.token_ids and chunked.response_text == single.response_text
