"""The built-in reward presets: one function per seed system's reward, scoring exactly as its
reference code does (see PROTOCOLS.md), the F1 twin of Search-R1's EM, and the tool-calls protocols'
format reward (:mod:`rewards.tool_calls`). Weights default to the papers' values and are keyword options.

Every preset is called as ``fn(response, golden_answers, *, question, ended_with_eos,
evidence_model, judge, **options)`` where ``response`` is the agent's text after the prompt (what the
model generated plus the result blocks and messages the environment inserted) and ``golden_answers``
is a list of str. Unknown options raise ``TypeError`` naming the preset.
"""
from __future__ import annotations

import math
from collections.abc import Collection
from functools import partial
from typing import Callable

from .dag import STRICT_TOOLS, read_strict_dag
from .extraction import (
    boxed_answer,
    first_tag_content,
    last_tag_content,
    r1_searcher_answer,
    r1_searcher_solution,
    reasoning_search_prediction,
    tag_contents,
)
from .formats import (
    r1_searcher_has_cjk,
    r1_searcher_retrieval_balanced,
    r1_searcher_answer_tags_ok,
    r1_searcher_think_ok,
    r1_searcher_violations,
    r_search_parts,
    reasoning_search_format_ok,
    research_format_error,
    search_r1_format_error,
)
from .metrics import cover_exact_match, exact_match, f1_score, normalize_squad
from .result import RewardResult
from .tool_calls import tool_calls_format

__all__ = [
    "EVIDENCE_PROMPT",
    "EvidenceModel",
    "Judge",
    "BUILTIN_PRESETS",
    "BUILTIN_RANGES",
    "search_r1",
    "search_r1_f1",
    "search_r1_format",
    "r1_searcher",
    "r1_searcher_stage1",
    "r1_searcher_stage2",
    "research",
    "r_search",
    "reasoning_search",
]

EvidenceModel = Callable[[str, str], str]
"""``evidence_model(question, evidence) -> answer``: R-Search's second model answering from evidence."""
Judge = Callable[[str, list, str], float]
"""``judge(question, golden_answers, prediction) -> score in [0, 1]``."""

EVIDENCE_PROMPT = (
    "Answer the question based on the given passages. Only give me the answer and do not output any "
    "other words.\n\nThe following are given passages:\n{evidence}\n\nQuestion: {question}\nAnswer:"
)
"""R-Search's evidence-model prompt; ``EVIDENCE_PROMPT.format(evidence=..., question=...)``."""

R1_BASE_PROMPT_SUFFIX = "\nAssistant: <think>"


def _require_question(question: str | None, what: str) -> str:
    if question is None:
        raise ValueError(f"{what} needs the question: pass question=... to rewards.score")
    return question


# ---------------------------------------------------------------------------------------------
# Search-R1


def search_r1(
    response: str,
    golden_answers: list[str],
    *,
    question: str | None = None,
    ended_with_eos: bool = True,
    evidence_model: EvidenceModel | None = None,
    judge: Judge | None = None,
) -> RewardResult:
    """Search-R1's outcome reward: EM (SQuAD normalisation) of the last ``<answer>`` content; 0 without one."""
    answer = last_tag_content(response, "<answer>", "</answer>")
    if answer is None:
        return RewardResult(0.0, {"answer": None, "em": 0.0})
    answer = answer.strip()
    em = exact_match(answer, golden_answers)
    return RewardResult(em, {"answer": answer, "em": em})


def search_r1_f1(
    response: str,
    golden_answers: list[str],
    *,
    question: str | None = None,
    ended_with_eos: bool = True,
    evidence_model: EvidenceModel | None = None,
    judge: Judge | None = None,
) -> RewardResult:
    """Token F1 (SQuAD normalisation, yes/no rule) of the last ``<answer>`` content; 0 without one. The
    partial-credit twin of ``search-r1``, for any protocol whose answer is an ``<answer>`` span."""
    answer = last_tag_content(response, "<answer>", "</answer>")
    if answer is None:
        return RewardResult(0.0, {"answer": None, "f1": 0.0})
    answer = answer.strip()
    f1 = f1_score(answer, golden_answers)
    return RewardResult(f1, {"answer": answer, "f1": f1})


