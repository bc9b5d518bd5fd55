"""A user's retriever, registered when this module is imported (``--import tests.search_env.sources.user_retriever``):
passages ranked by how many of the query's words they share, ties by corpus order. ``BUILT`` records
every build, so that a test can tell this retriever answered and not a built-in one."""
from __future__ import annotations

import sys
from typing import Sequence

from search_env.data.corpus import load_corpus
from search_env.sources import SOURCES, Passage, Source, SourceOptions, register_source

NAME = "word-overlap"
BUILT: list[tuple[object, SourceOptions]] = []


class WordOverlapSource(Source):
    def __init__(self, corpus: object, name: str) -> None:
        rows = load_corpus(corpus) if isinstance(corpus, str) or hasattr(corpus, "__fspath__") else list(corpus)
        self.name = name
        self.passages = [p if isinstance(p, Passage) else Passage(p["id"], p["title"], p["text"]) for p in rows]

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        def overlap(query: str, passage: Passage) -> int:
            return len(set(query.lower().split()) & set(f"{passage.title} {passage.text}".lower().split()))

        return [sorted(self.passages, key=lambda p: -overlap(q, p))[:k] for q in queries]


def word_overlap(corpus: object, options: SourceOptions) -> Source:
    BUILT.append((corpus, options))
    return WordOverlapSource(corpus, options.name)


def forget() -> None:
    """Unregister the retriever and this module, so that the next ``--import`` registers it again."""
    SOURCES.pop(NAME, None)
    BUILT.clear()
    sys.modules.pop(__name__, None)


register_source(NAME, word_overlap)
