"""IRCoT (Trivedi et al. 2023): interleaving retrieval with chain-of-thought reasoning.

The first search is the question. Then, turn after turn, the LLM writes the next sentence of its
reasoning over everything retrieved so far, and that sentence is the next search, until a sentence
states the answer ("... the answer is X"), the search budget is spent, or a search returns nothing new
(the LLM is going in circles, or the environment is refusing further calls). The answer is the one the
reasoning stated, or else the reader's answer from the passages and the reasoning.

Each sentence goes into the environment as the thought before the search it led to, so the trajectory
shows the chain as IRCoT ran it.
"""
from __future__ import annotations

import re

from agents.baselines.play import Ask, Episode
from agents.baselines.prompts import answer_ask, plain, results_text, search, short_answer, stated_answer, write_answer
from agents.scripted.agents import DialectWriter
from search_env.data.example import QAExample

__all__ = ["IRCoT"]

#: Searches when neither the baseline nor the protocol sets a budget (ReSearch's has none).
UNBUDGETED_SEARCHES = 4
#: Most tokens of one reasoning step (the first sentence of them is kept).
STEP_TOKENS = 64

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


class IRCoT:
    """Alternates a reasoning sentence and a search with it (see the module docstring).

    Args:
        max_searches: searches per episode, the first (the question) included; None: the protocol's
            turn budget, or :data:`UNBUDGETED_SEARCHES` where it has none. The environment's own budget
            still applies: a refused call returns the same error each time, which ends the chain.
    """

    name = "ircot"

    def __init__(self, max_searches: int | None = None) -> None:
        if max_searches is not None and max_searches < 1:
            raise ValueError(f"max_searches must be >= 1, got {max_searches}")
        self.max_searches = max_searches

    def play(self, example: QAExample, writer: DialectWriter) -> Episode:
        budget = self.max_searches or writer.protocol.max_turns or UNBUDGETED_SEARCHES
        question = example.question
        results = [results_text((yield search(writer, "I search for the question.", question)), writer)]
        sentences: list[str] = []
        searches, written = 1, 0  # written: sentences already written as the thoughts of searches
        while True:
            completion = yield _next_step(question, "\n".join(results), sentences)
            sentence = _SENTENCE_END.split(plain(completion, writer), 1)[0]
            if not sentence:
                break
            sentences.append(sentence)
            if stated_answer(sentence) is not None or searches >= budget:
                break
            found = results_text((yield search(writer, sentence, sentence)), writer)
            searches, written = searches + 1, len(sentences)
            if found in results:
                break
            results.append(found)
        answer = stated_answer(sentences[-1]) if sentences else None
        passages = "\n".join(results)
        if answer is None:
            answer = short_answer((yield answer_ask(question, passages=passages, reasoning=" ".join(sentences))))
        thought = " ".join(sentences[written:]) or "I answer from the results and my reasoning."
        yield write_answer(writer, thought, answer, retrieved=passages)


def _next_step(question: str, passages: str, sentences: list[str]) -> Ask:
    """The ask for the next sentence: the reasoning so far is the start of the LLM's reply."""
    instruction = (f"Passages:\n{passages}\n\nAnswer the question by reasoning step by step over the passages, one short "
                   "sentence at a time. When you know the answer, write \"So the answer is: <short answer>.\"\n\n"
                   f"Question: {question}")
    return Ask(instruction, start=" ".join(sentences) + " " if sentences else "", max_new_tokens=STEP_TOKENS, stop="\n")
