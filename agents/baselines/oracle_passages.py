"""The gold-passage upper bound: the LLM reads the question's gold passages, as the environment would
format them, and answers; nothing is searched.

Gold passages are a real dataset's supporting contexts (FlashRAG rows' ``contexts`` flagged
``is_supporting``), or, for a question of the built-in synthetic world, the world's passages named by
``gold_passage_ids`` (the world is regenerated from the seed and difficulty the question records).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from agents.baselines.play import Episode
from agents.baselines.prompts import answer_ask, short_answer, write_answer
from agents.scripted.agents import DialectWriter, gold_contexts
from search_env.data.example import QAExample
from search_env.sources.base import Passage

__all__ = ["NoGoldPassages", "OraclePassages", "gold_passages"]


class NoGoldPassages(ValueError):
    """A question has no gold passages to read (a dataset without supporting contexts)."""


class OraclePassages:
    """Answers from the gold passages (see the module docstring)."""

    name = "oracle-passages"

    def play(self, example: QAExample, writer: DialectWriter) -> Episode:
        passages = writer.protocol.format_docs(gold_passages(example)).strip()
        completion = yield answer_ask(example.question, passages=passages)
        yield write_answer(writer, "I read the gold passages.", short_answer(completion))

    def unable(self, example: QAExample) -> str | None:
        """Why this baseline cannot play ``example`` (it has no gold passages), or None when it can."""
        try:
            gold_passages(example)
        except NoGoldPassages as exc:
            return str(exc)
        return None


def gold_passages(example: QAExample) -> list[Passage]:
    """The question's gold passages (see the module docstring).

    Raises:
        NoGoldPassages: the example has none, or its synthetic world does not hold them (a world built
            with a custom configuration).
    """
    contexts = gold_contexts(example)
    if contexts:
        return [Passage(str(c.get("corpus_id", "")), c["title"], c["text"]) for c in contexts]
    meta = example.metadata
    if not example.gold_passage_ids or "seed" not in meta or "difficulty" not in meta:
        raise NoGoldPassages(f"example {example.id!r} has no gold passages: the oracle-passages baseline needs supporting "
                         "contexts or a synthetic world's question")
    world = _world(int(meta["seed"]), int(meta["difficulty"]))
    lookups = [node for node in example.decomposition if node.source is not None]
    try:
        rows = [world.passage(pid) for pid in example.gold_passage_ids]
    except KeyError as exc:
        raise NoGoldPassages(f"example {example.id!r}: {exc.args[0]} (was its world built with a custom configuration?)") from None
    if len(lookups) != len(rows) or any(node.answer not in row["text"] for node, row in zip(lookups, rows)):
        raise NoGoldPassages(f"example {example.id!r}: the world of seed {meta['seed']} does not state its answers in its gold "
                         "passages (was it built with a custom configuration?)")
    return [Passage(row["id"], row["title"], row["text"]) for row in rows]


@lru_cache(maxsize=2)
def _world(seed: int, difficulty: int) -> Any:
    """The synthetic world of ``seed`` and ``difficulty`` without questions (its passages do not depend on them)."""
    from search_env.synthetic import generate_world

    return generate_world(seed=seed, n_questions=0, difficulty=difficulty)
