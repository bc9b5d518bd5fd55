"""Tag scanning in the rewards: the same results as the references' regular expressions, in linear time.

The references read tags with ``re.findall(r"<x>(.*?)</x>", text, re.DOTALL)`` and friends, which
retry every unclosed opening tag to the end of the text: quadratic on a long rollout (0.35-0.75 s for
the last step at 8,192 tokens). The oracles below are those regular expressions, kept here verbatim.
"""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards import extraction
from rewards.extraction import (
    first_tag_content,
    last_tag_content,
    reasoning_search_prediction,
    remove_tag_spans,
    tag_contents,
)
from rewards.formats import r1_searcher_has_cjk
from rewards.presets import r1_searcher, r_search, reasoning_search, search_r1_format

# --- the reference readings ---------------------------------------------------------------------


def oracle_pattern(open_tag: str, close_tag: str, ignore_case: bool) -> re.Pattern[str]:
    return re.compile(re.escape(open_tag) + "(.*?)" + re.escape(close_tag), re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def oracle_first(text: str, open_tag: str, close_tag: str, ignore_case: bool) -> str | None:
    match = oracle_pattern(open_tag, close_tag, ignore_case).search(text)
    return match.group(1) if match else None


ORACLE_BLOCKS = re.compile(r"<(think|search|result)>.*?</\1>", re.DOTALL | re.IGNORECASE)
ORACLE_DOCUMENTS = re.compile(re.escape("<|begin_of_documents|>") + ".*?" + re.escape("<|end_of_documents|>"), re.DOTALL)


def oracle_prediction(response: str) -> str:
    """Reasoning-search's prediction as the regex reading computes it."""
    first = oracle_first(response, "<answer>", "</answer>", True)
    text = response if first is None else first.strip()
    inner = oracle_first(text, "<answer>", "</answer>", True)
    if inner is not None:
        return inner.strip()
    close = re.search(re.escape("</result>"), text, re.IGNORECASE)
    if close is not None:
        return text[close.end() :].strip()
    return ORACLE_BLOCKS.sub("", text).strip()


# --- generated texts: tags of every case, exotic case folds, unclosed and nested ----------------------

PIECES = [
    "<answer>", "</answer>", "<Answer>", "</ANSWER>", "<think>", "</think>", "<Think>", "</THINK>", "<THINK>",
    "<search>", "</search>", "<Search>", "</SEARCH>", "<ſearch>", "</ſearch>", "</ſEARCH>", "<result>", "</result>",
    "<ReSulT>", "</reſult>", "</Result>", "<thinK>", "</thinK>", "<thİnk>", "</thİnk>", "</thInk>",
    "<|begin_of_documents|>", "<|end_of_documents|>", "<information>", "</information>", "<x>", "</x>",
    "<", ">", "</", "<>", "x", "Paris", " ", "\n", "美国", "\\boxed{", "}",
]
TEXTS = st.one_of(
    st.lists(st.sampled_from(PIECES), max_size=40).map("".join),
    st.text(alphabet="<>/xX|_ab\n", max_size=60),
    st.text(max_size=60),
)
TAG_PAIRS = [("<answer>", "</answer>"), ("<x>", "</x>"), ("<search>", "</search>"), ("<|begin_of_documents|>", "<|end_of_documents|>"),
             ("<", ">"), ("x", "x")]


@settings(max_examples=1500, deadline=None)
@given(TEXTS, st.sampled_from(TAG_PAIRS), st.booleans())
def test_tag_readings_equal_the_regex(text: str, tags: tuple[str, str], ignore_case: bool) -> None:
    open_tag, close_tag = tags
    pattern = oracle_pattern(open_tag, close_tag, ignore_case)
    expected = pattern.findall(text)
    assert tag_contents(text, open_tag, close_tag, ignore_case=ignore_case) == expected
    assert first_tag_content(text, open_tag, close_tag, ignore_case=ignore_case) == oracle_first(text, open_tag, close_tag, ignore_case)
    assert last_tag_content(text, open_tag, close_tag, ignore_case=ignore_case) == (expected[-1] if expected else None)
    assert remove_tag_spans(text, open_tag, close_tag, ignore_case=ignore_case) == pattern.sub("", text)


@settings(max_examples=1500, deadline=None)
@given(TEXTS)
def test_reasoning_search_prediction_equals_the_regex(text: str) -> None:
    assert reasoning_search_prediction(text) == oracle_prediction(text)


@settings(max_examples=500, deadline=None)
@given(TEXTS)
def test_cjk_outside_documents_equals_the_regex(text: str) -> None:
    assert r1_searcher_has_cjk(text) == (re.search("[\u4e00-\u9fff]", ORACLE_DOCUMENTS.sub("", text)) is not None)


def test_an_empty_opening_tag_is_refused() -> None:
    with pytest.raises(ValueError, match="open_tag"):
        tag_contents("text", "", "</x>")


# --- the work is linear --------------------------------------------------------------------------


def scanned_characters(monkeypatch: pytest.MonkeyPatch, score: object, text: str) -> int:
    """Characters the reward's tag searches look at while scoring ``text``."""
    total = 0
    search = extraction._search

    def counting(pattern: re.Pattern[str], where: str, position: int) -> re.Match[str] | None:
        nonlocal total
        match = search(pattern, where, position)
        total += (match.end() if match else len(where)) - position
        return match

    with monkeypatch.context() as patch:
        patch.setattr(extraction, "_search", counting)
        score(text, ["Paris"], question="q")  # type: ignore[operator]
    return total


UNCLOSED = {
    "search_r1_format": (search_r1_format, "<answer> maybe "),
    "r_search answers": (r_search, "<answer> x <original_evidence> y <observation> z "),
    "reasoning_search": (reasoning_search, "<Search> a <think> b <result> c <answer> d "),
    "reasoning_search blocks": (reasoning_search, "<THINK> a <Think> b </think> <ſearch> c </search> d "),
    "r1_searcher documents": (r1_searcher, "<|begin_of_documents|> 文 "),
}


@pytest.mark.parametrize("name", sorted(UNCLOSED))
def test_scanning_unclosed_tags_is_linear(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Four times as many unclosed tags, about four times the characters scanned (the regexes scanned
    sixteen times as many), and a few passes over the text at most."""
    score, unit = UNCLOSED[name]
    small, large = unit * 500, unit * 2000
    work_small, work_large = (scanned_characters(monkeypatch, score, text) for text in (small, large))
    assert 0 < work_small and work_large <= 4.5 * work_small
    assert work_large <= 8 * len(large)
