"""BM25 over a local passage corpus: the default source, needing no model and no network.

Tokenising and indexing use ``bm25s`` (its tokenizer, its Lucene-variant BM25 score matrix, its
save/load format). A corpus is indexed here, to the same vocabulary and the same scores, bit for bit, as
``bm25s`` indexes it, but for the whole corpus at once rather than document by document (several times
faster on a large one); :func:`bm25_sources` indexes several lists of passages and their union, tokenising
each passage once. The top-k selection is done here rather than by ``bm25s.BM25.retrieve``, for two
reasons: ``retrieve`` runs ``np.argpartition`` over the whole score vector, which degenerates on BM25's
mostly-zero vectors (several times slower than ranking only the matching passages; figures in
``benchmarks/RESULTS.md``), and its order among equal scores is not specified. Here a query ranks only
the passages that match at least one of its terms, ties go to the passage that comes first in the
corpus, and passages without a matching term are never returned — the behaviour of Lucene-style
engines, so a query of stopwords or unknown words gets no results.
"""
from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol, Union

import numpy as np

from search_env.data.corpus import load_corpus, passage_from_row
from search_env.sources.base import Passage, Source
from search_env.sources.bm25s_without_jax import import_bm25s

bm25s = import_bm25s()
Tokenizer = bm25s.tokenization.Tokenizer

try:  # the fast index build computes bm25s's scores with bm25s's own functions
    from bm25s import scoring as _scoring

    _scoring._select_idf_scorer, _scoring._select_tfc_scorer, bm25s.BM25._np_csc  # noqa: B018 - as in bm25s 0.3.16
except (ImportError, AttributeError):  # another layout: bm25s builds the index itself
    _scoring = None  # type: ignore[assignment]


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
            if not rows:
                raise ValueError("BM25Source needs at least one passage")
        else:
            rows = _passage_rows(passages)
        tokenizer = Tokenizer(stopwords=stopwords, stemmer=stemmer)
        texts = _texts(rows)
        index = bm25s.BM25(k1=k1, b=b)
        if _fast_index_applies(index):
            _fast_index(index, tokenizer, texts)
        else:
            token_ids = tokenizer.tokenize(texts, update_vocab=True, return_as="ids", show_progress=False)
            index.index((token_ids, tokenizer.get_vocab_dict()), show_progress=False)
        self._setup(name, rows, tokenizer, index, stemmed=stemmer is not None)

    @classmethod
    def _built(cls, name: str, rows: list[dict[str, str]], tokenizer: Tokenizer, index: bm25s.BM25, *,
               stemmed: bool) -> "BM25Source":
        """A source over ``rows`` with its tokenizer and index built already."""
        source = cls.__new__(cls)
        source._setup(name, rows, tokenizer, index, stemmed=stemmed)
        return source

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
        return cls._built(name or meta["name"], rows, tokenizer, index, stemmed=meta["stemmed"])


def _fast_index_applies(index: bm25s.BM25) -> bool:
    """Whether :func:`_fast_index` builds what ``bm25s`` would for ``index``: the ``bm25s`` functions and
    settings it reads are there, and the scoring has no non-occurrence term (the default, Lucene's, has
    none). ``tests/search_env/sources/test_bm25_fast_index.py`` compares the two builds."""
    settings = ("method", "idf_method", "csc_backend", "dtype", "int_dtype", "k1", "b", "delta", "_np_csc")
    return (_scoring is not None and all(hasattr(index, name) for name in settings)
            and index.method in ("robertson", "lucene", "atire") and index.csc_backend in ("scipy", "numpy"))


