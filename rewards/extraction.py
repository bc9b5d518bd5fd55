"""Pulling the final answer out of an agent's text, the way each seed system's reference does.

Every function returns ``None`` when there is no answer to extract; the preset decides what an absent
answer scores (0 for most, a "wrong answer" for Search-R1's format reward).
"""
from __future__ import annotations

import re
from functools import lru_cache

__all__ = [
    "tag_contents",
    "first_tag_content",
    "last_tag_content",
    "last_boxed_only",
    "boxed_answer",
    "r1_searcher_solution",
    "r1_searcher_answer",
    "reasoning_search_prediction",
]


@lru_cache(maxsize=64)
def _tag_pattern(open_tag: str, close_tag: str, ignore_case: bool) -> re.Pattern[str]:
    flags = re.DOTALL | (re.IGNORECASE if ignore_case else 0)
    return re.compile(re.escape(open_tag) + "(.*?)" + re.escape(close_tag), flags)


def tag_contents(text: str, open_tag: str, close_tag: str, *, ignore_case: bool = False) -> list[str]:
    """Contents of every non-overlapping ``open_tag…close_tag`` span, shortest match first (unstripped).

    This is ``re.findall(r"<x>(.*?)</x>", text, re.DOTALL)``, the reading every reference uses, so a
    nested ``<x> a <x> b </x>`` gives the single content ``" a <x> b "``.
    """
    return _tag_pattern(open_tag, close_tag, ignore_case).findall(text)


def first_tag_content(text: str, open_tag: str, close_tag: str, *, ignore_case: bool = False) -> str | None:
    """Content of the first ``open_tag…close_tag`` span (unstripped), or ``None``."""
    match = _tag_pattern(open_tag, close_tag, ignore_case).search(text)
    return match.group(1) if match else None


def last_tag_content(text: str, open_tag: str, close_tag: str, *, ignore_case: bool = False) -> str | None:
    """Content of the last ``open_tag…close_tag`` span (unstripped), or ``None``."""
    contents = tag_contents(text, open_tag, close_tag, ignore_case=ignore_case)
    return contents[-1] if contents else None


def last_boxed_only(text: str) -> str | None:
    """The last ``\\boxed`` expression of ``text`` with its braces, as the MATH-style reference finds it.

    If ``text`` contains ``"\\boxed "`` (with a space) the result is ``"\\boxed "`` plus what follows
    the last such occurrence up to the next ``$``. Otherwise braces are matched from the last
    ``\\boxed`` (or, when there is none, the last ``\\fbox``) to the brace that closes the first one
    opened; ``None`` when there is no such command or the braces never balance.
    """
    if "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[start : index + 1]
    return None


def boxed_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{…}`` (or what follows ``\\boxed ``) in ``text``, else ``None``.

    ``None`` also covers what the reference treats as an extraction error: an ``\\fbox``, unbalanced
    braces, or a last ``\\boxed`` not directly followed by ``{``.
    """
    boxed = last_boxed_only(text)
    if boxed is None:
        return None
    if boxed.startswith("\\boxed "):
        return boxed[len("\\boxed ") :]
    if boxed.startswith("\\boxed{") and boxed.endswith("}"):
        return boxed[len("\\boxed{") : -1]
    return None


def r1_searcher_solution(response: str, *, eos_string: str, prompt_suffix: str) -> str:
    """The text R1-Searcher's reward scores, built from the agent's response (prompt excluded).

    The reference splits prompt+response on the prompt's last line (``prompt_suffix``, e.g.
    ``"\\nAssistant: <think>"``) and keeps what follows its last occurrence, strips leading
    whitespace, and ends the text with exactly one EOS string whether or not generation emitted one.
    """
    if prompt_suffix and prompt_suffix in response:
        response = response.rsplit(prompt_suffix, 1)[1]
    solution = response.lstrip()
    if eos_string:
        while solution.endswith(eos_string):
            solution = solution[: -len(eos_string)]
    return solution + eos_string


def r1_searcher_answer(solution: str) -> str | None:
    """Text after the last ``<answer>`` up to the next ``</answer>`` (or to the end), stripped.

    ``None`` when the solution has no ``<answer>``.
    """
    start = solution.rfind("<answer>")
    if start < 0:
        return None
    rest = solution[start + len("<answer>") :]
    end = rest.find("</answer>")
    return (rest if end < 0 else rest[:end]).strip()


_RS_BLOCKS = re.compile(r"<(think|search|result)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_RS_RESULT_CLOSE = re.compile(re.escape("</result>"), re.IGNORECASE)


def reasoning_search_prediction(response: str) -> str:
    """The text Reasoning-search's judge sees (tags matched case-insensitively).

    Start from the stripped content of the first ``<answer>…</answer>`` (the whole response when
    there is none); in that text take the content of its first ``<answer>…</answer>``, else what
    follows its first ``</result>``, else the text without its think/search/result blocks — stripped.
    So ``<answer>x</result>Paris</answer>`` is judged as ``"Paris"``.
    """
    first = first_tag_content(response, "<answer>", "</answer>", ignore_case=True)
    text = response if first is None else first.strip()
    inner = first_tag_content(text, "<answer>", "</answer>", ignore_case=True)
    if inner is not None:
        return inner.strip()
    close = _RS_RESULT_CLOSE.search(text)
    if close is not None:
        return text[close.end() :].strip()
    return _RS_BLOCKS.sub("", text).strip()
