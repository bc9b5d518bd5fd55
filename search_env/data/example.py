"""The record every dataset loader yields and the environment consumes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SubQuestion:
    """One node of a gold decomposition: ``label`` (e.g. "A"), the sub-``query``, the ``source`` that
    holds its answer (None when the dataset does not say), its ``answer`` and the labels of the
    ``parents`` whose answers it needs. A query may reference a parent's answer as ``{A}``."""

    label: str
    query: str
    answer: str
    source: str | None = None
    parents: list[str] = field(default_factory=list)


@dataclass
class QAExample:
    """A question with its gold answers and, where the dataset has them, gold passages (ids in the
    matching corpus/source) and a gold decomposition into sub-questions."""

    id: str
    question: str
    golden_answers: list[str]
    gold_passage_ids: list[str] = field(default_factory=list)
    decomposition: list[SubQuestion] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