def _fast_index(index: bm25s.BM25, tokenizer: Tokenizer, texts: list[str]) -> _Tokens:
    """Tokenise ``texts`` with the fresh ``tokenizer`` and index them into ``index``: the tokenizer's
    vocabulary and the index's score matrix are exactly what ``tokenizer.tokenize(texts,
    update_vocab=True)`` and ``index.index((ids, tokenizer.get_vocab_dict()))`` make (the same dicts in
    the same order, the same float32 scores), several times faster on a large corpus: each distinct word
    is looked up, stopped and stemmed once, and the scores are computed for the whole corpus at once
    instead of document by document. ``tests/search_env/sources/test_bm25_fast_index.py`` holds the two
    side by side. Returns the documents' tokens (for :func:`bm25_sources`' union).
    """
    tokens = _tokenize(tokenizer, texts)
    _index_tokens(index, tokenizer.get_vocab_dict(), tokens)
    return tokens


class _Tokens(NamedTuple):
    """A tokenised corpus: token ``ids[i]`` is in document ``docs[i]`` (grouped by document, except that
    a document without tokens holds one ``""``, id 0, listed last); ``lengths[d]``: document d's tokens."""

    ids: np.ndarray
    docs: np.ndarray
    lengths: np.ndarray


def _tokenize(tokenizer: Tokenizer, texts: list[str]) -> _Tokens:
    """``tokenizer.tokenize(texts, update_vocab=True)`` of a fresh ``tokenizer`` (bm25s's
    ``streaming_tokenize`` with ``allow_empty``): the same vocabulary dicts, in the same order, and the
    same tokens per document (a document's order aside, which no score depends on)."""
    words, docs = _split(tokenizer, texts)  # docs None: the words hold _BOUNDARY between each two documents
    stopwords = set(tokenizer.stopwords) if tokenizer.stopwords is not None else set()
    stemmer = tokenizer.stemmer
    word_to_id, word_to_stem, stem_to_sid = tokenizer.word_to_id, tokenizer.word_to_stem, tokenizer.stem_to_sid
    word_to_id[""] = 0  # the empty token: a document without words (or with stopwords only) holds it alone
    if stemmer is not None:
        word_to_stem[""] = ""
        stem_to_sid[""] = 0
    # Ids are given in the order words first occur, as the stream gives them; stopwords get none (-1).
    ids_of: dict[str, int] = {_BOUNDARY: -2} if docs is None else {}
    for word in dict.fromkeys(words):
        if word in ids_of:
            continue
        if word in word_to_id:
            ids_of[word] = word_to_id[word]
        elif word in stopwords:
            ids_of[word] = -1
        elif stemmer is not None:
            stem = word_to_stem[word] = stemmer(word)
            ids_of[word] = word_to_id[word] = stem_to_sid.setdefault(stem, len(stem_to_sid))
        else:
            ids_of[word] = word_to_id[word] = len(word_to_id)
    ids = np.fromiter(map(ids_of.__getitem__, words), dtype=np.int64, count=len(words))
    if docs is None:
        ends = ids == -2
        docs = np.cumsum(ends) - ends  # a boundary goes with the document it ends (and is dropped next)
    kept = ids >= 0
    ids, docs = ids[kept], docs[kept]
    lengths = np.bincount(docs, minlength=len(texts))
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        ids, docs = np.concatenate([ids, np.zeros(empty.size, np.int64)]), np.concatenate([docs, empty])
        lengths[empty] = 1
    return _Tokens(ids, docs, lengths)


#: bm25s's default ``splitter`` pattern, and a word that marks where one document ends and the next begins
#: when the documents are split as one text (the pattern finds no word across the lines around it).
_DEFAULT_SPLITTER = r"(?u)\b\w\w+\b"
_BOUNDARY = "qzxjsearchqadocumentboundaryqzxj"


