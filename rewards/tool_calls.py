"""Rewards for episodes whose searches are native tool calls (the ``tool-calls`` protocols): the format
check and Search-R1's format reward with that check in place of Search-R1's tag order.

A tool-calls episode has no ``<search>``/``<information>`` tags, so Search-R1's own format check judges
every one of them badly formatted. Here an episode is well formed when every call the agent wrote reads
as a call and the episode ends with its answer. The check reads the response text alone (this package
depends on nothing else in the project), in the call format the protocol names:

* ``hermes`` (``tool-calls``): each ``<tool_call> ... </tool_call>`` block holds one JSON call;
* ``llama3`` (``tool-calls-llama3``): each call is a JSON object opening with ``{"name"``, standing
  alone in the turn (a JSON list of such objects reads as its objects);
* ``mistral`` (``tool-calls-mistral``): each ``[TOOL_CALLS]`` is followed by a JSON list of calls.
"""
from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any, Callable

from .extraction import last_tag_content
from .metrics import exact_match
from .result import RewardResult

__all__ = ["TOOL_CALL_FORMATS", "tool_calls_format_error", "tool_calls_format"]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_LLAMA3_CALL = re.compile(r'\{\s*"name"\s*:')
_MISTRAL_OPEN = "[TOOL_CALLS]"


def _call_error(value: Any, tools: Collection[str] | None) -> str | None:
    """Why a decoded call is not ``{"name": str, "arguments" | "parameters": {"query": non-blank str}}``
    (arguments may be given as a JSON string), the rules the environment reads calls by; None if it is."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"].strip():
        return "call_invalid"
    if tools is not None and value["name"].strip() not in tools:
        return "call_unknown_tool"
    args = value.get("arguments", value.get("parameters"))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return "call_invalid"
    if not isinstance(args, dict) or set(args) != {"query"} or not isinstance(args["query"], str):
        return "call_invalid"
    return None if args["query"].strip() else "call_empty_query"


def _hermes_calls_error(response: str, tools: Collection[str] | None) -> str | None:
    at = response.find(_OPEN)
    while at != -1:
        end = response.find(_CLOSE, at)
        following = response.find(_OPEN, at + len(_OPEN))
        if end == -1 or following != -1 and following < end:
            return "call_cut"
        try:
            error = _call_error(json.loads(response[at + len(_OPEN):end]), tools)
        except json.JSONDecodeError:
            error = "call_invalid"
        if error is not None:
            return error
        at = following
    return None


def _llama3_calls_error(response: str, tools: Collection[str] | None) -> str | None:
    decoder, position = json.JSONDecoder(), 0
    while (match := _LLAMA3_CALL.search(response, position)) is not None:
        try:
            value, position = decoder.raw_decode(response, match.start())
        except json.JSONDecodeError:
            return "call_invalid"
        error = _call_error(value, tools)
        if error is not None:
            return error
    return None


def _mistral_calls_error(response: str, tools: Collection[str] | None) -> str | None:
    decoder, at = json.JSONDecoder(), response.find(_MISTRAL_OPEN)
    while at != -1:
        start = at + len(_MISTRAL_OPEN)
        start += len(response[start:]) - len(response[start:].lstrip())
        try:
            value = decoder.raw_decode(response, start)[0]
        except json.JSONDecodeError:
            return "call_invalid"
        calls = value if isinstance(value, list) else [value]
        for error in [_call_error(call, tools) for call in calls] or ["call_invalid"]:
            if error is not None:
                return error
        at = response.find(_MISTRAL_OPEN, start)
    return None


TOOL_CALL_FORMATS: dict[str, Callable[[str, Collection[str] | None], str | None]] = {
    "hermes": _hermes_calls_error,
    "llama3": _llama3_calls_error,
    "mistral": _mistral_calls_error,
}
"""Each call format's check of the calls in a response (the first broken rule, or None)."""


def tool_calls_format_error(response: str, call_format: str = "hermes", *, tools: Collection[str] | None = None) -> str | None:
    """The first rule a tool-calls response breaks, or None when it is well formed.

    Rules in order: every call of ``call_format`` (:data:`TOOL_CALL_FORMATS`) is closed (``call_cut``:
    a ``<tool_call>`` with no ``</tool_call>`` before the next one), is JSON (``call_invalid``) of a call
    with a name and exactly a string ``query`` argument (``call_invalid``), non-blank
    (``call_empty_query``), naming one of ``tools`` when they are given (``call_unknown_tool``); an
    ``<answer> ... </answer>`` span is present (``answer_missing``) and only whitespace follows the last
    one (``text_after_answer``).
    """
    check = TOOL_CALL_FORMATS.get(call_format)
    if check is None:
        raise ValueError(f"unknown call_format {call_format!r}; choose one of {', '.join(TOOL_CALL_FORMATS)}")
    error = check(response, tools)
    if error is not None:
        return error
    end = response.rfind("</answer>")
    if end == -1 or last_tag_content(response, "<answer>", "</answer>") is None:
        return "answer_missing"
    return "text_after_answer" if response[end + len("</answer>"):].strip() else None


def tool_calls_format(
    response: str,
    golden_answers: list[str],
    *,
    question: str | None = None,
    ended_with_eos: bool = True,
    evidence_model: Callable[[str, str], str] | None = None,
    judge: Callable[[str, list, str], float] | None = None,
    score: float = 1.0,
    structure_format_score: float = 0.2,
    final_format_score: float = 0.1,
    call_format: str = "hermes",
    tools: Collection[str] | None = None,
) -> RewardResult:
    """Search-R1 v0.3's format reward (as ``search-r1-format``) with :func:`tool_calls_format_error` as
    the format check: EM-correct & well formed ``score`` (1.0); correct & not ``score -
    structure_format_score`` (0.8); wrong & well formed ``structure_format_score`` (0.2); wrong & not
    ``final_format_score`` (0.1). EM is that of the last answer (SQuAD normalisation)."""
    format_error = tool_calls_format_error(response, call_format, tools=tools)
    valid = format_error is None
    answer = last_tag_content(response, "<answer>", "</answer>")
    answer = answer.strip() if answer is not None else None
    em = exact_match(answer, golden_answers) if answer is not None else 0.0
    if em:
        total = score if valid else score - structure_format_score
    else:
        total = structure_format_score if valid else final_format_score
    return RewardResult(total, {"answer": answer, "em": em, "format_valid": valid, "format_error": format_error})

