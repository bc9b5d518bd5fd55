"""The tool-calls protocols' rewards on hand-made episodes: Search-R1's format reward with the tool-call
format check (1.0 correct & well formed, 0.8 correct & not, 0.2 wrong & well formed, 0.1 wrong & not),
and the F1 of the last answer."""
from __future__ import annotations

import pytest

import rewards
from rewards.tool_calls import tool_calls_format_error

GOLD = ["Bob Smith"]
CALL = '<tool_call>\n{"name": "wiki", "arguments": {"query": "who founded the city"}}\n</tool_call>'
RESPONSE = "\n<tool_response>\nDoc 1(Title: City) Bob Smith founded the city.\n</tool_response>\n"


def episode(*turns: str, answer: str = "<answer> Bob Smith </answer>") -> str:
    """Agent turns each followed by the environment's tool turn, then the answer turn."""
    return "".join(f"<think> t </think>\n{turn}{RESPONSE}" for turn in turns) + answer


def test_a_well_formed_episode_scores_one_and_a_wrong_answer_in_it_the_structure_score() -> None:
    text = episode(CALL + "\n" + CALL.replace("wiki", "news"), CALL)
    result = rewards.score("tool-calls-format", text, GOLD)
    assert result.total == 1.0
    assert result.components == {"answer": "Bob Smith", "em": 1.0, "format_valid": True, "format_error": None}
    assert rewards.score("tool-calls-format", episode(CALL, answer="<answer> Ann </answer>"), GOLD).total == 0.2


def test_search_r1s_own_check_judges_the_same_episode_badly_formatted() -> None:
    assert rewards.score("search-r1-format", episode(CALL), GOLD).total == pytest.approx(0.8)


@pytest.mark.parametrize(("turn", "error"), [
    ('<tool_call>\n{"name": "wiki", "arguments": {"query": "x"}\n</tool_call>', "call_invalid"),  # a brace short
    ('<tool_call>\n{"name": "wiki", "arguments": {"q": "x"}}\n</tool_call>', "call_invalid"),
    ('<tool_call>\n{"name": "wiki", "arguments": "{\\"query\\": 7}"}\n</tool_call>', "call_invalid"),
    ('<tool_call>\n["wiki", "x"]\n</tool_call>', "call_invalid"),
    ('<tool_call>\n{"name": "wiki", "arguments": {"query": "  "}}\n</tool_call>', "call_empty_query"),
    ('<tool_call>\n{"name": "wiki", "arguments": {"query": "x', "call_cut"),
])
def test_a_broken_call_makes_the_episode_badly_formatted(turn: str, error: str) -> None:
    text = episode(CALL, turn)
    result = rewards.score("tool-calls-format", text, GOLD)
    assert result.components["format_error"] == error and not result.components["format_valid"]
    assert result.total == pytest.approx(0.8)
    assert rewards.score("tool-calls-format", episode(turn, answer="<answer> Ann </answer>"), GOLD).total == 0.1


def test_a_call_cut_off_before_a_later_turns_call_is_still_cut() -> None:
    assert tool_calls_format_error(episode('<tool_call>\n{"name": "wiki"', CALL)) == "call_cut"


def test_arguments_given_as_a_json_string_are_a_call() -> None:
    assert tool_calls_format_error(episode('<tool_call>\n{"name": "wiki", "arguments": "{\\"query\\": \\"x\\"}"}\n</tool_call>')) is None


def test_a_missing_answer_and_text_after_the_answer_are_badly_formatted() -> None:
    missing = rewards.score("tool-calls-format", episode(CALL, answer="Bob Smith"), GOLD)
    assert (missing.total, missing.components["format_error"], missing.components["answer"]) == (0.1, "answer_missing", None)
    after = rewards.score("tool-calls-format", episode(CALL, answer="<answer> Bob Smith </answer> Done."), GOLD)
    assert (after.total, after.components["format_error"]) == (pytest.approx(0.8), "text_after_answer")
    assert rewards.score("tool-calls-format", episode(CALL, answer="<answer> Bob Smith </answer>\n"), GOLD).total == 1.0


def test_tools_when_given_are_the_only_names_a_call_may_use() -> None:
    text = episode(CALL.replace("wiki", "web"))
    assert tool_calls_format_error(text) is None
    assert tool_calls_format_error(text, tools=("wiki", "news")) == "call_unknown_tool"
    assert rewards.score("tool-calls-format", text, GOLD, tools=["wiki"]).total == pytest.approx(0.8)


def test_llama3_calls_are_read_as_json_objects() -> None:
    good = episode('<|python_tag|>{"name": "wiki", "parameters": {"query": "who"}}; {"name": "news", "parameters": {"query": "city"}}',
                   '[{"name": "wiki", "parameters": {"query": "a"}}, {"name": "news", "parameters": {"query": "b"}}]')
    assert rewards.score("tool-calls-llama3-format", good, GOLD).total == 1.0
    broken = episode('{"name": "wiki", "parameters": {"query": "who"}}; {"name": "news", "parameters": oops}')
    result = rewards.score("tool-calls-llama3-format", broken, GOLD)
    assert (result.total, result.components["format_error"]) == (pytest.approx(0.8), "call_invalid")
    assert tool_calls_format_error(episode('{"name": "wiki", "parameters": {"query": "who founded'), "llama3") == "call_invalid"
    # the hermes check sees no <tool_call> block in a llama3 episode; the llama3 check none of a hermes one's faults
    assert rewards.score("tool-calls-format", broken, GOLD).total == 1.0


def test_mistral_calls_are_read_as_the_json_list_after_each_tool_calls_marker() -> None:
    good = episode('[TOOL_CALLS] [{"name": "wiki", "arguments": {"query": "who"}, "id": "abcdefghi"}, '
                   '{"name": "news", "arguments": {"query": "city"}}]', '[TOOL_CALLS][{"name": "wiki", "arguments": {"query": "a"}}]')
    assert rewards.score("tool-calls-mistral-format", good, GOLD).total == 1.0
    for turn, error in [('[TOOL_CALLS] [{"name": "wiki", "arguments": oops}]', "call_invalid"),
                        ("[TOOL_CALLS] []", "call_invalid"), ("[TOOL_CALLS]", "call_invalid"),
                        ('[TOOL_CALLS] [{"name": "wiki", "arguments": {"query": ""}}]', "call_empty_query")]:
        result = rewards.score("tool-calls-mistral-format", episode(turn), GOLD)
        assert (result.total, result.components["format_error"]) == (pytest.approx(0.8), error), turn


def test_an_unknown_call_format_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown call_format 'gorilla'; choose one of hermes, llama3, mistral"):
        tool_calls_format_error("", "gorilla")


def test_f1_scores_the_last_answer_with_partial_credit() -> None:
    # "Bob" against "Bob Smith": precision 1/1, recall 1/2, F1 = 2 * 1 * 0.5 / 1.5 = 2/3
    result = rewards.score("search-r1-f1", episode(CALL, answer="<answer> Ann </answer><answer> Bob </answer>"), GOLD)
    assert result.total == pytest.approx(2 / 3) and result.components["answer"] == "Bob"
    assert rewards.score("search-r1-f1", episode(CALL, answer="Bob"), GOLD).components == {"answer": None, "f1": 0.0}
    assert rewards.score("search-r1-f1", "<answer> the Bob  Smith. </answer>", GOLD).total == 1.0
