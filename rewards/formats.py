"""Format checks, one per seed protocol, each naming the rule that failed.

Each check returns ``None`` for a well-formed text, or a short rule name (``"think_count"``,
``"unexpected_tag:</search>"`` …) that presets put in ``components["format_error"]`` so a researcher
can see why a rollout lost its format reward. The rules are those of PROTOCOLS.md, which follow the
reference code of each system.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .extraction import remove_tag_spans, tag_contents

__all__ = [
    "search_r1_format_error",
    "R1_SEARCHER_RETRIEVAL_MARKERS",
    "r1_searcher_retrieval_balanced",
    "r1_searcher_think_ok",
    "r1_searcher_answer_tags_ok",
    "r1_searcher_has_cjk",
    "r1_searcher_violations",
    "research_format_error",
    "RSearchParts",
    "r_search_parts",
    "reasoning_search_format_ok",
]

# ---------------------------------------------------------------------------------------------
# Search-R1 (v0.3 format reward): a state machine over the tags.

_SR1_TAGS = ("think", "search", "information", "answer")
_SR1_SPLIT = re.compile(r"(</?(?:think|search|information|answer)>)")
# (state, tag) -> next state; "information" is the state after a closed information block.
_SR1_TRANSITIONS = {
    ("start", "<think>"): "in_think",
    ("information", "<think>"): "in_think",
    ("in_think", "</think>"): "after_think",
    ("after_think", "<search>"): "in_search",
    ("in_search", "</search>"): "after_search",
    ("after_search", "<information>"): "in_information",
    ("in_information", "</information>"): "information",
    ("after_think", "<answer>"): "in_answer",
    ("in_answer", "</answer>"): "end",
}
_SR1_CONTENT_STATES = frozenset({"in_think", "in_search", "in_information", "in_answer"})


def search_r1_format_error(response: str) -> str | None:
    """Search-R1 v0.3 structure check of the response (agent text plus inserted blocks).

    Rules, checked in this order: every tag has as many openings as closings
    (``"tag_count:<tag>"``); the tags follow start → think → (search → information → think)* →
    answer → end (``"unexpected_tag:<tag>"``); only whitespace outside think/search/information/
    answer content, after ``</answer>`` included (``"text_outside_tags"``); the text ends right after
    ``</answer>`` (``"incomplete"``).
    """
    for tag in _SR1_TAGS:
        if response.count(f"<{tag}>") != response.count(f"</{tag}>"):
            return f"tag_count:{tag}"
    state = "start"
    for part in _SR1_SPLIT.split(response):
        if not part.strip():
            continue
        if _SR1_SPLIT.fullmatch(part):
            next_state = _SR1_TRANSITIONS.get((state, part))
            if next_state is None:
                return f"unexpected_tag:{part}"
            state = next_state
        elif state not in _SR1_CONTENT_STATES:
            return "text_outside_tags"
    return None if state == "end" else "incomplete"


# ---------------------------------------------------------------------------------------------
# R1-Searcher: a list of violations, each costing the same penalty.

R1_SEARCHER_RETRIEVAL_MARKERS = (
    "<|begin_of_documents|>\n",
    "<|end_of_documents|>\n\n",
    "<|begin_of_query|>",
    "<|end_of_query|>",
    "<|begin_of_documents|>",
    "<|end_of_documents|>",
    "<|begin_of_documents|>\n(1)",
)
_CJK = re.compile("[\u4e00-\u9fff]")


def r1_searcher_retrieval_balanced(solution: str) -> bool:
    """The seven retrieval-marker counts are all equal (an empty ``None`` documents block breaks this,
    since it lacks ``"<|begin_of_documents|>\\n(1)"``)."""
    return len({solution.count(marker) for marker in R1_SEARCHER_RETRIEVAL_MARKERS}) == 1


def r1_searcher_think_ok(solution: str) -> bool:
    """No ``<think>`` (the prompt opened it) and exactly one ``</think>``."""
    return solution.count("<think>") == 0 and solution.count("</think>") == 1


def r1_searcher_answer_tags_ok(solution: str) -> bool:
    """Exactly one ``<answer>`` and one ``</answer>``."""
    return solution.count("<answer>") == 1 and solution.count("</answer>") == 1


def r1_searcher_has_cjk(solution: str) -> bool:
    """CJK ideographs (U+4E00–U+9FFF) outside ``<|begin_of_documents|>…<|end_of_documents|>`` blocks."""
    outside = remove_tag_spans(solution, "<|begin_of_documents|>", "<|end_of_documents|>")
    return _CJK.search(outside) is not None


def r1_searcher_violations(solution: str, answer: str | None, *, max_answer_words: int = 10) -> list[str]:
    """Every rule of R1-Searcher's base-model reward that ``solution`` breaks, in a fixed order.

    Names: ``retrieval_count`` (the seven marker counts differ), ``assistant`` (the word
    "Assistant"/"assistant" anywhere), ``think_count`` (a ``<think>``, or not exactly one
    ``</think>``), ``answer_count`` (not exactly one ``<answer>`` and one ``</answer>``),
    ``answer_has_call`` (the answer contains begin_of_query/begin_of_documents), ``answer_too_long``
    (more than ``max_answer_words`` whitespace-separated words), ``cjk`` (CJK outside documents).
    """
    violations = []
    if not r1_searcher_retrieval_balanced(solution):
        violations.append("retrieval_count")
    if "Assistant" in solution or "assistant" in solution:
        violations.append("assistant")
    if not r1_searcher_think_ok(solution):
        violations.append("think_count")
    if not r1_searcher_answer_tags_ok(solution):
        violations.append("answer_count")
    if answer is not None:
        if "begin_of_query" in answer or "begin_of_documents" in answer:
            violations.append("answer_has_call")
        if len(answer.split()) > max_answer_words:
            violations.append("answer_too_long")
    if r1_searcher_has_cjk(solution):
        violations.append("cjk")
    return violations


# ---------------------------------------------------------------------------------------------
# ReSearch: pairing and order rules, then a boxed answer.


def _research_search_order_error(response: str) -> str | None:
    position = 0
    while True:
        search = response.find("<search>", position)
        if search < 0:
            return None
        search_end = response.find("</search>", search)
        result = response.find("<result>", search)
        result_end = response.find("</result>", result) if result >= 0 else -1
        if -1 in (search_end, result, result_end):
            return "search_incomplete"
        if search_end > result:
            return "search_order"
        position = result_end


def research_format_error(response: str) -> str | None:
    """ReSearch's format check of the response.

    Rules in order: ``think_unpaired`` (``<think>``/``</think>`` counts differ), ``think_missing``
    (either is 0), ``answer_count`` (not exactly one ``<answer>`` and one ``</answer>``);
    for each ``<search>`` (scanning from the start, then from the ``</result>`` that closed the
    previous one) a ``</search>``, a ``<result>`` and a ``</result>`` after that ``<result>`` must
    follow (``search_incomplete``) and the first ``</search>`` must precede the first ``<result>``
    (``search_order``); ``answer_order`` (``<answer>`` after ``</answer>``); ``answer_not_boxed``
    (the span from ``<answer>`` to ``</answer>`` lacks ``\\boxed{`` or ``}``).
    """
    think_open, think_close = response.count("<think>"), response.count("</think>")
    if think_open != think_close:
        return "think_unpaired"
    if think_open == 0:
        return "think_missing"
    if response.count("<answer>") != 1 or response.count("</answer>") != 1:
        return "answer_count"
    error = _research_search_order_error(response)
    if error is not None:
        return error
    answer_start, answer_end = response.find("<answer>"), response.find("</answer>")
    if answer_start > answer_end:
        return "answer_order"
    span = response[answer_start:answer_end]
    if "\\boxed{" not in span or "}" not in span:
        return "answer_not_boxed"
    return None


# ---------------------------------------------------------------------------------------------
# R-Search (Zhao et al.): answer and evidence well-formedness by counting matches.


@dataclass(frozen=True)
class RSearchParts:
    """What R-Search's reward reads from a response.

    ``answer``/``evidence`` are ``None`` when absent; the ``*_error`` fields name why a part is not
    well-formed (``None`` when it is).
    """

    answer: str | None
    answer_error: str | None
    evidence: str | None
    evidence_error: str | None


def r_search_parts(response: str) -> RSearchParts:
    """Count ``<answer>``, ``<original_evidence>`` and ``<observation>`` matches (environment text
    included) and apply R-Search's rules.

    Answer (a matches): the last match's stripped content if a ≥ 1; well-formed iff a = 1 and the
    content is non-empty and not ``"and"`` (errors ``answer_missing``, ``answer_count``,
    ``answer_empty``). Evidence (e matches, o observations): e = 0 → none, well-formed iff o = 0
    (``evidence_missing``); e ≥ 1, o = 0 → none, not well-formed (``evidence_without_search``);
    e = 1, o ≥ 1, non-empty → well-formed; otherwise not well-formed (``evidence_count`` or
    ``evidence_empty``) with the last match's content as the evidence.
    """
    answers = tag_contents(response, "<answer>", "</answer>")
    answer = answers[-1].strip() if answers else None
    if not answers:
        answer_error = "answer_missing"
    elif len(answers) > 1:
        answer_error = "answer_count"
    elif answer in ("", "and"):
        answer_error = "answer_empty"
    else:
        answer_error = None

    evidences = tag_contents(response, "<original_evidence>", "</original_evidence>")
    searched = bool(tag_contents(response, "<observation>", "</observation>"))
    evidence: str | None
    if not evidences:
        evidence, evidence_error = None, ("evidence_missing" if searched else None)
    elif not searched:
        evidence, evidence_error = None, "evidence_without_search"
    else:
        evidence = evidences[-1].strip()
        if len(evidences) > 1:
            evidence_error = "evidence_count"
        elif not evidence:
            evidence_error = "evidence_empty"
        else:
            evidence_error = None
    return RSearchParts(answer, answer_error, evidence, evidence_error)


# ---------------------------------------------------------------------------------------------
# Reasoning-search (Shi & Shen): four sections in order, tags matched case-insensitively.

# (tag, whether at least one character must separate it from the next tag)
_RS_SEQUENCE = (
    ("<think>", True),
    ("</think>", False),
    ("<search>", True),
    ("</search>", False),
    ("<result>", False),
    ("</result>", False),
    ("<answer>", True),
    ("</answer>", False),
)
_RS_PATTERNS = tuple((re.compile(re.escape(tag), re.IGNORECASE), gap) for tag, gap in _RS_SEQUENCE)


def reasoning_search_format_ok(response: str) -> bool:
    """The response holds, in this order with anything around them, ``<think>`` ≥1 char ``</think>``,
    ``<search>`` ≥1 char ``</search>``, ``<result>`` … ``</result>``, ``<answer>`` ≥1 char
    ``</answer>`` (case-insensitive).

    Equivalent to searching ``<think>.+?</think>.*?<search>.+?</search>.*?<result>.*?</result>.*?
    <answer>.+?</answer>`` (DOTALL, IGNORECASE), but by a greedy left-to-right scan that is linear
    in the text, whereas the regex can backtrack polynomially on long rollouts. Taking each tag at
    its earliest possible position is optimal because every later constraint only needs an earlier end.
    """
    position = 0
    for pattern, gap in _RS_PATTERNS:
        match = pattern.search(response, position)
        if match is None:
            return False
        position = match.end() + (1 if gap else 0)
    return True
