"""Scripted agents write each dialect from the protocol's data, and the oracle searches every
sub-question that needs a search."""
from __future__ import annotations

import re

import gymnasium as gym
import pytest

import search_env  # noqa: F401  (registers SearchQA-v0)
from agents import DialectWriter, OracleAgent, run_episode
from search_env import Dialect, get_protocol, register_protocol
from search_env.data.example import QAExample, SubQuestion
from search_env.env import SearchQAEnv
from tests.conftest import CountingSource

# What each built-in dialect's model writes, from ../shared/PROTOCOLS.md and the seed systems'
# prompts: (thought "t", call "q", answer "x", answer "x" with evidence "ev").
BOXED = "<answer> The final answer is \\[ \\boxed{x} \\] </answer>"
WRITING = {
    "search-r1": ("<think> t </think>", "<search> q </search>", "<answer> x </answer>", "<answer> x </answer>"),
    # thinks inside the <think> its prompt opened; the answer closes it
    "r1-searcher": ("t ", "<|begin_of_query|> q <|end_of_query|>", "</think><answer> x </answer>", "</think><answer> x </answer>"),
    "research": ("<think> t </think>", "<search> q </search>", BOXED, BOXED),
    # no think tag; the evidence block comes before the answer
    "r-search": ("t ", "<search> q </search>", "<answer> x </answer>",
                 "<original_evidence> ev </original_evidence><answer> x </answer>"),
    "reasoning-search": ("<think> t </think>", "<search> q </search>", "<answer> x </answer>", "<answer> x </answer>"),
    # native tool calls of the first tool (the registered protocol's is "search"; an environment offers its sources)
    "tool-calls": ("<think> t </think>", '<tool_call>\n{"name": "search", "arguments": {"query": "q"}}\n</tool_call>',
                   "<answer> x </answer>", "<answer> x </answer>"),
    "tool-calls-llama3": ("<think> t </think>", '{"name": "search", "parameters": {"query": "q"}}', "<answer> x </answer>",
                          "<answer> x </answer>"),
    "tool-calls-mistral": ("<think> t </think>", '[TOOL_CALLS] [{"name": "search", "arguments": {"query": "q"}}]',
                           "<answer> x </answer>", "<answer> x </answer>"),
}


@pytest.mark.parametrize("name", sorted(WRITING))
def test_builtin_dialects_are_written_as_their_models_write(name: str) -> None:
    writer = DialectWriter(get_protocol(name))
    assert (writer.think("t"), writer.call("q"), writer.answer("x"), writer.answer("x", evidence="ev")) == WRITING[name]
    plan = writer.plan([("A", "q", None), ("B", "r {A}", "news")], [("A", "B")])
    p = get_protocol(name)
    assert plan == f"{p.call_open}\nNodes:\nA: q (General)\nB: r {{A}} (News)\nEdges:\nA -> B\n{p.call_close}"


def _dialect(name: str) -> Dialect:
    return Dialect(
        name=name,
        call_open="<tool>", call_close="</tool>",
        result_open="<docs>", result_close="</docs>",
        user_template="Q: {question}\n",
        result_prefix="\n<docs>", result_suffix="</docs>\n",
        answer_open="<final>", answer_close="</final>",
        thought_template="<reason>{text}</reason>\n",
        answer_template="ANSWER={answer}",
        answer_prefix="\n",
        evidence_open="<cite>", evidence_close="</cite>",
        reward="search-r1",
    )