def _information_holds_gold(response: str, golden_answers: list[str]) -> bool:
    blocks = [normalize_squad(block.strip()) for block in tag_contents(response, "<information>", "</information>")]
    return any(normalize_squad(gold) in block for block in blocks for gold in golden_answers)


def search_r1_format(
    response: str,
    golden_answers: list[str],
    *,
    question: str | None = None,
    ended_with_eos: bool = True,
    evidence_model: EvidenceModel | None = None,
    judge: Judge | None = None,
    score: float = 1.0,
    structure_format_score: float = 0.2,
    final_format_score: float = 0.1,
    retrieval_score: float = 0.0,
) -> RewardResult:
    """Search-R1 v0.3: EM-correct & valid ``score`` (1.0); correct & invalid ``score -
    structure_format_score`` (0.8); wrong & valid ``structure_format_score`` (0.2, plus
    ``retrieval_score`` when an information block holds a normalised gold); wrong & invalid
    ``final_format_score`` (0.1). An answerless response is a wrong answer (never valid)."""
    format_error = search_r1_format_error(response)
    valid = format_error is None
    answer = last_tag_content(response, "<answer>", "</answer>")
    answer = answer.strip() if answer is not None else None
    em = exact_match(answer, golden_answers) if answer is not None else 0.0
    retrieval_hit = valid and _information_holds_gold(response, golden_answers)
    if em:
        total = score if valid else score - structure_format_score
    elif valid:
        total = structure_format_score + (retrieval_score if retrieval_hit else 0.0)
    else:
        total = final_format_score
    return RewardResult(
        total,
        {"answer": answer, "em": em, "format_valid": valid, "format_error": format_error, "retrieval_hit": retrieval_hit},
    )


# ---------------------------------------------------------------------------------------------
# R1-Searcher (the Qwen base-model reward and the two Llama stages)


def _r1_solution_and_answer(response: str, eos_string: str, prompt_suffix: str) -> tuple[str, str | None, bool]:
    solution = r1_searcher_solution(response, eos_string=eos_string, prompt_suffix=prompt_suffix)
    has_answer_tags = "<answer>" in solution and "</answer>" in solution
    return solution, r1_searcher_answer(solution), has_answer_tags


def _r1_think_answer_error(solution: str) -> str | None:
    if not r1_searcher_think_ok(solution):
        return "think_count"
    return None if r1_searcher_answer_tags_ok(solution) else "answer_count"


def r1_searcher(
    response: str,
    golden_answers: list[str],
    *,
    question: str | None = None,
    ended_with_eos: bool = True,
    evidence_model: EvidenceModel | None = None,
    judge: Judge | None = None,
    eos_string: str = "<|endoftext|>",
    prompt_suffix: str = R1_BASE_PROMPT_SUFFIX,
    format_penalty: float = -2.0,
    max_answer_words: int = 10,
) -> RewardResult:
    """R1-Searcher's base-model reward: answer F1 (R1 normalisation, yes/no rule; 0 without both
    answer tags) plus ``format_penalty`` (−2) if any rule of :func:`r1_searcher_violations` breaks.

    The solution always ends with one ``eos_string``, whether or not generation emitted EOS, as in
    the reference; ``ended_with_eos`` is therefore not used.
    """
    solution, answer, has_answer_tags = _r1_solution_and_answer(response, eos_string, prompt_suffix)
    f1 = f1_score(answer, golden_answers, normalization="r1") if has_answer_tags and answer is not None else 0.0
    violations = r1_searcher_violations(solution, answer, max_answer_words=max_answer_words)
    total = f1 + (format_penalty if violations else 0.0)
    return RewardResult(
        total,
        {
            "answer": answer,
            "f1": f1,
            "format_error": violations[0] if violations else None,
            "format_errors": ",".join(violations) or None,
        },
    )