def _split(tokenizer: Tokenizer, texts: list[str]) -> tuple[list[str], np.ndarray | None]:
    """The words of ``texts`` as ``tokenizer`` splits each (lower-cased first when it lower-cases), one
    document after the other, and the document of each word. With bm25s's default splitter, which finds
    no word across a line break, the documents are split as one text (twice as fast), with a line of
    ``_BOUNDARY`` between each two: then the documents are ``None`` and the words hold those boundaries
    (unless a document holds that word, in which case each document is split on its own)."""
    lowered = list(map(str.lower, texts)) if tokenizer.lower else list(texts)
    splitter = tokenizer.splitter
    pattern = getattr(getattr(splitter, "__self__", None), "pattern", None)  # a compiled regex's findall
    if getattr(splitter, "__name__", None) == "findall" and pattern == _DEFAULT_SPLITTER:
        if _BOUNDARY not in "\n".join(lowered):
            return splitter(f"\n{_BOUNDARY}\n".join(lowered)), None
    words_of = list(map(splitter, lowered))
    n_words = np.fromiter(map(len, words_of), dtype=np.int64, count=len(texts))
    return list(itertools.chain.from_iterable(words_of)), np.repeat(np.arange(len(texts), dtype=np.int64), n_words)


def _index_tokens(index: bm25s.BM25, vocab: dict[str, int], tokens: _Tokens) -> None:
    """``index.index((ids, vocab))`` (bm25s's ``build_index_from_ids`` and the rest of ``index``) of a
    corpus tokenised as :func:`_tokenize` leaves it."""
    n_docs, n_vocab = len(tokens.lengths), len(vocab)
    doc_len = tokens.lengths
    avg_doc_len = doc_len.mean()
    pair, tf = np.unique(tokens.docs * n_vocab + tokens.ids, return_counts=True)  # (document, term) pairs
    pair_doc, pair_term = np.divmod(pair, n_vocab)
    doc_freq = np.bincount(pair_term, minlength=n_vocab)
    idf_of = _scoring._select_idf_scorer(index.idf_method)  # a Python float per document frequency, as bm25s
    freqs, freq_of_term = np.unique(doc_freq, return_inverse=True)
    idf_values = np.array([idf_of(df, N=n_docs) if df else 0.0 for df in freqs.tolist()], dtype=np.float64)
    idf = idf_values[freq_of_term.reshape(-1)].astype(index.dtype)  # rounded as bm25s's item assignment rounds
    # bm25s scores a document's terms as one array, with its length a Python int: the same call per
    # distinct (length, term frequency), which are few, gives the same numbers in the same dtype.
    tfc_of = _scoring._select_tfc_scorer(index.method)
    base = int(tf.max()) + 1
    combo, combo_of_pair = np.unique(doc_len[pair_doc] * base + tf, return_inverse=True)
    combo_len, combo_tf = np.divmod(combo, base)
    parts = []
    for length in np.unique(combo_len).tolist():
        tfs = combo_tf[combo_len == length].astype(index.dtype)
        parts.append(tfc_of(tf_array=tfs, l_d=int(length), l_avg=avg_doc_len, k1=index.k1, b=index.b, delta=index.delta))
    tfc = np.concatenate(parts)[combo_of_pair.reshape(-1)]  # combos are sorted by length, then frequency
    scores = np.empty(pair.size, dtype=index.dtype)
    scores[:] = idf[pair_term] * tfc
    rows, cols = pair_doc.astype(index.int_dtype), pair_term.astype(index.int_dtype)
    if index.csc_backend == "scipy":
        import scipy.sparse

        matrix = scipy.sparse.csc_matrix((scores, (rows, cols)), shape=(n_docs, n_vocab), dtype=index.dtype)
        data, indices, indptr = matrix.data, matrix.indices, matrix.indptr
    else:  # each (column, row) once: their order is the same from any order of the pairs
        data, indices, indptr = index._np_csc(data=scores, rows=rows, cols=cols, shape=(n_docs, n_vocab))
        data = data.astype(index.dtype)
    index.nonoccurrence_array = None
    index.scores = {"data": data, "indices": indices, "indptr": indptr, "num_docs": n_docs}
    index.vocab_dict = vocab
    index.unique_token_ids_set = set(vocab.values())


