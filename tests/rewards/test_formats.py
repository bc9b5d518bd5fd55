"""Format checks and answer extraction, one rule at a time (PROTOCOLS.md)."""
from __future__ import annotations

import pytest

from rewards.extraction import (
    boxed_answer,
    first_tag_content,
    last_tag_content,
    r1_searcher_answer,
    r1_searcher_solution,
    reasoning_search_prediction,
    tag_contents,
)
from rewards.formats import (
    r1_searcher_violations,
    r_search_parts,
    reasoning_search_format_ok,
    research_format_error,
    search_r1_format_error,
)

INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and "
    "</answer>. Let me try again.\n"
)

# ---------------------------------------------------------------------------------------------
# Search-R1 v0.3 state machine


@pytest.mark.parametrize(
    "response",
    [
        "<think>a</think><answer>x</answer>",
        " <think>a</think>\n<answer> x </answer>\n",
        "<think>a</think>\n<search>q</search>\n\n<information>Doc 1(Title: T) text\n</information>\n\n"
        "<think>b</think>\n<search>q2</search><information>d</information><think>c</think><answer>x</answer>",
    ],
)
def test_search_r1_valid(response):
    assert search_r1_format_error(response) is None


@pytest.mark.parametrize(
    "response, error",
    [
        ("<think>a<answer>x</answer>", "tag_count:think"),
        ("<think>a</think><search>q<answer>x</answer>", "tag_count:search"),
        ("<think>a</think><search>q</search><information>d<think>b</think><answer>x</answer>", "tag_count:information"),
        ("<think>a</think><answer>x", "tag_count:answer"),
        ("<answer>x</answer>", "unexpected_tag:<answer>"),
        ("<think>a</think><search>q</search><think>b</think><answer>x</answer>", "unexpected_tag:<think>"),
        ("<think>a</think><answer>x</answer><answer>y</answer>", "unexpected_tag:<answer>"),
        ("<think>a</think><answer>x</answer><think>b</think>", "unexpected_tag:<think>"),
        ("<think>a</think> so <answer>x</answer>", "text_outside_tags"),
        ("Let me think. <think>a</think><answer>x</answer>", "text_outside_tags"),
        ("<think>a</think><answer>x</answer> Done.", "text_outside_tags"),
        ("<think>a</think><search>q</search>docs<information>d</information>", "text_outside_tags"),
        ("<think>a</think>" + INVALID_ACTION + "<think>b</think><answer>x</answer>", "text_outside_tags"),
        ("<Think>a</Think><answer>x</answer>", "text_outside_tags"),  # tags are case-sensitive
        ("<think>a</think>", "incomplete"),
        ("<think>a</think><search>q</search><information>d</information>", "incomplete"),
        ("", "incomplete"),
    ],
)
def test_search_r1_invalid(response, error):
    assert search_r1_format_error(response) == error


# ---------------------------------------------------------------------------------------------
# R1-Searcher violations

DOCS = "<|end_of_query|>\n\n<|begin_of_documents|>\n(1)Paris is the capital of France.\n(2)Lyon.\n<|end_of_documents|>\n\n"
GOOD_R1 = "I should look it up. <|begin_of_query|>capital France" + DOCS + "So it is Paris.</think>\n<answer> Paris </answer><|endoftext|>"


def test_r1_searcher_good_solution():
    assert r1_searcher_violations(GOOD_R1, "Paris") == []


@pytest.mark.parametrize(
    "solution, answer, expected",
    [
        # an empty retrieval block ("None") lacks "<|begin_of_documents|>\n(1)"
        (GOOD_R1.replace("(1)Paris is the capital of France.\n(2)Lyon.\n", "None"), "Paris", ["retrieval_count"]),
        (GOOD_R1.replace(DOCS, ""), "Paris", ["retrieval_count"]),  # a query without results
        (GOOD_R1.replace("Lyon.", "Lyon Assistant."), "Paris", ["assistant"]),  # even inside documents
        (GOOD_R1.replace("So it is", "the assistant says"), "Paris", ["assistant"]),
        ("<think>" + GOOD_R1, "Paris", ["think_count"]),
        (GOOD_R1.replace("</think>", "</think></think>"), "Paris", ["think_count"]),
        (GOOD_R1.replace("</think>", ""), "Paris", ["think_count"]),
        (GOOD_R1.replace("<|endoftext|>", "<answer>x</answer><|endoftext|>"), "x", ["answer_count"]),
        (GOOD_R1.replace("</answer>", ""), "Paris <|endoftext|>", ["answer_count"]),
        (GOOD_R1, "see begin_of_query", ["answer_has_call"]),
        (GOOD_R1, "begin_of_documents", ["answer_has_call"]),
        (GOOD_R1, "one two three four five six seven eight nine ten eleven", ["answer_too_long"]),
        (GOOD_R1, "one two three four five six seven eight nine ten", []),
        (GOOD_R1.replace("So it is", "所以是"), "Paris", ["cjk"]),
        (GOOD_R1.replace("Lyon.", "里昂。"), "Paris", []),  # CJK inside documents is allowed
        ("<think>巴黎 Assistant", None, ["assistant", "think_count", "answer_count", "cjk"]),
    ],
)
def test_r1_searcher_each_violation(solution, answer, expected):
    assert r1_searcher_violations(solution, answer) == expected