def r1_searcher_stage1(
    response: str,
    golden_answers: list[str],
    *,
    question: str | None = None,
    ended_with_eos: bool = True,
    evidence_model: EvidenceModel | None = None,
    judge: Judge | None = None,
    eos_string: str = "<|eot_id|>",
    prompt_suffix: str = R1_BASE_PROMPT_SUFFIX,
    answer_term: bool = True,
    answer_reward: float = 1.0,
    answer_penalty: float = -1.0,
    retrieval_reward: float = 0.5,
    format_reward: float = 0.5,
) -> RewardResult:
    """R1-Searcher stage 1 (reference Llama code): ``answer_reward`` (+1) if both answer tags exist
    and the answer covers a gold (cover-EM, R1 normalisation) else ``answer_penalty`` (−1);
    + ``retrieval_reward`` (0.5) if the seven retrieval-marker counts are equal and ≥ 1;
    + ``format_reward`` (0.5) if no ``<think>`` and exactly one ``</think>``, ``<answer>``,
    ``</answer>``. ``answer_term=False`` drops the answer term, as the paper describes stage 1."""
    solution, answer, has_answer_tags = _r1_solution_and_answer(response, eos_string, prompt_suffix)
    covered = has_answer_tags and answer is not None and cover_exact_match(answer, golden_answers, normalization="r1") == 1.0
    retrieved = r1_searcher_retrieval_balanced(solution) and solution.count("<|begin_of_query|>") >= 1
    format_error = _r1_think_answer_error(solution)
    format_ok = format_error is None
    answer_part = (answer_reward if covered else answer_penalty) if answer_term else 0.0
    total = answer_part + (retrieval_reward if retrieved else 0.0) + (format_reward if format_ok else 0.0)
    return RewardResult(
        total,
        {
            "answer": answer,
            "cover_em": float(covered),
            "answer_score": answer_part,
            "retrieval_ok": retrieved,
            "format_ok": format_ok,
            "format_error": format_error,
        },
    )


def r1_searcher_stage2(
    response: str,
    golden_answers: list[str],
    *,
    question: str | None = None,
    ended_with_eos: bool = True,
    evidence_model: EvidenceModel | None = None,
    judge: Judge | None = None,
    eos_string: str = "<|eot_id|>",
    prompt_suffix: str = R1_BASE_PROMPT_SUFFIX,
    format_penalty: float = -1.0,
) -> RewardResult:
    """R1-Searcher stage 2 (reference Llama code): answer F1 (R1 normalisation, yes/no rule; 0 without
    both answer tags) plus ``format_penalty`` (−1) if the retrieval-marker counts differ, the
    think/answer counts are wrong, or CJK appears outside document blocks."""
    solution, answer, has_answer_tags = _r1_solution_and_answer(response, eos_string, prompt_suffix)
    f1 = f1_score(answer, golden_answers, normalization="r1") if has_answer_tags and answer is not None else 0.0
    errors = []
    if not r1_searcher_retrieval_balanced(solution):
        errors.append("retrieval_count")
    if not r1_searcher_think_ok(solution):
        errors.append("think_count")
    if not r1_searcher_answer_tags_ok(solution):
        errors.append("answer_count")
    if r1_searcher_has_cjk(solution):
        errors.append("cjk")
    total = f1 + (format_penalty if errors else 0.0)
    return RewardResult(
        total,
        {"answer": answer, "f1": f1, "format_error": errors[0] if errors else None, "format_errors": ",".join(errors) or None},
    )


# ---------------------------------------------------------------------------------------------
# ReSearch