def test_a_registered_dialect_gets_its_own_writing() -> None:
    register_protocol(_dialect("test-own-writing"), replace=True)
    writer = DialectWriter(get_protocol("test-own-writing"))
    assert writer.think("why") == "<reason>why</reason>\n"
    assert writer.answer("Bob", evidence="Bob founded it") == "\n<cite> Bob founded it </cite><final> ANSWER=Bob </final>"
    assert writer.answer("Bob") == "\n<final> ANSWER=Bob </final>"

    example = QAExample("q", "Who founded Zarbo?", ["Bob"], decomposition=[SubQuestion("A", "Zarbo founder", "Bob", "all")])
    env = gym.make("SearchQA-v0", protocol="test-own-writing", dataset=[example], sources=CountingSource())
    traj = run_episode(env, OracleAgent(), seed=0)
    text = traj.response_text
    assert text.startswith("<reason>I need: Zarbo founder</reason>\n<tool> Zarbo founder </tool>\n<docs>")
    assert text.endswith("<reason>I have what I need.</reason>\n\n<cite> Bob </cite><final> ANSWER=Bob </final>")
    assert traj.end_reason == "answer"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"thought_template": "<reason></reason>"}, r"thought_template '<reason></reason>' has no \{text\}"),
        ({"answer_template": "\\boxed{{answer}}"}, r"answer_template .* has no \{answer\}"),
        ({"answer_template": "\\boxed{{answer}"}, r"answer_template .* is not a format string with only \{answer\}"),
        ({"thought_template": "{text} {mood}"}, r"thought_template .* is not a format string with only \{text\}"),
        ({"evidence_open": "<cite>", "evidence_close": None}, "give both evidence_open and evidence_close, or neither"),
    ],
)
def test_bad_writing_fields_are_clear_errors(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _dialect("bad").with_options(**changes)


# --- the oracle ------------------------------------------------------------------------------------

MUSIQUE_LIKE = QAExample(
    "m1",
    "Who is the spouse of the Green performer?",
    ["Miquette Giraudy"],
    decomposition=[  # MuSiQue names no source for its steps
        SubQuestion("A", "Green >> performer", "Steve Hillage"),
        SubQuestion("B", "{A} >> spouse", "Miquette Giraudy", parents=["A"]),
    ],
)


@pytest.mark.parametrize("protocol", ["search-r1", "r1-searcher", "research", "r-search"])
def test_oracle_searches_every_step_of_a_decomposition_without_sources(protocol: str) -> None:
    source = CountingSource()
    env = SearchQAEnv(protocol, dataset=[MUSIQUE_LIKE], sources=source)
    traj = run_episode(env, OracleAgent(), seed=0)
    assert source.calls == [["Green >> performer"], ["Steve Hillage >> spouse"]]  # the parent's answer substituted
    assert [call.content.strip() for call in traj.tool_calls] == ["Green >> performer", "Steve Hillage >> spouse"]


@pytest.mark.parametrize("protocol", ["tool-calls", "tool-calls-llama3", "tool-calls-mistral"])
def test_oracle_calls_every_step_at_once_with_native_tool_calls(protocol: str) -> None:
    source = CountingSource()
    traj = run_episode(SearchQAEnv(protocol, dataset=[MUSIQUE_LIKE], sources=source), OracleAgent(), seed=0)
    assert source.calls == [["Green >> performer", "Steve Hillage >> spouse"]]  # one turn, one batch
    assert [call.content for call in traj.tool_calls] == ["Green >> performer", "Steve Hillage >> spouse"]
    assert traj.response_text.count("<tool_response>") == 2 and traj.reward == 1.0


def test_oracle_scores_on_the_synthetic_world_under_tool_calls_as_under_search_r1() -> None:
    rewards = {}
    for protocol in ("search-r1", "tool-calls", "tool-calls-llama3", "tool-calls-mistral"):
        env = SearchQAEnv(protocol, world_size=200)
        rewards[protocol] = [run_episode(env, OracleAgent(), options={"index": i}).reward for i in range(40)]
    assert rewards["tool-calls"] == rewards["tool-calls-llama3"] == rewards["tool-calls-mistral"] == rewards["search-r1"] == [1.0] * 40


def test_oracle_plans_every_step_with_its_edges() -> None:
    env = SearchQAEnv("reasoning-search", dataset=[MUSIQUE_LIKE], sources={"wiki": CountingSource("wiki")})
    traj = run_episode(env, OracleAgent(), seed=0)
    assert "A: Green >> performer (General)\nB: Steve Hillage >> spouse (General)\nEdges:\nA -> B" in traj.response_text


def test_oracle_answers_checks_from_their_parents_when_the_dataset_names_sources() -> None:
    # the synthetic world's yes/no check: B names no source and follows from A's answer
    example = QAExample("s1", "Was Zarbo founded by Bob?", ["yes"], decomposition=[
        SubQuestion("A", "Who founded Zarbo?", "Bob", "wiki"),
        SubQuestion("B", "Is {A} the same as Bob?", "yes", None, ["A"]),
    ])
    source = CountingSource()
    run_episode(SearchQAEnv("search-r1", dataset=[example], sources=source), OracleAgent(), seed=0)
    assert source.calls == [["Who founded Zarbo?"]]


def test_oracle_searches_each_musique_step_on_real_data(shared_data) -> None:
    from search_env.data.loaders import load_dataset
    from search_env.sources.bm25 import BM25Source

    examples = list(load_dataset(str(shared_data / "musique_dev.jsonl")))[:40]
    env = SearchQAEnv("search-r1", dataset=examples, sources=BM25Source(shared_data / "corpus.jsonl", name="wiki"))
    for i, example in enumerate(examples):
        traj = run_episode(env, OracleAgent(), seed=0, options={"index": i})
        assert len(traj.tool_calls) == len(example.decomposition) >= 2
        assert traj.reward == 1.0


HOTPOT_LIKE = QAExample("h1", "Were Ann Ray and Bo Lee of the same nationality?", ["yes"], metadata={"contexts": [
    {"title": "Ann Ray (film)", "text": "Ann Ray is a 1990 film.", "is_supporting": False},
    {"title": "Ann Ray", "text": "Ann Ray is an American director.", "is_supporting": True},
    {"title": "Bo Lee", "text": "Bo Lee was an American writer.", "is_supporting": True},
]})  # HotpotQA has no decomposition: its gold passages are the supporting contexts


@pytest.mark.parametrize("protocol", ["search-r1", "r1-searcher", "research", "r-search"])
def test_oracle_without_a_decomposition_searches_its_gold_passages_by_title(protocol: str) -> None:
    source = CountingSource()
    traj = run_episode(SearchQAEnv(protocol, dataset=[HOTPOT_LIKE], sources=source), OracleAgent(), seed=0)
    assert source.calls == [["Ann Ray"], ["Bo Lee"]]
    assert traj.answer is not None and "yes" in traj.answer
    if protocol == "r-search":  # the evidence it cites is the gold passages' text
        evidence = "Ann Ray is an American director. Bo Lee was an American writer."
        assert f"<original_evidence> {evidence} </original_evidence>" in traj.response_text


def test_oracle_without_a_decomposition_plans_one_node_per_gold_passage() -> None:
    source = CountingSource("wiki")
    traj = run_episode(SearchQAEnv("reasoning-search", dataset=[HOTPOT_LIKE], sources={"wiki": source}), OracleAgent(), seed=0)
    assert "Nodes:\nA: Ann Ray (General)\nB: Bo Lee (General)\n</search>" in traj.response_text
    assert sorted(q for call in source.calls for q in call) == ["Ann Ray", "Bo Lee"]
    assert traj.reward_components["dag_valid"] and traj.reward == 1.0


@pytest.mark.parametrize("protocol", ["search-r1", "reasoning-search"])
def test_on_hotpotqa_the_oracle_finds_its_gold_passages_and_outscores_title_copying(shared_data, protocol: str) -> None:
    from agents import RetrieveThenAnswerAgent
    from search_env.data.loaders import load_dataset
    from search_env.sources.bm25 import BM25Source

    examples = list(load_dataset(str(shared_data / "hotpotqa_dev.jsonl")))[:40]
    env = SearchQAEnv(protocol, dataset=examples, sources=BM25Source(shared_data / "corpus.jsonl", name="wiki"))
    oracle = [run_episode(env, OracleAgent(), seed=0, options={"index": i}) for i in range(len(examples))]
    copier = [run_episode(env, RetrieveThenAnswerAgent(), seed=0, options={"index": i}) for i in range(len(examples))]
    if protocol == "reasoning-search":  # a plan of one node per gold passage, never an empty one
        assert [len(re.findall(r"^[A-Z]: ", t.tool_calls[0].content, re.M)) for t in oracle] == [2] * len(examples)
    assert all(len(t.tool_calls) == (1 if protocol == "reasoning-search" else 2) for t in oracle)
    retrieved = [set(ex.gold_passage_ids) <= {p for call in t.tool_calls for p in call.passage_ids}
                 for ex, t in zip(examples, oracle)]
    assert sum(retrieved) >= 0.8 * len(examples)  # a title finds its passage
    assert all(t.reward == 1.0 for t in oracle)
    assert sum(t.reward for t in oracle) > sum(t.reward for t in copier)
