"""BM25 over a local passage corpus: the default source, needing no model and no network.

Tokenising and indexing use ``bm25s`` (its tokenizer, its Lucene-variant BM25 score matrix, its
save/load format). The top-k selection is done here rather than by ``bm25s.BM25.retrieve``, for two
reasons: ``retrieve`` runs ``np.argpartition`` over the whole score vector, which degenerates on BM25's
mostly-zero vectors (several times slower than ranking only the matching passages; figures in
``benchmarks/RESULTS.md``), and its order among equal scores is not specified. Here a query ranks only the passages that match at least one of its terms, ties go to the
passage that comes first in the corpus, and passages without a matching term are never returned —
the behaviour of Lucene-style engines, so a query of stopwords or unknown words gets no results.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, Union

import bm25s
import numpy as np
from bm25s.tokenization import Tokenizer

from search_env.data.corpus import load_corpus, passage_from_row
from search_env.sources.base import Passage, Source


class _WordStemmer(Protocol):
    def stemWord(self, word: str) -> str: ...  # noqa: N802 - PyStemmer's method name


#: A stemmer as ``bm25s`` accepts it: a callable ``word -> stem`` or an object with ``stemWord``
#: (e.g. ``Stemmer.Stemmer("english")`` from PyStemmer).
StemmerLike = Union[Callable[[str], str], _WordStemmer]

_META_FILE = "searchqa_bm25.json"
_CORPUS_FILE = "corpus.jsonl"
_FORMAT_VERSION = 1


class BM25Source(Source):
    """A :class:`Source` ranking passages with BM25 over their title and text.

    ``passages`` is a JSON-lines corpus path (``{id, title, text}`` or wiki-18 ``{id, contents}``) or
    an iterable of such dicts (e.g. ``generate_world().sources["wiki"]``). ``stemmer`` is optional
    (none by default, so no extra package is needed); ``stopwords`` is a ``bm25s`` stopword language
    name or list; ``k1``/``b`` are the BM25 parameters. Searching is thread-safe.
    """

    def __init__(
        self,
        passages: Iterable[Mapping[str, Any]] | str | Path,
        *,
        name: str = "wiki",
        stemmer: StemmerLike | None = None,
        stopwords: str | list[str] = "en",
        k1: float = 1.5,
        b: float = 0.75,
    ) -> None:
        if isinstance(passages, (str, Path)):
            rows = load_corpus(passages)
        else:
            rows = [passage_from_row(row, f"passage {i}") for i, row in enumerate(passages)]
        if not rows:
            raise ValueError("BM25Source needs at least one passage")
        tokenizer = Tokenizer(stopwords=stopwords, stemmer=stemmer)
        token_ids = tokenizer.tokenize(
            [f"{row['title']}\n{row['text']}" for row in rows],
            update_vocab=True, return_as="ids", show_progress=False,
        )
        index = bm25s.BM25(k1=k1, b=b)
        index.index((token_ids, tokenizer.get_vocab_dict()), show_progress=False)
        self._setup(name, rows, tokenizer, index, stemmed=stemmer is not None)

    def _setup(self, name: str, rows: list[dict[str, str]], tokenizer: Tokenizer, index: bm25s.BM25,
               *, stemmed: bool) -> None:
        self.name = name
        self._rows = rows
        self._tokenizer = tokenizer
        self._index = index
        self._stemmed = stemmed
        # The tokenizer caches word -> stem lookups as it meets new query words; the lock keeps
        # those dict updates from racing with save().
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Return up to ``k`` passages per query, best first; only passages matching a query term.

        The whole batch is tokenised in one call; ``k`` larger than the corpus is allowed.
        """
        if isinstance(queries, str):
            raise TypeError("search() takes a sequence of queries, not a single string")
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        if not queries:
            return []
        with self._lock:  # "stream" skips the progress-bar machinery that "ids" sets up on every call
            token_ids = list(self._tokenizer.tokenize(list(queries), update_vocab=False, return_as="stream",
                                                      allow_empty=False))
        return [self._top_k(ids, k) if ids and k else [] for ids in token_ids]

    def _top_k(self, token_ids: list[int], k: int) -> list[Passage]:
        scores = self._index.get_scores_from_ids(token_ids)
        matched = np.flatnonzero(scores > 0)  # ascending corpus positions
        matched_scores = scores[matched]
        if matched.size > k:
            keep = matched_scores >= _kth_largest(matched_scores, k)  # every passage tied with the k-th stays in the running
            matched, matched_scores = matched[keep], matched_scores[keep]
        order = np.argsort(-matched_scores, kind="stable")[:k]  # stable: ties keep corpus order
        rows = self._rows
        return [
            Passage(id=row["id"], title=row["title"], text=row["text"], score=float(score))
            for row, score in zip((rows[i] for i in matched[order].tolist()), matched_scores[order].tolist())
        ]

    def save(self, directory: str | Path) -> None:
        """Write the index, the tokenizer's vocabulary and the passages to ``directory``.

        :meth:`load` restores an identical source without re-tokenising or re-indexing the corpus.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._index.save(directory, corpus=self._rows, corpus_name=_CORPUS_FILE, show_progress=False,
                             raise_on_serialization_error=True)
            self._tokenizer.save_vocab(directory)
            self._tokenizer.save_stopwords(directory)
        meta = {"format": _FORMAT_VERSION, "name": self.name, "stemmed": self._stemmed, "num_passages": len(self)}
        (directory / _META_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")

    @classmethod
    def load(cls, directory: str | Path, *, name: str | None = None, stemmer: StemmerLike | None = None,
             mmap: bool = False) -> "BM25Source":
        """Load a source written by :meth:`save`.

        An index built with a stemmer must be given the same stemmer again (a stemmer cannot be
        stored); ``mmap=True`` memory-maps the score arrays for corpora larger than memory.
        """
        directory = Path(directory)
        meta_path = directory / _META_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(f"{directory} is not a saved BM25Source (no {_META_FILE})")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("format") != _FORMAT_VERSION:
            raise ValueError(f"{meta_path}: unsupported index format {meta.get('format')!r}")
        if meta["stemmed"] and stemmer is None:
            raise ValueError(f"{directory} was indexed with a stemmer; pass the same stemmer to load()")
        if not meta["stemmed"] and stemmer is not None:
            raise ValueError(f"{directory} was indexed without a stemmer; do not pass one to load()")
        index = bm25s.BM25.load(directory, mmap=mmap, show_progress=False)
        rows = load_corpus(directory / _CORPUS_FILE)
        if len(rows) != meta["num_passages"] or len(rows) != index.scores["num_docs"]:
            raise ValueError(f"{directory}: corpus has {len(rows)} passages, the index "
                             f"{index.scores['num_docs']} documents; the saved index is incomplete")
        tokenizer = Tokenizer(stemmer=stemmer)
        tokenizer.load_vocab(directory)
        tokenizer.load_stopwords(directory)
        source = cls.__new__(cls)
        source._setup(name or meta["name"], rows, tokenizer, index, stemmed=meta["stemmed"])
        return source


#: Above this ``k``, :func:`_kth_largest` partitions instead of stepping down the distinct scores.
_STEP_DOWN_MAX_K = 8


def _kth_largest(values: np.ndarray, k: int) -> float:
    """The ``k``-th largest of ``values``, repeats counted (``1 <= k <= len(values)``).

    A query's scores take few distinct values when common terms match most passages (a passage matching
    only "population" scores by its length alone), and ``np.partition`` degenerates on such repeats where
    stepping down the distinct values from the top stays fast (figures in ``benchmarks/RESULTS.md``).
    Each step is one pass, and there are at most ``k`` steps, so a large ``k`` partitions.
    """
    if k > _STEP_DOWN_MAX_K:
        return float(np.partition(values, values.size - k)[values.size - k])
    threshold = values.max()
    while np.count_nonzero(values >= threshold) < k:
        threshold = values[values < threshold].max()
    return float(threshold)
