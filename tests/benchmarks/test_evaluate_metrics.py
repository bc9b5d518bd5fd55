"""The evaluation harness's figures on hand-worked examples: cover-EM, one episode's metrics, a row's
means, and the settings block that groups a setting's values by what they depend on."""
from __future__ import annotations

import pytest

from benchmarks.evaluation.metrics import cover_em, episode_metrics, mean_metrics
from benchmarks.evaluation.report import summarize, to_markdown
from rewards import cover_exact_match
from search_env.trajectory import AGENT, ENVIRONMENT, Span, ToolCall, Trajectory


@pytest.mark.parametrize(
    ("prediction", "golds", "expected"),
    [
        ("The city of Paris.", ["Paris"], 1.0),  # "city of paris" holds "paris"
        ("Paris", ["the Paris city"], 0.0),  # "paris city" is not in "paris"
        ("J.K. Rowling wrote it", ["Robert Galbraith", "J. K. Rowling"], 0.0),  # "j k rowling" is not in "jk rowling wrote it"
        ("J. K. Rowling wrote it", ["Robert Galbraith", "J. K. Rowling"], 1.0),  # the second alias is
        ("houston", ["US"], 1.0),  # a substring of characters, as FlashRAG and Search-R1 count it
        ("anything", ["", "..."], 0.0),  # golds that normalise to nothing cover nothing
        ("", ["Paris"], 0.0),
    ],
)
def test_cover_em_asks_that_a_normalised_gold_be_a_substring_of_the_answer(prediction: str, golds: list[str], expected: float) -> None:
    assert cover_em(prediction, golds) == expected


def test_cover_em_is_not_r1_searchers_token_cover() -> None:
    assert cover_exact_match("york new", ["New York"]) == 1.0 and cover_em("york new", ["New York"]) == 0.0


def _trajectory() -> Trajectory:
    """3 prompt tokens, a 4-token search call, 3 result tokens, a 2-token answer; one search that found p1 and p2."""
    producers = bytearray([ENVIRONMENT] * 3 + [AGENT] * 4 + [ENVIRONMENT] * 3 + [AGENT] * 2)
    return Trajectory(
        question="Where is the Louvre?", golden_answers=["Paris", "City of Light"], protocol="search-r1", example_id="q1",
        prompt_length=3, token_ids=list(range(12)), producers=producers, trained=bytearray(producers),
        spans=[Span("call", 3, 7), Span("result", 7, 10), Span("answer", 10, 12)],
        tool_calls=[ToolCall(turn=1, kind="query", content="louvre", sources=["wiki"], k=2, passage_ids=["p1", "p2"])],
        reward=1.0, reward_components={"answer": "Paris, France", "em": 0.0},
    )


def test_one_episodes_metrics_by_hand() -> None:
    metrics = episode_metrics(_trajectory(), "Paris, France", ["p2", "p9"], seconds=0.25)
    # "paris france" against "paris": not equal; F1 = 2 * (1/2 * 1/1) / (1/2 + 1) = 2/3; "paris" is a substring
    assert metrics == {"em": 0.0, "f1": pytest.approx(2 / 3), "cover_em": 1.0, "reward": 1.0, "searches": 1.0,
                       "failed_searches": 0.0, "no_search": 0.0, "agent_tokens": 6.0, "retrieved_tokens": 3.0, "seconds": 0.25, "gold_recall": 0.5}
    assert episode_metrics(_trajectory(), "", [], seconds=0.0)["gold_recall"] is None  # no gold passages: not applicable
    failed = _trajectory()
    failed.tool_calls[0].error = "SourceError: connection refused"
    assert episode_metrics(failed, "Paris, France", [], seconds=0.0)["failed_searches"] == 1.0
    unsearched = _trajectory()
    unsearched.tool_calls.clear()
    assert episode_metrics(unsearched, "Paris", [], seconds=0.0)["no_search"] == 1.0  # its mean: the share without a search


def test_a_row_is_the_mean_over_the_episodes_that_have_each_figure() -> None:
    first = {"em": 1.0, "f1": 1.0, "cover_em": 1.0, "reward": 1.0, "searches": 2.0, "agent_tokens": 10.0,
             "retrieved_tokens": 30.0, "seconds": 1.0, "gold_recall": 0.5}
    second = {**first, "em": 0.0, "f1": 0.5, "searches": 1.0, "agent_tokens": 20.0, "gold_recall": None, "judge": 1.0}
    means = mean_metrics([first, second])
    assert means["em"] == 0.5 and means["f1"] == 0.75 and means["searches"] == 1.5 and means["agent_tokens"] == 15.0
    assert means["gold_recall"] == 0.5  # the one episode with gold passages
    assert means["judge"] == 1.0  # the one episode judged
    assert mean_metrics([first])["judge"] is None


def _row(dataset: str, protocol: str, agent: str, top_k: int, em: float) -> dict:
    records = [{"metrics": {"em": em, "f1": em, "cover_em": em, "reward": em, "searches": 1.0, "agent_tokens": 5.0,
                            "retrieved_tokens": 9.0, "seconds": 0.1, "gold_recall": None},
                "reward_preset": "search-r1", "reward_range": [0.0, 1.0], "reward_components": {"answer": "x", "em": em}}]
    return {"dataset": dataset, "protocol": protocol, "agent": agent, "questions": 1, "seeds": 1, "episodes": 1,
            **summarize(records), "retriever": "BM25", "corpus": "corpus.jsonl", "subset": "all 1", "top_k": top_k,
            "max_turns": None, "max_new_tokens": 64, "decoding": "scripted", "judge_model": None}


def test_the_markdown_states_each_setting_once_or_per_what_it_depends_on() -> None:
    text = to_markdown([_row("nq", "search-r1", "oracle", 3, 1.0), _row("nq", "research", "oracle", 5, 0.0)])
    assert "| top-k | 3 (search-r1); 5 (research) |" in text
    assert "| retriever | BM25 |" in text and "| search turns | unlimited |" in text and "| judge | none |" in text
    assert "| nq | search-r1 | oracle | 1 | 1 | 1.000 | 1.000 | 1.000 | 1.000 | 1.00 | 5.0 | 9.0 | 0.100 | [0, 1] |" in text
    assert "gold recall" not in text and "judge (" not in text  # columns nobody measured are left out
