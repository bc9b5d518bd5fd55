"""BM25Source's index build (``_fast_index``) against bm25s's own: the same tokenizer vocabulary in the same
order, the same score matrix to the bit, the same rankings, for every scoring and matrix backend it takes;
and sources built together with their union (``bm25_sources``) against sources built one by one."""
from __future__ import annotations

import bm25s
import numpy as np
import pytest
from bm25s.tokenization import Tokenizer

from search_env.sources import bm25 as bm25_module
from search_env.sources.bm25 import BM25Source, _fast_index, _fast_index_applies, bm25_sources
from search_env.synthetic import WorldConfig, generate_world

#: Documents bm25s treats specially: no words, stopwords only, one-letter words only, repeats, non-ASCII.
ODD = ["", "the of and is", "a b c", "zarbo zarbo zarbo works works", "Zürich straße ÉCOLE école", "studied studies study",
       "12 345 6789", "UPPER lower Upper"]


def light_stem(word: str) -> str:
    """A stemmer that maps several words to one stem (as the demo's ``data.bm25_stemmer: light`` does)."""
    for suffix, replacement in (("ies", "y"), ("ied", "y"), ("es", ""), ("ed", ""), ("s", "")):
        if word.endswith(suffix) and len(word) > len(suffix) + 2:
            return word[: -len(suffix)] + replacement
    return word


@pytest.fixture(scope="module")
def texts() -> list[str]:
    world = generate_world(seed=2, n_questions=0, config=WorldConfig(near_duplicate_rate=0.3, distractor_rate=0.5).scaled(3))
    rows = world.passages()
    return ODD[:3] + [f"{p['title']}\n{p['text']}" for p in rows] + ODD[3:]


def _reference(texts: list[str], stemmer, **options) -> tuple[Tokenizer, bm25s.BM25]:
    tokenizer = Tokenizer(stopwords="en", stemmer=stemmer)
    ids = tokenizer.tokenize(texts, update_vocab=True, return_as="ids", show_progress=False)
    index = bm25s.BM25(**options)
    index.index((ids, tokenizer.get_vocab_dict()), show_progress=False)
    return tokenizer, index


@pytest.mark.parametrize("stemmer", [light_stem, None], ids=["light-stem", "no-stemmer"])
@pytest.mark.parametrize("options", [{}, {"csc_backend": "scipy"}, {"method": "robertson", "idf_method": "robertson"},
                                     {"method": "atire", "idf_method": "atire", "k1": 1.2, "b": 0.6}],
                         ids=["default", "scipy", "robertson", "atire"])
def test_the_fast_build_is_bm25s_build(texts: list[str], stemmer, options: dict) -> None:
    tokenizer, index = _reference(texts, stemmer, **options)
    fast_tokenizer, fast = Tokenizer(stopwords="en", stemmer=stemmer), bm25s.BM25(**options)
    assert _fast_index_applies(fast) and bm25_module._split(fast_tokenizer, texts)[1] is None  # split as one text
    _fast_index(fast, fast_tokenizer, texts)
    for name in ("word_to_id", "word_to_stem", "stem_to_sid"):
        assert list(getattr(fast_tokenizer, name).items()) == list(getattr(tokenizer, name).items()), name
    assert fast.vocab_dict is fast_tokenizer.get_vocab_dict() and list(fast.vocab_dict.items()) == list(index.vocab_dict.items())
    assert fast.unique_token_ids_set == index.unique_token_ids_set and fast.nonoccurrence_array is index.nonoccurrence_array is None
    assert fast.scores["num_docs"] == index.scores["num_docs"] == len(texts)
    for key in ("data", "indices", "indptr"):
        assert fast.scores[key].dtype == index.scores[key].dtype, key
        assert fast.scores[key].tobytes() == index.scores[key].tobytes(), key
    queries = ["Where was born", "zarbo works", "population city", "the of", "", "studied at university", "zzzq"]
    ids = tokenizer.tokenize(queries, update_vocab=False, return_as="ids", show_progress=False)
    for query_ids in ids:
        assert np.array_equal(fast.get_scores_from_ids(query_ids), index.get_scores_from_ids(query_ids))