def _union_tokens(tokenizer: Tokenizer, parts: Sequence[tuple[Tokenizer, _Tokens]]) -> _Tokens:
    """Fill the fresh ``tokenizer`` as tokenising the parts' texts one after the other would, and return
    those texts' tokens, from the parts' own tokenizers (as :func:`_tokenize` left them) and tokens: a
    word's or stem's id is given where it first occurs, so the union's ids are the first part's, then each
    next part's new ones in that part's order."""
    word_to_id, word_to_stem, stem_to_sid = tokenizer.word_to_id, tokenizer.word_to_stem, tokenizer.stem_to_sid
    stemmed = tokenizer.stemmer is not None
    ids, docs, offset = [], [], 0
    for part, tokens in parts:
        if stemmed:
            for stem in part.stem_to_sid:
                stem_to_sid.setdefault(stem, len(stem_to_sid))
            for word, stem in part.word_to_stem.items():
                if word not in word_to_id:
                    word_to_stem[word] = stem
                    word_to_id[word] = stem_to_sid[stem]
            own = part.stem_to_sid
        else:
            for word in part.word_to_id:
                word_to_id.setdefault(word, len(word_to_id))
            own = part.word_to_id
        ids_here = np.empty(len(own), dtype=np.int64)  # the part's id -> the union's
        vocab = stem_to_sid if stemmed else word_to_id
        for key, i in own.items():
            ids_here[i] = vocab[key]
        ids.append(ids_here[tokens.ids])
        docs.append(tokens.docs + offset)
        offset += len(tokens.lengths)
    return _Tokens(np.concatenate(ids), np.concatenate(docs), np.concatenate([tokens.lengths for _, tokens in parts]))


def bm25_sources(
    passages: Mapping[str, Iterable[Mapping[str, Any]]],
    *,
    union: str | None = None,
    stemmer: StemmerLike | None = None,
    stopwords: str | list[str] = "en",
    k1: float = 1.5,
    b: float = 0.75,
) -> dict[str, BM25Source]:
    """A :class:`BM25Source` per named list of passages and, with ``union``, one more of that name over
    all of them, the lists one after the other (as a synthetic world's ``"all"``). Each is the source
    ``BM25Source(passages, name=..., ...)`` makes, and the union ``BM25Source(chain(*lists))``; but a
    passage is tokenised once, not once per source that holds it."""
    options = {"stemmer": stemmer, "stopwords": stopwords, "k1": k1, "b": b}
    if not _fast_index_applies(bm25s.BM25(k1=k1, b=b)):
        sources = {name: BM25Source(rows, name=name, **options) for name, rows in passages.items()}
        if union is not None:
            sources[union] = BM25Source(itertools.chain.from_iterable(s._rows for s in sources.values()), name=union, **options)
        return sources
    sources, parts = {}, []
    for name, given in passages.items():
        rows = _passage_rows(given)
        tokenizer, index = Tokenizer(stopwords=stopwords, stemmer=stemmer), bm25s.BM25(k1=k1, b=b)
        parts.append((tokenizer, _fast_index(index, tokenizer, _texts(rows))))
        sources[name] = BM25Source._built(name, rows, tokenizer, index, stemmed=stemmer is not None)
    if union is not None:
        tokenizer, index = Tokenizer(stopwords=stopwords, stemmer=stemmer), bm25s.BM25(k1=k1, b=b)
        _index_tokens(index, tokenizer.get_vocab_dict(), _union_tokens(tokenizer, parts))
        rows = [row for source in list(sources.values()) for row in source._rows]
        sources[union] = BM25Source._built(union, rows, tokenizer, index, stemmed=stemmer is not None)
    return sources


def _passage_rows(passages: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    rows = [passage_from_row(row, f"passage {i}") for i, row in enumerate(passages)]
    if not rows:
        raise ValueError("BM25Source needs at least one passage")
    return rows


def _texts(rows: list[dict[str, str]]) -> list[str]:
    """What is indexed of each passage: its title and its text."""
    return [f"{row['title']}\n{row['text']}" for row in rows]


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