# ---------------------------------------------------------------------------------------------
# ReSearch

GOOD_RESEARCH = (
    "<think>I need the capital.</think> <search>capital of France</search> <result>\nParis is the capital.\n"
    "</result> <think>It is Paris.</think> <answer>The final answer is \\[ \\boxed{Paris} \\]</answer>"
)


def test_research_valid():
    assert research_format_error(GOOD_RESEARCH) is None
    # a <search> inside a result block is skipped: the scan restarts at the </result>
    assert research_format_error(GOOD_RESEARCH.replace("Paris is", "Paris <search> is")) is None


@pytest.mark.parametrize(
    "response, error",
    [
        (GOOD_RESEARCH.replace("</think> <search>", " <search>"), "think_unpaired"),
        ("<answer>\\boxed{Paris}</answer>", "think_missing"),
        (GOOD_RESEARCH + "<answer>\\boxed{x}</answer>", "answer_count"),
        (GOOD_RESEARCH.replace("<answer>", ""), "answer_count"),
        (GOOD_RESEARCH.replace("</search>", ""), "search_incomplete"),
        (GOOD_RESEARCH.replace("<result>", "").replace("</result>", ""), "search_incomplete"),
        (GOOD_RESEARCH.replace("</result>", ""), "search_incomplete"),
        (GOOD_RESEARCH.replace(" <think>It", " <search>again</search> <think>It"), "search_incomplete"),
        ("<think>a</think><search>q<result>r</result></search><answer>\\boxed{x}</answer>", "search_order"),
        ("<think>a</think><search>q<result>r</search>s</result><answer>\\boxed{x}</answer>", "search_order"),
        ("<think>a</think></answer> <answer>\\boxed{x}", "answer_order"),
        (GOOD_RESEARCH.replace("\\[ \\boxed{Paris} \\]", "Paris"), "answer_not_boxed"),
        (GOOD_RESEARCH.replace("\\boxed{Paris} \\]", "\\boxed{Paris \\]"), "answer_not_boxed"),
        (GOOD_RESEARCH.replace("\\boxed{Paris}", "\\boxed Paris"), "answer_not_boxed"),
    ],
)
def test_research_invalid(response, error):
    assert research_format_error(response) == error


# ---------------------------------------------------------------------------------------------
# R-Search parts


@pytest.mark.parametrize(
    "response, answer, answer_error",
    [
        ("<answer> Paris </answer>", "Paris", None),
        ("Paris", None, "answer_missing"),
        ("<answer>x</answer> <answer> Paris</answer>", "Paris", "answer_count"),
        ("<answer> and </answer>", "and", "answer_empty"),
        ("<answer> \n </answer>", "", "answer_empty"),
        # the environment's invalid-action message adds one answer match
        (INVALID_ACTION + "<answer>Paris</answer>", "Paris", "answer_count"),
    ],
)
def test_r_search_answer(response, answer, answer_error):
    parts = r_search_parts(response)
    assert (parts.answer, parts.answer_error) == (answer, answer_error)


@pytest.mark.parametrize(
    "response, evidence, evidence_error",
    [
        ("<answer>x</answer>", None, None),  # no search, evidence rightly omitted
        ("<observation>d</observation><answer>x</answer>", None, "evidence_missing"),
        ("<original_evidence>e</original_evidence><answer>x</answer>", None, "evidence_without_search"),
        ("<observation>d</observation><original_evidence> e </original_evidence>", "e", None),
        ("<observation>d</observation><observation>d2</observation><original_evidence>e</original_evidence>", "e", None),
        ("<observation>d</observation><original_evidence>e1</original_evidence><original_evidence>e2</original_evidence>", "e2", "evidence_count"),
        ("<observation>d</observation><original_evidence>  </original_evidence>", "", "evidence_empty"),
    ],
)
def test_r_search_evidence(response, evidence, evidence_error):
    parts = r_search_parts(response)
    assert (parts.evidence, parts.evidence_error) == (evidence, evidence_error)


