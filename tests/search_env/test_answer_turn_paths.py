"""The answer turn's shortcuts keep the record exact: the two-tag search finds what the loop over the tags
finds, a chunk's observation is the record's new tokens with their producers, the caller's list is read
and not kept, and the answer's span and text are what the record's bytes give, non-ASCII ones included."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from search_env.data.example import QAExample
from search_env.env import SearchQAEnv
from search_env.protocols import get_protocol
from search_env.scanner import TagScanner, token_range
from search_env.tokenization import as_codec
from search_env.trajectory import AGENT, ENVIRONMENT
from tests.conftest import CountingSource

EXAMPLES = [QAExample("q1", "Who founded the city?", ["Bob Smith"]), QAExample("q2", "Which country?", ["日本"])]

#: Tag pairs, the usual one first; then tags ending at the same byte (a tie), one inside the other, equal tags.
TAG_PAIRS = [
    ("</search>", "</answer>"), ("er>", "</answer>"), ("</answer>", "er>"), ("wer", "</answer>"), ("ab", "ab"), ("</検索>", "</答え>"),
]
PIECES = ["</search>", "</answer>", "er>", "wer", "ab", "a", "b", ">", "</", " x ", "</検索>", "</答え>", "答"]


def loop_first_tag(tags: tuple[bytes, ...], buf: bytes, after: int, turn_start: int) -> tuple[int, int, int] | None:
    """The reference: each tag in turn, the one ending first kept (a tie keeps the earlier tag)."""
    best = None
    for which, tag in enumerate(tags):
        pos = buf.find(tag, max(after - len(tag) + 1, turn_start))
        if pos != -1 and (best is None or pos + len(tag) < best[2]):
            best = (which, pos, pos + len(tag))
    return best


@settings(max_examples=300, deadline=None)
@given(pair=st.sampled_from(TAG_PAIRS), pieces=st.lists(st.sampled_from(PIECES), max_size=12), data=st.data())
def test_the_two_tag_search_finds_what_the_loop_over_the_tags_finds(pair, pieces, data):
    scanner = TagScanner(as_codec(None), pair)
    buf = bytearray("".join(pieces).encode())
    after = data.draw(st.integers(0, len(buf)))
    turn_start = data.draw(st.integers(0, after))
    assert scanner.first_tag(buf, after, turn_start) == loop_first_tag(scanner.tags, bytes(buf), after, turn_start)


def make(tokenizer, protocol="search-r1", **kwargs) -> SearchQAEnv:
    env = SearchQAEnv(protocol, dataset=EXAMPLES, sources=CountingSource(), tokenizer=tokenizer, **kwargs)
    env.reset(options={"index": 0})
    return env


TEXTS = [
    "<answer> Bob Smith </answer>",
    "</answer> without its opening, then <answer> Bob Smith </answer>",  # an error observation inside the chunk
    "<search> who founded the city </search> then <answer> Bob Smith </answer>",  # results inside the chunk
    " plain text, no tag",
    " plain text <|endoftext|> after the end",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("form", [list, tuple, np.asarray])
def test_a_chunk_observation_is_the_records_new_tokens_with_their_producers(split_tag_tokenizer, text, form):
    env = make(split_tag_tokenizer, max_new_tokens=200)
    start = len(env.trajectory.token_ids)
    ids = split_tag_tokenizer.encode(text).ids
    obs, *_, info = env.step(form(ids))
    traj = env.trajectory
    assert obs["token_ids"] == tuple(traj.token_ids[start:]) and obs["producers"] == tuple(traj.producers[start:])
    assert type(obs["token_ids"]) is tuple and type(obs["producers"]) is tuple
    agent = [i for i, p in enumerate(obs["producers"]) if p == AGENT]
    assert len(agent) == info["consumed"] and [obs["token_ids"][i] for i in agent] == ids[: info["consumed"]]
    if "error" in {s.kind for s in traj.spans} or "result" in {s.kind for s in traj.spans}:
        assert ENVIRONMENT in obs["producers"]


def test_the_batched_pieces_give_the_same_observation(split_tag_tokenizer):
    ids = split_tag_tokenizer.encode(TEXTS[1]).ids
    stepped, batched = make(split_tag_tokenizer), make(split_tag_tokenizer)
    assert batched.start_step(ids) is None
    a, b = stepped.step(ids), batched.finish_step()
    assert a[0] == b[0] and a[1:4] == b[1:4] and a[4]["events"] == b[4]["events"] and a[4]["consumed"] == b[4]["consumed"]


def test_a_chunk_list_is_read_and_not_kept(split_tag_tokenizer):
    env = make(split_tag_tokenizer)
    ids = split_tag_tokenizer.encode("<search> who founded the city </search> then <answer> Bob Smith </answer>").ids
    action = list(ids)
    obs, reward, terminated, _, info = env.step(action)
    assert action == ids and terminated and info["consumed"] == len(ids)
    recorded = list(env.trajectory.token_ids)
    action[:] = [0] * len(action)  # the caller reuses its list: the record does not change
    assert env.trajectory.token_ids == recorded and obs["token_ids"] == tuple(recorded[-len(obs["token_ids"]):])


def answer_span_by_bytes(env: SearchQAEnv) -> tuple[int, int]:
    """The answer span as EpisodeBuffer.add_span records it, from the record's bytes."""
    ep, p = env._episode, env.protocol
    close = p.answer_close.encode()
    at = ep.text.find(close, ep.prompt_bytes)
    opened = ep.text.rfind(p.answer_open.encode(), ep.prompt_bytes, at)
    return token_range(ep.ends, opened, at + len(close))


@pytest.mark.parametrize("tags", [False, True])
@pytest.mark.parametrize("answer", [" Bob Smith ", "日本", "  \u00e9t\u00e9 ", None])
@pytest.mark.parametrize("chunked", [False, True])
def test_the_answer_span_and_text_are_the_records_bytes(split_tag_tokenizer, tags, answer, chunked):
    protocol = get_protocol("search-r1")
    if tags:  # non-ASCII tags: byte offsets and text lengths differ
        protocol = dataclasses.replace(protocol, name="test-answer-turn-tags", answer_open="<答え>", answer_close="</答え>")
    env = make(split_tag_tokenizer, protocol)
    if answer is None:  # a broken UTF-8 sequence: the first byte of a three-byte character, alone
        inner = split_tag_tokenizer.encode("日").ids[:1]
        assert split_tag_tokenizer.decode(inner) != "日"
    else:
        inner = split_tag_tokenizer.encode(answer).ids
    ids = split_tag_tokenizer.encode(protocol.answer_open).ids + inner + split_tag_tokenizer.encode(protocol.answer_close).ids
    if chunked:
        _, _, terminated, _, info = env.step(ids)
    else:
        for t in ids:
            _, _, terminated, _, info = env.step(t)
    assert terminated and info["end_reason"] == "answer"
    ep, traj = env._episode, env.trajectory
    assert [(s.start, s.end) for s in traj.spans if s.kind == "answer"] == [answer_span_by_bytes(env)]
    assert traj.answer == info["answer"] == ep.decode(*ep.answer_at).strip()
    assert traj.response_text == ep.decode(ep.prompt_bytes)
    if answer is not None:  # the text between the tags, whatever their bytes
        assert traj.answer == answer.strip()
