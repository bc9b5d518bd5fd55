"""Naive retrieval-augmented generation: one search with the question, then the LLM answers from the
results (the "standard RAG" row of the search-agent papers' tables).

The search is a call in the protocol's dialect (a one-node plan under an NL-DAG protocol), so the
environment runs it with its own sources, top-k and formatting, and the reader reads the results as the
environment wrote them.
"""
from __future__ import annotations

from agents.baselines.play import Episode
from agents.baselines.prompts import answer_ask, results_text, search, short_answer, write_answer
from agents.scripted.agents import DialectWriter
from search_env.data.example import QAExample

__all__ = ["NaiveRAG"]


class NaiveRAG:
    """Searches the question once, then answers from the results."""

    name = "naive-rag"

    def play(self, example: QAExample, writer: DialectWriter) -> Episode:
        observation = yield search(writer, "I search for the question.", example.question)
        passages = results_text(observation, writer)
        completion = yield answer_ask(example.question, passages=passages)
        yield write_answer(writer, "I answer from the results.", short_answer(completion), retrieved=passages)