# ---------------------------------------------------------------------------------------------
# Reasoning-search sections


@pytest.mark.parametrize(
    "response, ok",
    [
        ("<think>t</think><search>s</search><result></result><answer>a</answer>", True),
        ("pre <THINK>t</Think> x <Search>s</SEARCH>\n<result>r</result> y <Answer>a</ANSWER> post", True),
        ("<think></think><search>s</search><result></result><answer>a</answer>", False),
        ("<think>t</think><search></search><result></result><answer>a</answer>", False),
        ("<think>t</think><search>s</search><result></result><answer></answer>", False),
        ("<think>t</think><search>s</search><answer>a</answer><result></result>", False),
        ("<search>s</search><think>t</think><result></result><answer>a</answer>", False),
        ("<think>t</think><search>s</search><answer>a</answer>", False),
        ("<think></think>x</think><search>s</search><result></result><answer>a</answer>", True),
        ("<think>t</think><search>s</search><result></result><answer></answer>a</answer>", True),
    ],
)
def test_reasoning_search_sections(response, ok):
    assert reasoning_search_format_ok(response) is ok


# ---------------------------------------------------------------------------------------------
# Extraction


def test_tag_contents_shortest_match():
    text = "<answer> a <answer> b </answer> <answer>c</answer>"
    assert tag_contents(text, "<answer>", "</answer>") == [" a <answer> b ", "c"]
    assert first_tag_content(text, "<answer>", "</answer>") == " a <answer> b "
    assert last_tag_content(text, "<answer>", "</answer>") == "c"
    assert last_tag_content("<answer>open", "<answer>", "</answer>") is None
    assert first_tag_content("<ANSWER>x</answer>", "<answer>", "</answer>") is None
    assert first_tag_content("<ANSWER>x</answer>", "<answer>", "</answer>", ignore_case=True) == "x"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\boxed{Paris}", "Paris"),
        ("The answer is \\[ \\boxed{\\text{New York}} \\]", "\\text{New York}"),
        ("\\boxed{a} and \\boxed{b}", "b"),
        ("$\\boxed Paris$ more", "Paris"),
        ("\\boxed Paris", "Paris"),
        ("\\boxed{a} then \\boxed b$", "b"),  # a "\boxed " anywhere wins
        ("\\boxed {a}", "{a}"),
        ("\\fbox{a}", None),
        ("\\boxed{a", None),
        ("\\boxed{a} \\boxed", None),  # the last \boxed has no brace
        ("\\boxedx{a}", None),
        ("Paris", None),
        ("\\boxed{}", ""),
    ],
)
def test_boxed_answer(text, expected):
    assert boxed_answer(text) == expected


@pytest.mark.parametrize(
    "response, expected",
    [
        ("  \n plan</think><answer>x</answer>", "plan</think><answer>x</answer><|endoftext|>"),
        ("plan</think><answer>x</answer><|endoftext|>", "plan</think><answer>x</answer><|endoftext|>"),
        ("plan<|endoftext|><|endoftext|>", "plan<|endoftext|>"),
        ("old\nAssistant: <think> new</think>", "new</think><|endoftext|>"),
        ("a\nAssistant: <think>b\nAssistant: <think>c", "c<|endoftext|>"),
    ],
)
def test_r1_searcher_solution(response, expected):
    assert r1_searcher_solution(response, eos_string="<|endoftext|>", prompt_suffix="\nAssistant: <think>") == expected


@pytest.mark.parametrize(
    "solution, expected",
    [
        ("<answer> Paris </answer><|endoftext|>", "Paris"),
        ("<answer>a</answer><answer> b </answer>", "b"),
        ("<answer> Paris<|endoftext|>", "Paris<|endoftext|>"),
        ("</answer> Paris", None),
        ("<answer>x</answer> y </answer>", "x"),
    ],
)
def test_r1_searcher_answer(solution, expected):
    assert r1_searcher_answer(solution) == expected


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>t</think><search>s</search><result>r</result><answer> Paris </answer>", "Paris"),
        ("<answer>x</result>Paris</answer>", "Paris"),
        ("<answer>a<ANSWER> b </answer>c</answer>", "a<ANSWER> b"),
        ("<think>t</think><search>s</search><result>r</result> Paris ", "Paris"),
        ("<think>t</think> Paris <search>s</search>", "Paris"),
        ("<Answer>Rome</ANSWER>", "Rome"),
        ("", ""),
    ],
)
def test_reasoning_search_prediction(response, expected):
    assert reasoning_search_prediction(response) == expected
