"""What the baselines share: their answer prompt, how they read an LLM's answer, how they turn LLM and
environment text into what they write.

Every baseline ends with the same reader (:func:`answer_ask`: a short answer to the question, from
whatever context the baseline gathered), so that rows differ only in that context: nothing
(``direct``), the LLM's own reasoning (``cot``), retrieved passages (``naive-rag``, ``ircot``) or the
gold passages (``oracle-passages``).
"""
from __future__ import annotations

import re

from agents.baselines.play import Ask, Write
from agents.scripted.agents import DialectWriter

__all__ = ["EVIDENCE_WORDS", "answer_ask", "plain", "results_text", "search", "short_answer", "stated_answer", "write_answer"]

#: Most words of retrieved text a baseline copies into an evidence block (R-Search's), which counts
#: against the agent's token budget: about one passage.
EVIDENCE_WORDS = 200

_TAG = re.compile(r"<\|?/?[A-Za-z_][\w|]*\|?>")
_STATED = re.compile(r"answer is\s*:?\s*(.+)", re.IGNORECASE)
_LEADING_LABEL = re.compile(r"^(?:final\s+)?answer\s*:\s*", re.IGNORECASE)
_POLAR = re.compile(r"^(yes|no)[,.]", re.IGNORECASE)


def plain(text: str, writer: DialectWriter) -> str:
    """``text`` on one line without the protocol's tags or any tag-like ``<...>`` span, so that what an
    LLM wrote can go into a thought, a query or an answer without opening or closing a call."""
    p = writer.protocol
    for tag in (p.call_open, p.call_close, p.answer_open, p.answer_close, p.result_open, p.result_close,
                p.evidence_open, p.evidence_close):
        if tag:
            text = text.replace(tag, " ")
    return " ".join(_TAG.sub(" ", text).split())


def results_text(observation: str, writer: DialectWriter) -> str:
    """What the environment returned, as a reader reads it: each line :func:`plain`, empty ones dropped."""
    return "\n".join(line for line in (plain(line, writer) for line in observation.splitlines()) if line)


def short_answer(completion: str) -> str:
    """The answer in a reply to the answer prompt: its first non-empty line, without an ``Answer:``
    label, quotes, emphasis or a final full stop; a reply that begins with "Yes" or "No" and goes on
    after a comma or full stop ("No, they were not") is that word."""
    line = next((line for line in completion.splitlines() if line.strip()), "")
    answer = _LEADING_LABEL.sub("", line.strip()).strip(" \t\"'*`.")
    polar = _POLAR.match(answer)
    return polar.group(1) if polar else answer


def stated_answer(reasoning: str) -> str | None:
    """The answer a chain of thought states ("... so the answer is X."), or None when it states none."""
    found = _STATED.findall(reasoning)
    if not found:
        return None
    return short_answer(found[-1].split(". ")[0]) or None


def answer_ask(question: str, *, passages: str = "", reasoning: str = "") -> Ask:
    """The reader every baseline ends with: a short answer to ``question`` given ``passages`` and
    ``reasoning`` (either may be empty). It stops at a blank line, not at the first line break: a
    model may break the line right after ``Answer:`` (:func:`short_answer` takes the first non-empty line)."""
    parts = ["Answer the question with a short answer (a name, a date, a number, yes or no) and no explanation."]
    if passages:
        parts.append(f"Passages:\n{passages}")
    if reasoning:
        parts.append(f"Reasoning: {reasoning}")
    parts.append(f"Question: {question}")
    return Ask("\n\n".join(parts), start="Answer:", max_new_tokens=32, stop="\n\n")


def search(writer: DialectWriter, thought: str, query: str) -> Write:
    """A thought and one search for ``query`` (both made :func:`plain`): a call, or under an NL-DAG
    protocol a one-node plan."""
    query = plain(query, writer)
    call = writer.plan([("A", query, None)], []) if writer.protocol.call_kind == "dag" else writer.call(query)
    return Write(writer.think(plain(thought, writer)) + call)


def write_answer(writer: DialectWriter, thought: str, answer: str, retrieved: str = "") -> Write:
    """A thought and the final answer (made :func:`plain`, without braces, which would end ReSearch's
    ``\\boxed{}`` early); where the dialect has an evidence block it holds the start of ``retrieved``
    (what the environment returned), at most :data:`EVIDENCE_WORDS` words."""
    evidence = " ".join(plain(retrieved, writer).split()[:EVIDENCE_WORDS])
    answer = plain(answer, writer).replace("{", "").replace("}", "")
    return Write(writer.think(plain(thought, writer)) + writer.answer(answer, evidence=evidence or None))
