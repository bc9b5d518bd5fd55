"""Pulling the final answer out of an agent's text, the way each seed system's reference does.

Every function returns ``None`` when there is no answer to extract; the preset decides what an absent
answer scores (0 for most, a "wrong answer" for Search-R1's format reward).
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache

__all__ = [
    "tag_contents",
    "first_tag_content",
    "last_tag_content",
    "remove_tag_spans",
    "last_boxed_only",
    "boxed_answer",
    "r1_searcher_solution",
    "r1_searcher_answer",
    "reasoning_search_prediction",
]


@lru_cache(maxsize=256)
def _literal(tag: str, ignore_case: bool) -> re.Pattern[str]:
    return re.compile(re.escape(tag), re.IGNORECASE if ignore_case else 0)


def _search(pattern: re.Pattern[str], text: str, position: int) -> re.Match[str] | None:
    """Every scan of the text goes through here: one place to see (and, in tests, count) the work."""
    return pattern.search(text, position)


def _tag_matches(
    text: str, open_tag: str, close_tag: str, ignore_case: bool
) -> Iterator[tuple[re.Match[str], re.Match[str]]]:
    """The (opening, closing) tag matches of each span that ``re.finditer(open(.*?)close, DOTALL)``
    finds, left to right, in time linear in the text.

    The regex retries every opening that has no closing after it, scanning to the end each time:
    quadratic on a long rollout full of unclosed tags. But when the first opening finds no closing
    after it, no later opening can, so the scan stops there: each character is looked at once.
    """
    if not open_tag:
        raise ValueError("open_tag must not be empty")
    opener, closer = _literal(open_tag, ignore_case), _literal(close_tag, ignore_case)
    position = 0
    while True:
        opening = _search(opener, text, position)
        if opening is None:
            return
        closing = _search(closer, text, opening.end())
        if closing is None:
            return
        yield opening, closing
        position = closing.end()


def tag_contents(text: str, open_tag: str, close_tag: str, *, ignore_case: bool = False) -> list[str]:
    """Contents of every non-overlapping ``open_tag…close_tag`` span, shortest match first (unstripped).

    This is ``re.findall(r"<x>(.*?)</x>", text, re.DOTALL)``, the reading every reference uses, so a
    nested ``<x> a <x> b </x>`` gives the single content ``" a <x> b "`` (computed in linear time).
    """
    return [text[opening.end() : closing.start()] for opening, closing in _tag_matches(text, open_tag, close_tag, ignore_case)]


def first_tag_content(text: str, open_tag: str, close_tag: str, *, ignore_case: bool = False) -> str | None:
    """Content of the first ``open_tag…close_tag`` span (unstripped), or ``None``."""
    for opening, closing in _tag_matches(text, open_tag, close_tag, ignore_case):
        return text[opening.end() : closing.start()]
    return None


def last_tag_content(text: str, open_tag: str, close_tag: str, *, ignore_case: bool = False) -> str | None:
    """Content of the last ``open_tag…close_tag`` span (unstripped), or ``None``."""
    last = None
    for last in _tag_matches(text, open_tag, close_tag, ignore_case):
        pass
    return None if last is None else text[last[0].end() : last[1].start()]


def remove_tag_spans(text: str, open_tag: str, close_tag: str, *, ignore_case: bool = False) -> str:
    """``text`` without its ``open_tag…close_tag`` spans, tags included: ``re.sub(open.*?close, "",
    text, flags=DOTALL)`` in linear time."""
    kept, position = [], 0
    for opening, closing in _tag_matches(text, open_tag, close_tag, ignore_case):
        kept.append(text[position : opening.start()])
        position = closing.end()
    kept.append(text[position:])
    return "".join(kept)


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
_RS_OPEN = re.compile(r"<(think|search|result)>", re.IGNORECASE)
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
    close = _search(_RS_RESULT_CLOSE, text, 0)
    if close is not None:
        return text[close.end() :].strip()
    return _remove_reasoning_blocks(text).strip()


def _remove_reasoning_blocks(text: str) -> str:
    """``_RS_BLOCKS.sub("", text)`` (the reference's reading) in linear time.

    The regex retries each ``<think>`` without a matching close to the end of the text. Here the
    first close after a point is looked up once per opening tag as written (``<Think>`` and
    ``<think>`` are different keys: the back-reference compares case-insensitively to what the
    opening matched) and remembered: later openings only search on from where that close lies.
    Whether a close matches an opening is decided by ``_RS_BLOCKS`` itself, on the two tags alone.
    """
    found: dict[str, tuple[int, re.Match[str] | None]] = {}  # opening as written -> (searched from, close)

    def close_after(opening: str, start: int) -> re.Match[str] | None:
        searched_from, close = found.get(opening, (-1, None))
        if searched_from >= 0 and (close is None or close.start() >= start):
            return close  # the first close from an earlier point, and still ahead (or none at all)
        closer = _literal("</" + opening[1:], True)  # a superset of the back-reference's matches
        position = start
        while (close := _search(closer, text, position)) is not None:
            if _RS_BLOCKS.fullmatch(opening + close.group()):
                break
            position = close.start() + 1
        found[opening] = (start, close)
        return close

    kept, position, search_from = [], 0, 0
    while (opening := _search(_RS_OPEN, text, search_from)) is not None:
        close = close_after(opening.group(), opening.end())
        if close is None:
            search_from = opening.end()
            continue
        kept.append(text[position : opening.start()])
        position = search_from = close.end()
    kept.append(text[position:])
    return "".join(kept)