def research(
    response: str,
    golden_answers: list[str],
    *,
    question: str | None = None,
    ended_with_eos: bool = True,
    evidence_model: EvidenceModel | None = None,
    judge: Judge | None = None,
    wrong_answer_score: float = 0.1,
) -> RewardResult:
    """ReSearch: 0 on a bad format (:func:`research_format_error`) or when generation did not end with
    EOS; else the F1 (SQuAD normalisation, yes/no rule) of the boxed answer inside the first
    ``<answer>…</answer>`` if positive, else ``wrong_answer_score`` (0.1). A boxed answer that cannot
    be extracted (``\\fbox``, unbalanced braces) scores 0."""
    components: dict = {"answer": None, "f1": 0.0, "eos": bool(ended_with_eos)}
    format_error = research_format_error(response)
    components["format_error"] = format_error
    if format_error is not None:
        return RewardResult(0.0, components)
    if not ended_with_eos:
        components["format_error"] = "no_eos"
        return RewardResult(0.0, components)
    # a valid format guarantees exactly one <answer> before one </answer>
    answer = boxed_answer(first_tag_content(response, "<answer>", "</answer>") or "")
    if answer is None:
        components["format_error"] = "boxed_unreadable"
        return RewardResult(0.0, components)
    f1 = f1_score(answer, golden_answers)
    components.update(answer=answer, f1=f1)
    return RewardResult(f1 if f1 > 0 else wrong_answer_score, components)


# ---------------------------------------------------------------------------------------------
# R-Search (Zhao et al.): answer + evidence, each with a format part


def r_search(
    response: str,
    golden_answers: list[str],
    *,
    question: str | None = None,
    ended_with_eos: bool = True,
    evidence_model: EvidenceModel | None = None,
    judge: Judge | None = None,
    answer_format_weight: float = 0.2,
    evidence_format_weight: float = 0.2,
    answer_weight: float = 1.0,
    evidence_weight: float = 1.0,
    ndigits: int = 2,
) -> RewardResult:
    """R-Search: 0.2·[answer well-formed] + 0.2·[evidence well-formed] + answer F1 + evidence F1
    (SQuAD normalisation, no yes/no rule, rounded to ``ndigits``); see :func:`r_search_parts`.

    Evidence F1 scores ``evidence_model(question, evidence)`` against the golds whenever evidence is
    non-empty; without an evidence model it is 0 and ``components["evidence_skipped"]`` is True.
    """
    parts = r_search_parts(response)
    answer_f1 = f1_score(parts.answer, golden_answers, yes_no_rule=False, ndigits=ndigits) if parts.answer is not None else 0.0
    evidence_answer = None
    evidence_f1 = 0.0
    skipped = False
    if parts.evidence:
        if evidence_model is None:
            skipped = True
        else:
            evidence_answer = str(evidence_model(_require_question(question, "the r-search evidence reward"), parts.evidence))
            evidence_f1 = f1_score(evidence_answer, golden_answers, yes_no_rule=False, ndigits=ndigits)
    answer_ok, evidence_ok = parts.answer_error is None, parts.evidence_error is None
    total = (
        answer_format_weight * answer_ok
        + evidence_format_weight * evidence_ok
        + answer_weight * answer_f1
        + evidence_weight * evidence_f1
    )
    return RewardResult(
        total,
        {
            "answer": parts.answer,
            "answer_f1": answer_f1,
            "answer_format": answer_ok,
            "evidence": parts.evidence,
            "evidence_format": evidence_ok,
            "evidence_answer": evidence_answer,
            "evidence_f1": evidence_f1,
            "evidence_skipped": skipped,
            "format_error": parts.answer_error or parts.evidence_error,
        },
    )


# ---------------------------------------------------------------------------------------------
# Reasoning-search (Shi & Shen): format + DAG validity + judge


def _clamp_unit(value: float) -> float:
    value = float(value)
    return min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0


