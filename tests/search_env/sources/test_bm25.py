"""BM25Source: ranking against bm25s's own exhaustive scores, edge-case queries, corpus formats,
save/load, and retrieval quality on the real corpus."""
from __future__ import annotations

import json
import random

import bm25s
import numpy as np
import pytest

from search_env.data.corpus import load_corpus
from search_env.sources.base import Passage, Source
from search_env.sources.bm25 import BM25Source, _kth_largest

PASSAGES = [
    {"id": "p0", "title": "Zarbo Corp", "text": "Zarbo Corp is a company founded by Mira Talen in Velbury."},
    {"id": "p1", "title": "Mira Talen", "text": "Mira Talen was born in Osk and studied at Drevin University."},
    {"id": "p2", "title": "Velbury", "text": "Velbury is a city in the country of Norrand."},
    {"id": "p3", "title": "Osk", "text": "Osk is a small town on the river Lume."},
    {"id": "p4", "title": "Drevin University", "text": "Drevin University was founded in 1821 in Velbury."},
]


@pytest.fixture(scope="module")
def small() -> BM25Source:
    return BM25Source(PASSAGES, name="wiki")


def reference_ranker(passages: list[dict]):
    """Rank with bm25s's own exhaustive retrieve (every document scored), then apply the documented
    contract: drop unmatched (score 0) passages, ties broken by corpus position, cut at k."""
    tokenizer = bm25s.tokenization.Tokenizer(stopwords="en")
    ids = tokenizer.tokenize([f"{p['title']}\n{p['text']}" for p in passages], update_vocab=True,
                             return_as="ids", show_progress=False)
    index = bm25s.BM25()
    index.index((ids, tokenizer.get_vocab_dict()), show_progress=False)

    def rank(query: str, k: int) -> list[tuple[str, float]]:
        query_ids = tokenizer.tokenize([query], update_vocab=False, return_as="ids", show_progress=False)
        docs, scores = index.retrieve(query_ids, k=len(passages), show_progress=False)
        ranked = sorted(((float(s), int(d)) for d, s in zip(docs[0], scores[0]) if s > 0),
                        key=lambda x: (-x[0], x[1]))
        return [(passages[d]["id"], s) for s, d in ranked[:k]]

    return rank


def test_is_a_source_and_finds_the_passage(small: BM25Source) -> None:
    assert isinstance(small, Source) and small.name == "wiki" and len(small) == len(PASSAGES)
    [hits] = small.search(["Who founded Zarbo Corp?"], 3)
    assert hits[0].id == "p0"
    assert hits[0] == Passage(id="p0", title="Zarbo Corp", text=PASSAGES[0]["text"], score=hits[0].score)
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))


def test_title_is_indexed(small: BM25Source) -> None:
    [hits] = small.search(["Lume"], 5)  # only in the text of p3
    assert [p.id for p in hits] == ["p3"]
    only_in_title = [{"id": "a", "title": "Quorvix", "text": "a word"}, {"id": "b", "title": "x", "text": "other"}]
    assert [p.id for p in BM25Source(only_in_title).search(["quorvix"], 5)[0]] == ["a"]


def test_batch_equals_single_queries(small: BM25Source) -> None:
    queries = ["Mira Talen birthplace", "Velbury", "university founded 1821", "river"]
    assert small.search(queries, 2) == [small.search([q], 2)[0] for q in queries]


def test_edge_case_queries_return_empty_without_raising(small: BM25Source) -> None:
    results = small.search(["", "   ", "the of and is", "qwxzy unknownword", "?!"], 3)
    assert results == [[], [], [], [], []]
    assert small.search([], 3) == []
    assert small.search(["Velbury"], 0) == [[]]


def test_k_larger_than_corpus_returns_every_matching_passage(small: BM25Source) -> None:
    [hits] = small.search(["Velbury"], 1000)
    assert sorted(p.id for p in hits) == ["p0", "p2", "p4"]


