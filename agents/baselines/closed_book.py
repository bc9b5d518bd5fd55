"""Closed-book baselines: the LLM answers from what it knows, with no retrieval.

``direct`` asks for the answer at once; ``cot`` (chain of thought) first lets the LLM reason step by
step and takes the answer its reasoning states, asking the reader for it when the reasoning states none.
The reasoning goes into the environment as the agent's thought, so its tokens count like a policy's.
"""
from __future__ import annotations

from agents.baselines.play import Ask, Episode
from agents.baselines.prompts import answer_ask, short_answer, stated_answer, write_answer
from agents.scripted.agents import DialectWriter
from search_env.data.example import QAExample

__all__ = ["ChainOfThought", "Direct"]

#: Most tokens of a chain of thought.
COT_TOKENS = 256


class Direct:
    """The LLM's short answer to the bare question."""

    name = "direct"

    def play(self, example: QAExample, writer: DialectWriter) -> Episode:
        completion = yield answer_ask(example.question)
        yield write_answer(writer, "I answer from what I know, without searching.", short_answer(completion))


class ChainOfThought:
    """The LLM reasons step by step (one paragraph, at most :data:`COT_TOKENS` tokens), then answers."""

    name = "cot"

    def play(self, example: QAExample, writer: DialectWriter) -> Episode:
        reasoning = yield Ask("Answer the question. Think step by step in a few short sentences, then end with "
                              f"\"So the answer is: <short answer>.\"\n\nQuestion: {example.question}",
                              max_new_tokens=COT_TOKENS, stop="\n\n")
        answer = stated_answer(reasoning)
        if answer is None:
            answer = short_answer((yield answer_ask(example.question, reasoning=" ".join(reasoning.split()))))
        yield write_answer(writer, reasoning, answer)