def reasoning_search(
    response: str,
    golden_answers: list[str],
    *,
    question: str | None = None,
    ended_with_eos: bool = True,
    evidence_model: EvidenceModel | None = None,
    judge: Judge | None = None,
    format_weight: float = 0.25,
    dag_weight: float = 0.25,
    judge_weight: float = 0.5,
    tools: Collection[str] | None = None,
) -> RewardResult:
    """Reasoning-search: DAG invalid → ``format_weight``·format; valid → ``dag_weight`` +
    ``format_weight``·format + ``judge_weight``·judge (0.25 / 0.25 / 0.5).

    format: :func:`reasoning_search_format_ok`; DAG: :func:`read_strict_dag` of the stripped first
    ``<search>`` block (case-insensitive), with ``tools`` as the tool names a node may use (None: the
    reference's General/News/Academy; ``SearchQA-v0`` fills in the names its plans may use); judge:
    ``judge(question, golds, prediction)`` clamped to [0, 1] (NaN → 0), on
    :func:`reasoning_search_prediction`, not called when the DAG is invalid. Without a judge, F1 of
    the prediction (SQuAD normalisation, yes/no rule) stands in.
    """
    format_ok = reasoning_search_format_ok(response)
    plan = first_tag_content(response, "<search>", "</search>", ignore_case=True)
    dag = read_strict_dag((plan or "").strip(), tools=STRICT_TOOLS if tools is None else tools)
    prediction = reasoning_search_prediction(response)
    components: dict = {
        "format": format_ok,
        "dag_valid": dag.valid,
        "dag_violations": ",".join(dag.violations) or None,
        "prediction": prediction,
        "judge": None,
        "judge_source": "skipped",
        "format_error": None if format_ok else "section_order",
    }
    if not dag.valid:
        return RewardResult(format_weight * format_ok, components)
    if judge is None:
        judged, source = f1_score(prediction, golden_answers), "f1_stand_in"
    else:
        judged = judge(_require_question(question, "the reasoning-search judge"), list(golden_answers), prediction)
        source = "judge"
    judged = _clamp_unit(judged)
    components.update(judge=judged, judge_source=source)
    return RewardResult(dag_weight + format_weight * format_ok + judge_weight * judged, components)


BUILTIN_PRESETS: dict[str, Callable[..., RewardResult]] = {
    "search-r1": search_r1,
    "search-r1-f1": search_r1_f1,
    "search-r1-format": search_r1_format,
    "tool-calls-format": tool_calls_format,
    "tool-calls-llama3-format": partial(tool_calls_format, call_format="llama3"),
    "tool-calls-mistral-format": partial(tool_calls_format, call_format="mistral"),
    "r1-searcher": r1_searcher,
    "r1-searcher-stage1": r1_searcher_stage1,
    "r1-searcher-stage2": r1_searcher_stage2,
    "research": research,
    "r-search": r_search,
    "reasoning-search": reasoning_search,
}
"""The seed systems' rewards, registered by ``rewards/__init__.py`` under these names."""

BUILTIN_RANGES: dict[str, tuple[float, float]] = {
    "search-r1": (0.0, 1.0),  # EM
    "search-r1-f1": (0.0, 1.0),  # F1
    "search-r1-format": (0.1, 1.0),  # wrong & invalid 0.1 ... correct & valid 1.0
    "tool-calls-format": (0.1, 1.0),  # as search-r1-format
    "tool-calls-llama3-format": (0.1, 1.0),
    "tool-calls-mistral-format": (0.1, 1.0),
    "r1-searcher": (-2.0, 1.0),  # F1 + (-2 on any format violation)
    "r1-searcher-stage1": (-1.0, 2.0),  # ±1 answer + 0.5 retrieval + 0.5 format
    "r1-searcher-stage2": (-1.0, 1.0),  # F1 + (-1 on a violation)
    "research": (0.0, 1.0),  # 0 on a bad format, else F1 or 0.1
    "r-search": (0.0, 2.4),  # 0.2 + 0.2 well-formed + answer F1 + evidence F1
    "reasoning-search": (0.0, 1.0),  # 0.25 DAG + 0.25 format + 0.5 judge
}
"""(lowest, highest) total of each built-in preset at its default options."""