def test_bad_arguments_raise(small: BM25Source) -> None:
    with pytest.raises(TypeError):
        small.search("Velbury", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        small.search(["Velbury"], -1)
    with pytest.raises(ValueError, match="at least one passage"):
        BM25Source([])


def test_ranking_matches_bm25s_exhaustive_scores_with_ties_in_corpus_order() -> None:
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
    # A tiny vocabulary and repeated texts make many exact ties, including at the k cut-off.
    passages = [{"id": f"d{i}", "title": "", "text": " ".join(rng.choices(words, k=rng.randint(1, 4)))}
                for i in range(60)]
    passages += [dict(passages[3], id=f"copy{i}") for i in range(5)]
    source, reference = BM25Source(passages), reference_ranker(passages)
    for _ in range(40):
        query = " ".join(rng.sample(words, rng.randint(1, 3)))
        for k in (1, 3, 10, 100):
            got = [(p.id, p.score) for p in source.search([query], k)[0]]
            expected = reference(query, k)
            assert [i for i, _ in got] == [i for i, _ in expected], (query, k)
            assert [s for _, s in got] == pytest.approx([s for _, s in expected], rel=1e-6)
    assert source.search(["alpha beta"], 10) == source.search(["alpha beta"], 10)


@pytest.mark.parametrize("distinct", [1, 3, 1000])
def test_kth_largest_counts_repeats_like_a_full_sort(distinct: int) -> None:
    # Stepping down distinct values (small k) and partitioning (large k) both give the sorted order's k-th.
    rng = np.random.default_rng(distinct)
    for _ in range(30):
        values = rng.choice(rng.random(distinct).astype(np.float32), size=int(rng.integers(1, 400)))
        descending = np.sort(values)[::-1]
        for k in (1, 2, 3, 8, 9, 20, values.size):
            if k <= values.size:
                assert _kth_largest(values, k) == descending[k - 1], (distinct, k)


def test_wiki18_contents_format(tmp_path) -> None:
    path = tmp_path / "wiki18.jsonl"
    rows = [{"id": "1", "contents": '"Quorvix Abbey"\nA monastery on a hill.'},
            {"id": "2", "contents": '"Other"\nNothing to see here.'}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    [hits] = BM25Source(path).search(["Quorvix"], 2)
    assert [(p.id, p.title, p.text) for p in hits] == [("1", "Quorvix Abbey", "A monastery on a hill.")]


def test_malformed_corpus_row_names_file_and_line(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "1", "title": "t", "text": "fine"}\n{"id": "2", "title": "t"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        BM25Source(path)


def test_save_load_round_trip_without_reindexing(small: BM25Source, tmp_path, monkeypatch) -> None:
    small.save(tmp_path / "index")

    def no_indexing(*args, **kwargs):
        raise AssertionError("load() must not re-index")

    monkeypatch.setattr(bm25s.BM25, "index", no_indexing)
    loaded = BM25Source.load(tmp_path / "index")
    queries = ["Mira Talen", "Velbury founded", "", "the", "Norrand country city"]
    assert loaded.name == "wiki" and len(loaded) == len(small)
    assert loaded.search(queries, 4) == small.search(queries, 4)
    assert BM25Source.load(tmp_path / "index", name="other").name == "other"
    with pytest.raises(FileNotFoundError, match="not a saved BM25Source"):
        BM25Source.load(tmp_path)


def strip_s(word: str) -> str:
    return word[:-1] if word.endswith("s") else word


def test_stemmer_is_used_and_required_on_load(tmp_path) -> None:
    passages = [{"id": "a", "title": "", "text": "two cats sleep"}, {"id": "b", "title": "", "text": "a dog barks"}]
    assert BM25Source(passages).search(["cat"], 2) == [[]]
    stemmed = BM25Source(passages, stemmer=strip_s)
    assert [p.id for p in stemmed.search(["cat"], 2)[0]] == ["a"]
    stemmed.save(tmp_path)
    with pytest.raises(ValueError, match="stemmer"):
        BM25Source.load(tmp_path)
    assert BM25Source.load(tmp_path, stemmer=strip_s).search(["cat", "dogs"], 2) == stemmed.search(["cat", "dogs"], 2)


def test_source_over_synthetic_world() -> None:
    from search_env.synthetic import generate_world

    world = generate_world(seed=0)
    for name, passages in world.sources.items():
        source = BM25Source(passages, name=name)
        title = passages[0]["title"]
        assert passages[0]["id"] in [p.id for p in source.search([title], 10)[0]]


@pytest.fixture(scope="module")
def corpus_source(shared_data) -> BM25Source:
    return BM25Source(shared_data / "corpus.jsonl", name="wiki")


def test_hotpotqa_gold_found_at_top10(corpus_source: BM25Source, shared_data) -> None:
    rows = [json.loads(line) for line in (shared_data / "hotpotqa_dev.jsonl").open(encoding="utf-8")]
    sample = random.Random(0).sample(rows, 150)
    results = corpus_source.search([r["question"] for r in sample], 10)
    found = sum(
        bool({c["corpus_id"] for c in r["contexts"] if c["is_supporting"]} & {p.id for p in hits})
        for r, hits in zip(sample, results)
    )
    # The data README reports 0.99 on all 439 questions; a sample of 150 stays well above 0.9.
    assert found / len(sample) >= 0.9


def test_real_corpus_save_load_identical(corpus_source: BM25Source, shared_data, tmp_path) -> None:
    corpus_source.save(tmp_path)
    loaded = BM25Source.load(tmp_path)
    assert len(loaded) == len(load_corpus(shared_data / "corpus.jsonl"))
    questions = [json.loads(line)["question"] for line in (shared_data / "musique_dev.jsonl").open(encoding="utf-8")]
    assert loaded.search(questions[:60], 10) == corpus_source.search(questions[:60], 10)
