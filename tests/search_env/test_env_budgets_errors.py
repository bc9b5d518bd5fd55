"""Budgets end episodes the Gymnasium way, and bad input becomes an observation, never an exception."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
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


class ReturnsAsIs(CountingSource):
    """A buggy plug-in source: it returns ``results`` whatever it is asked."""

    def __init__(self, name: str, results: object) -> None:
        super().__init__(name)
        self.results = results

    def search(self, queries, k):
        super().search(queries, k)
        return self.results


BAD_RESULTS = {
    "two lists for one query": [[], []],
    "None": None,
    "a list of None": [None],
    "strings, not passages": [["a passage, as text"]],
}


@pytest.mark.parametrize("results", list(BAD_RESULTS.values()), ids=list(BAD_RESULTS))
def test_a_source_returning_the_wrong_shape_is_an_error_observation_naming_it(split_tag_tokenizer, results):
    env = make(split_tag_tokenizer, source={"buggy": ReturnsAsIs("buggy", results)})
    obs, reward, terminated, truncated, info = feed(env, "<search> zarbo </search>")
    assert not (terminated or truncated)
    assert "Search failed: SourceError: source 'buggy' returned" in env.response_text
    assert env.trajectory.counters["source_errors"] == 1 and env.trajectory.tool_calls[0].error.startswith("SourceError")
    *_, terminated, _, _ = feed(env, "<answer> Bob Smith </answer>")
    assert terminated and env.trajectory.reward == 1.0, "the episode goes on normally after the error"


@pytest.mark.parametrize("action", [1.5, "5", True, [True, False], [1, 2.0], np.array([1.0, 2.0]), [2**63], 2**63, None, {1, 2}])
def test_non_integer_or_out_of_range_actions_are_a_value_error_that_changes_nothing(split_tag_tokenizer, action):
    env = make(split_tag_tokenizer)
    before = list(env.trajectory.token_ids)
    with pytest.raises(ValueError, match="token id|integers|action"):
        env.step(action)
    assert env.trajectory.token_ids == before and not env.done
    env.step(env.codec.encode("still fine"))


def test_integer_ids_of_every_accepted_form_are_the_same_action(split_tag_tokenizer):
    ids = split_tag_tokenizer.encode("the answer is").ids
    forms = [ids, tuple(ids), np.asarray(ids, dtype=np.int32), np.asarray(ids, dtype=np.uint16), [np.int64(t) for t in ids]]
    seen = set()
    for form in forms:
        env = make(split_tag_tokenizer)
        obs, *_ = env.step(form)
        seen.add(obs["token_ids"])
    assert seen == {tuple(ids)}
    env = make(split_tag_tokenizer)
    assert env.step(np.int16(ids[0]))[0]["token_ids"] == (ids[0],)


def test_an_invalid_plan_error_is_capped_however_broken_the_plan(split_tag_tokenizer):
    env = SearchQAEnv("reasoning-search", dataset=EXAMPLES, sources={"wiki": CountingSource("wiki")},
                      tokenizer=split_tag_tokenizer, max_new_tokens=50_000, max_context=100_000)
    env.reset(seed=0)
    plan = "Nodes:\n" + "\n".join(f"{chr(65 + i % 26)}: q (src{i} {'x' * 100})" for i in range(60))
    obs, *_ = feed(env, f"<search>{plan}</search>")
    error = env.response_text[len(f"<search>{plan}</search>"):]
    assert error.startswith("\n<result>\nInvalid search plan:\n- ") and "- ... and " in error
    assert len(error.splitlines()) <= 16 and max(map(len, error.splitlines())) <= 200
    assert env.trajectory.counters["invalid_plans"] == 1


def test_dag_node_queries_are_cut_like_single_queries(split_tag_tokenizer):
    wiki = CountingSource("wiki")
    env = SearchQAEnv("reasoning-search", dataset=EXAMPLES, sources={"wiki": wiki}, tokenizer=split_tag_tokenizer,
                      max_new_tokens=4000, max_context=30_000)
    env.reset(seed=0)
    feed(env, "<search>Nodes:\nA: " + "word " * 300 + "(wiki)\nB: short (wiki)\n</search>")
    assert sorted(len(q) for q in wiki.calls[0]) == [len("short"), MAX_QUERY_CHARS]
    assert env.trajectory.counters["queries_cut"] == 1
    assert [node["query_cut"] for node in env.trajectory.tool_calls[0].nodes] == [True, False]


def test_sources_may_be_a_corpus_path(split_tag_tokenizer, tmp_path):
    import json

    corpus = tmp_path / "corpus.jsonl"
    rows = [{"id": "1", "title": "Zarbo", "text": "Zarbo was founded by Bob Smith."}, {"id": "2", "title": "Quell", "text": "Quell lies in Mirth."}]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    for sources in (str(corpus), corpus, {"notes": str(corpus)}):
        env = make(split_tag_tokenizer, source=sources)
        feed(env, "<search> who founded zarbo </search>")
        assert env.trajectory.tool_calls[0].passage_ids[0] == "1"
    assert make(split_tag_tokenizer, source=str(corpus)).default_source == "wiki"
    with pytest.raises(FileNotFoundError):
        make(split_tag_tokenizer, source=str(tmp_path / "missing.jsonl"))
    with pytest.raises(TypeError, match="a Source, a corpus path"):
        make(split_tag_tokenizer, source=42)
    with pytest.raises(TypeError, match=r"sources\['wiki'\] must be a Source or a corpus path"):
        make(split_tag_tokenizer, source={"wiki": 42})