def test_a_document_holding_the_boundary_word_or_another_splitter_splits_document_by_document(texts: list[str]) -> None:
    odd = texts + [f"Boundary {bm25_module._BOUNDARY} here", bm25_module._BOUNDARY.upper()]
    for options in ({}, {"splitter": r"\w+"}, {"lower": False}):
        tokenizer = Tokenizer(stopwords="en", stemmer=light_stem, **options)
        ids = tokenizer.tokenize(odd, update_vocab=True, return_as="ids", show_progress=False)
        index = bm25s.BM25()
        index.index((ids, tokenizer.get_vocab_dict()), show_progress=False)
        fast_tokenizer, fast = Tokenizer(stopwords="en", stemmer=light_stem, **options), bm25s.BM25()
        assert bm25_module._split(fast_tokenizer, odd)[1] is not None  # document by document
        _fast_index(fast, fast_tokenizer, odd)
        assert list(fast_tokenizer.word_to_id.items()) == list(tokenizer.word_to_id.items()), options
        for key in ("data", "indices", "indptr"):
            assert fast.scores[key].tobytes() == index.scores[key].tobytes(), (options, key)


def test_a_scoring_with_a_non_occurrence_term_is_left_to_bm25s() -> None:
    assert not _fast_index_applies(bm25s.BM25(method="bm25+"))
    assert not _fast_index_applies(bm25s.BM25(method="bm25l"))


def test_sources_rank_as_sources_built_by_bm25s(texts: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    rows = [{"id": str(i), "title": "", "text": text} for i, text in enumerate(texts)]
    queries = ["Where was it born?", "Which company works", "population of the city", "the", "studied", "Zürich école"]
    fast = BM25Source(rows, name="all", stemmer=light_stem)
    monkeypatch.setattr(bm25_module, "_fast_index_applies", lambda index: False)
    slow = BM25Source(rows, name="all", stemmer=light_stem)
    assert fast.search(queries, 7) == slow.search(queries, 7)
    fast.save(tmp_path / "fast")
    slow.save(tmp_path / "slow")
    for name in sorted(p.name for p in (tmp_path / "slow").iterdir()):
        assert (tmp_path / "fast" / name).read_bytes() == (tmp_path / "slow" / name).read_bytes(), name


def _state(source: BM25Source) -> tuple:
    tokenizer, scores = source._tokenizer, source._index.scores
    return (source.name, source._rows, source._stemmed, list(tokenizer.word_to_id.items()), list(tokenizer.word_to_stem.items()),
            list(tokenizer.stem_to_sid.items()), list(source._index.vocab_dict.items()), scores["num_docs"],
            *((scores[key].dtype, scores[key].tobytes()) for key in ("data", "indices", "indptr")))


@pytest.mark.parametrize("stemmer", [light_stem, None], ids=["light-stem", "no-stemmer"])
def test_sources_built_together_are_the_sources_built_alone(stemmer, monkeypatch: pytest.MonkeyPatch) -> None:
    world = generate_world(seed=4, n_questions=0, config=WorldConfig(distractor_rate=0.5).scaled(2))
    lists = dict(world.sources)
    lists["odd"] = [{"id": f"odd{i}", "title": "", "text": text} for i, text in enumerate(ODD)]  # a part of odd documents
    together = bm25_sources(lists, union="all", stemmer=stemmer)
    assert list(together) == [*lists, "all"]
    alone = {name: BM25Source(rows, name=name, stemmer=stemmer) for name, rows in lists.items()}
    alone["all"] = BM25Source([row for rows in lists.values() for row in rows], name="all", stemmer=stemmer)
    states = {name: _state(source) for name, source in alone.items()}  # before any search adds to a tokenizer's cache
    assert {name: _state(source) for name, source in together.items()} == states
    queries = ["Where was it born?", "Which company works", "population of the city", "the", "studied", "Zürich école"]
    assert together["all"].search(queries, 5) == alone["all"].search(queries, 5)
    assert bm25_sources(lists, stemmer=stemmer).keys() == lists.keys()
    monkeypatch.setattr(bm25_module, "_fast_index_applies", lambda index: False)  # bm25s's own build, source by source
    assert {name: _state(source) for name, source in bm25_sources(lists, union="all", stemmer=stemmer).items()} == states
    with pytest.raises(ValueError, match="at least one passage"):
        bm25_sources({"wiki": []})
