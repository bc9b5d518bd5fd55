"""Dataset loaders and corpus reading: real files in ../shared/data, Search-R1 parquet written here in
its real layout, name resolution, and clear errors for malformed rows."""
from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest

from search_env.data.corpus import load_corpus, split_wiki18_contents
from search_env.data.example import QAExample, SubQuestion
from search_env.data.loaders import (
    load_dataset,
    load_flashrag_jsonl,
    load_searchr1_parquet,
    parse_musique_decomposition,
)
from tests.conftest import skip_without

# Row counts from ../shared/data/README.md.
README_ROWS = {
    "hotpotqa_dev": 439, "2wikimultihopqa_dev": 152, "musique_dev": 222, "popqa_1000": 767,
    "bamboogle_test": 125, "nq_test": 3610, "triviaqa_test": 11313,
    "hotpotqa_train_sample": 100, "musique_train_sample": 100,
}
WITH_CONTEXTS = ["hotpotqa_dev", "2wikimultihopqa_dev", "musique_dev", "popqa_1000",
                 "hotpotqa_train_sample", "musique_train_sample"]
PLACEHOLDER = re.compile(r"\{([A-Z])\}")


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def corpus_ids(shared_data) -> set[str]:
    return {p["id"] for p in load_corpus(shared_data / "corpus.jsonl")}


@pytest.mark.parametrize("name", sorted(README_ROWS))
def test_row_counts_match_readme(shared_data, name) -> None:
    examples = load_dataset(name, data_dir=shared_data)
    assert len(examples) == README_ROWS[name]
    assert all(isinstance(e, QAExample) and e.question.strip() and e.golden_answers for e in examples)
    assert len({e.id for e in examples}) == len(examples)


def test_corpus_size_and_wiki18_sample(shared_data, corpus_ids) -> None:
    assert len(corpus_ids) == 13778
    sample = load_corpus(shared_data / "wiki18_sample.jsonl")
    assert len(sample) == 10 and all(p["title"] and p["text"] for p in sample)


@pytest.mark.parametrize("name", WITH_CONTEXTS)
def test_gold_passages_exist_in_corpus(shared_data, corpus_ids, name) -> None:
    examples = load_dataset(name, data_dir=shared_data)
    assert all(e.gold_passage_ids for e in examples)
    assert all(set(e.gold_passage_ids) <= corpus_ids for e in examples)
    if name.startswith("hotpotqa"):
        assert all(len(e.gold_passage_ids) == 2 for e in examples)  # "10 paragraphs, 2 gold"


@pytest.mark.parametrize("name", ["musique_dev", "musique_train_sample"])
def test_musique_decompositions_are_resolved_dags(shared_data, name) -> None:
    examples = load_dataset(name, data_dir=shared_data)
    hops = set()
    for example in examples:
        steps = example.decomposition
        hops.add(len(steps))
        labels = [s.label for s in steps]
        assert labels == [chr(ord("A") + i) for i in range(len(steps))]
        for position, step in enumerate(steps):
            assert not re.search(r"#\d", step.query)  # every "#n" became a placeholder
            assert sorted(set(PLACEHOLDER.findall(step.query))) == step.parents
            assert all(labels.index(p) < position for p in step.parents)  # parents come first: acyclic
        assert steps[-1].answer in example.golden_answers
        assert any(s.parents for s in steps)  # a multi-hop question chains at least once
        assert len(example.gold_passage_ids) == len(steps)
    assert hops >= {2, 3, 4}


def test_no_decomposition_outside_musique(shared_data) -> None:
    assert all(not e.decomposition for e in load_dataset("hotpotqa_dev", data_dir=shared_data))


# ---------------------------------------------------------------- FlashRAG jsonl


ROWS = [
    {"id": f"q{i}", "question": f"question {i}?", "golden_answers": [f"answer {i}"], "metadata": {"n": i}}
    for i in range(20)
]


def test_flashrag_fields(tmp_path) -> None:
    row = {
        "id": "x1", "question": "Who?", "golden_answers": ["A", "B"], "metadata": {"type": "bridge"},
        "contexts": [
            {"title": "t1", "text": "a", "is_supporting": True, "corpus_id": "c1"},
            {"title": "t2", "text": "b", "is_supporting": False, "corpus_id": "c2"},
            {"title": "t3", "text": "c", "is_supporting": True, "corpus_id": "c3"},
            {"title": "t1", "text": "a", "is_supporting": True, "corpus_id": "c1"},
        ],
    }
    [example] = load_flashrag_jsonl(write_jsonl(tmp_path / "d.jsonl", [row]))
    assert example.id == "x1" and example.question == "Who?" and example.golden_answers == ["A", "B"]
    assert example.gold_passage_ids == ["c1", "c3"]
    assert example.metadata["type"] == "bridge" and example.metadata["contexts"] == row["contexts"]
    assert example.decomposition == []


def test_musique_decomposition_parsing() -> None:
    steps = [
        {"question": "Green >> performer", "answer": "Steve Hillage"},
        {"question": "Scion >> owned by", "answer": "Toyota"},
        {"question": "When did #2 , #1 and #2 meet?", "answer": "1981"},
    ]
    assert parse_musique_decomposition(steps, "here") == [
        SubQuestion(label="A", query="Green >> performer", answer="Steve Hillage", parents=[]),
        SubQuestion(label="B", query="Scion >> owned by", answer="Toyota", parents=[]),
        SubQuestion(label="C", query="When did {B} , {A} and {B} meet?", answer="1981", parents=["A", "B"]),
    ]
    with pytest.raises(ValueError, match="step 2 refers to #2"):
        parse_musique_decomposition([{"question": "x", "answer": "y"}, {"question": "#2 z", "answer": "w"}], "here")


def test_limit_and_seeded_shuffle(tmp_path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    assert [e.id for e in load_flashrag_jsonl(path, limit=3)] == ["q0", "q1", "q2"]
    assert load_flashrag_jsonl(path, limit=0) == []
    first = [e.id for e in load_flashrag_jsonl(path, shuffle=True, seed=1)]
    assert first == [e.id for e in load_flashrag_jsonl(path, shuffle=True, seed=1)]
    assert first != [e.id for e in load_flashrag_jsonl(path, shuffle=True, seed=2)]
    assert sorted(first) == sorted(r["id"] for r in ROWS) and first != [r["id"] for r in ROWS]
    assert [e.id for e in load_flashrag_jsonl(path, shuffle=True, seed=1, limit=5)] == first[:5]
    with pytest.raises(ValueError, match="limit"):
        load_flashrag_jsonl(path, limit=-1)


@pytest.mark.parametrize("bad_row, message", [
    ("{not json", "invalid JSON"),
    ('["a", "list"]', "expected a JSON object"),
    ({"id": "z", "golden_answers": ["a"]}, "'question'"),
    ({"id": "z", "question": "q?"}, "'golden_answers'"),
    ({"id": "z", "question": "q?", "golden_answers": []}, "golden_answers"),
    ({"id": "z", "question": "q?", "golden_answers": ["a"], "contexts": "nope"}, "contexts"),
    ({"id": "z", "question": "q?", "golden_answers": ["a"],
      "metadata": {"question_decomposition": [{"question": "#3 x", "answer": "a"}]}}, "refers to #3"),
])
def test_malformed_rows_name_file_and_line(tmp_path, bad_row, message) -> None:
    path = write_jsonl(tmp_path / "broken.jsonl", [ROWS[0], "", bad_row])
    with pytest.raises(ValueError, match=message) as info:
        load_flashrag_jsonl(path)
    assert "broken.jsonl:3" in str(info.value)


def test_invalid_utf8_names_file_and_line(tmp_path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(ROWS[0]).encode() + b"\n" + '{"id": "z", "question": "caf\u00e9?"}'.encode("latin-1") + b"\n")
    with pytest.raises(ValueError, match=r"latin1\.jsonl:2: invalid UTF-8 at byte 29"):
        load_flashrag_jsonl(path)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(b'{"id": "1", "text": "ok"}\n{"id": "2", "text": "\xff"}\n')
    with pytest.raises(ValueError, match=r"corpus\.jsonl:2: invalid UTF-8"):
        load_corpus(corpus)


def test_wrong_field_types_name_the_field(tmp_path) -> None:
    path = write_jsonl(tmp_path / "typed.jsonl", [{"id": "z", "question": 42, "golden_answers": ["a"]}])
    with pytest.raises(ValueError, match=r"typed\.jsonl:1: 'question' must be a string, got int"):
        load_flashrag_jsonl(path)


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_an_empty_file_says_which_file(tmp_path, content: str) -> None:
    dataset, corpus = tmp_path / "empty.jsonl", tmp_path / "empty_corpus.jsonl"
    dataset.write_text(content)
    corpus.write_text(content)
    with pytest.raises(ValueError, match=r"empty\.jsonl: the dataset file has no examples"):
        load_flashrag_jsonl(dataset)
    with pytest.raises(ValueError, match=r"empty_corpus\.jsonl: the corpus file has no passages"):
        load_corpus(corpus)
    assert load_flashrag_jsonl(dataset, limit=0) == []  # nothing asked, nothing read


# ---------------------------------------------------------------- Search-R1 parquet

SEARCH_R1_PREFIX = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: "
)


def search_r1_row(data_source: str, split: str, index: int, question: str, answers: list[str],
                  keep_flashrag_columns: bool) -> dict:
    """One row as Search-R1's scripts/data_process/*_search.py write it (datasets.map keeps the
    FlashRAG columns id/question/golden_answers next to the new ones)."""
    question = question.strip() if question.strip().endswith("?") else question.strip() + "?"
    row = {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": SEARCH_R1_PREFIX + question + "\n"}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
        "extra_info": {"split": split, "index": index},
    }
    if keep_flashrag_columns:
        row.update({"id": f"{split}_{index}", "question": question, "golden_answers": answers})
    return row


def write_parquet(path: Path, rows: list[dict]) -> Path:
    skip_without("data", "pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_searchr1_parquet_with_flashrag_columns(tmp_path) -> None:
    rows = [search_r1_row("nq", "test", 0, "who wrote hamlet", ["Shakespeare"], True),
            search_r1_row("triviaqa", "test", 0, "Capital of France?", ["Paris", "paris"], True)]
    examples = load_searchr1_parquet(write_parquet(tmp_path / "test.parquet", rows))
    assert [e.id for e in examples] == ["nq:test_0", "triviaqa:test_0"]  # merged files repeat FlashRAG ids
    assert [e.question for e in examples] == ["who wrote hamlet?", "Capital of France?"]
    assert [e.golden_answers for e in examples] == [["Shakespeare"], ["Paris", "paris"]]
    assert examples[0].metadata["data_source"] == "nq" and examples[0].metadata["ability"] == "fact-reasoning"
    assert examples[0].metadata["extra_info"] == {"split": "test", "index": 0}
    assert examples[0].metadata["prompt"][0]["content"].startswith("Answer the given question.")


def test_searchr1_parquet_question_from_prompt_and_answers_from_target(tmp_path) -> None:
    rows = [search_r1_row("hotpotqa", "train", i, f"question number {i}", [f"a{i}"], False) for i in range(5)]
    path = write_parquet(tmp_path / "train.parquet", rows)
    examples = load_searchr1_parquet(path)
    assert [e.question for e in examples] == [f"question number {i}?" for i in range(5)]
    assert [e.golden_answers for e in examples] == [[f"a{i}"] for i in range(5)]
    assert [e.id for e in examples] == [f"hotpotqa:train_{i}" for i in range(5)]
    assert [e.id for e in load_searchr1_parquet(path, limit=2)] == ["hotpotqa:train_0", "hotpotqa:train_1"]
    shuffled = [e.id for e in load_searchr1_parquet(path, shuffle=True, seed=3)]
    assert sorted(shuffled) == sorted(e.id for e in examples)


def test_searchr1_parquet_bad_row_names_row(tmp_path) -> None:
    good = search_r1_row("nq", "test", 0, "q one", ["a"], False)
    bad = dict(good, prompt=[{"role": "user", "content": "no marker here"}])
    with pytest.raises(ValueError, match=r"bad\.parquet: row 1: .*Question"):
        load_searchr1_parquet(write_parquet(tmp_path / "bad.parquet", [good, bad]))


@pytest.mark.parametrize("column, value, message", [
    ("question", 7, "'question' must be a string, got int"),
    ("extra_info", "train", "'extra_info' must be a struct, got str"),
    ("reward_model", "rule", "'reward_model' must be a struct, got str"),
    ("prompt", "Question: who?", "'prompt' must be a list of messages, got str"),
    ("golden_answers", 3, "'golden_answers' must be a non-empty list of strings"),
    ("metadata", "none", "'metadata' must be a struct, got str"),
])
def test_searchr1_parquet_wrong_column_types_name_row_and_column(tmp_path, column: str, value, message: str) -> None:
    good = search_r1_row("nq", "test", 0, "q one", ["a"], False)
    bad = dict(good, **{column: value})
    if column == "prompt":
        bad.pop("question", None)
    with pytest.raises(ValueError, match=rf"typed\.parquet: row 0: {re.escape(message)}"):
        load_searchr1_parquet(write_parquet(tmp_path / "typed.parquet", [bad]))


def test_corrupt_parquet_names_the_file_and_rows(tmp_path) -> None:
    skip_without("data", "pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 this is not a parquet file")
    with pytest.raises(ValueError, match=r"garbage\.parquet: not a readable parquet file"):
        load_searchr1_parquet(garbage)
    path = tmp_path / "damaged.parquet"
    rows = [{"question": f"question {i}?", "golden_answers": ["a"]} for i in range(3000)]
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=1024)
    third = pq.ParquetFile(path).metadata.row_group(2).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    data[third : third + 64] = b"\xff" * 64  # the third row group's page header
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"damaged\.parquet: rows from 2048 on cannot be read"):
        load_searchr1_parquet(path)


def test_empty_parquet_says_which_file(tmp_path) -> None:
    skip_without("data", "pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "none.parquet"
    pq.write_table(pa.table({"question": pa.array([], pa.string()), "golden_answers": pa.array([], pa.list_(pa.string()))}), path)
    with pytest.raises(ValueError, match=r"none\.parquet: the dataset file has no examples"):
        load_searchr1_parquet(path)


# ---------------------------------------------------------------- load_dataset dispatch and corpora


def test_load_dataset_dispatch(tmp_path, monkeypatch) -> None:
    write_jsonl(tmp_path / "mini.jsonl", ROWS[:4])
    write_parquet(tmp_path / "searchr1.parquet", [search_r1_row("nq", "test", 0, "q", ["a"], True)])
    assert len(load_dataset(tmp_path / "mini.jsonl")) == 4
    assert len(load_dataset("mini", data_dir=tmp_path, limit=2)) == 2
    assert load_dataset("searchr1", data_dir=tmp_path)[0].id == "nq:test_0"
    monkeypatch.setenv("SEARCHQA_DATA", str(tmp_path))
    assert [e.id for e in load_dataset("mini")] == ["q0", "q1", "q2", "q3"]
    with pytest.raises(FileNotFoundError, match="available: mini, searchr1"):
        load_dataset("missing")
    monkeypatch.delenv("SEARCHQA_DATA")
    with pytest.raises(FileNotFoundError, match="SEARCHQA_DATA"):
        load_dataset("mini")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unknown dataset format"):
        load_dataset(tmp_path / "data.csv")
    with pytest.raises(TypeError, match="world_options"):
        load_dataset("mini", data_dir=tmp_path, world_options={"seed": 1})


def test_load_dataset_synthetic_calls_generate_world(monkeypatch) -> None:
    calls = []
    questions = [QAExample(id=f"s{i}", question=f"q{i}?", golden_answers=["x"]) for i in range(6)]

    def generate_world(**kwargs):
        calls.append(kwargs)
        return types.SimpleNamespace(questions=questions)

    monkeypatch.setitem(sys.modules, "search_env.synthetic", types.SimpleNamespace(generate_world=generate_world))
    assert load_dataset("synthetic", world_options={"seed": 5, "n_questions": 6}, limit=4) == questions[:4]
    assert calls == [{"seed": 5, "n_questions": 6}]


def test_load_dataset_synthetic_real_world() -> None:
    examples = load_dataset("synthetic", world_options={"seed": 0, "n_questions": 20})
    assert len(examples) == 20 and all(isinstance(e, QAExample) and e.golden_answers for e in examples)
    assert [e.id for e in examples] == [e.id for e in load_dataset("synthetic", world_options={"seed": 0, "n_questions": 20})]


def test_load_corpus_both_formats_and_errors(tmp_path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [
        {"id": 7, "title": "T", "text": "body"},
        {"id": "w1", "contents": '"Some Title"\nfirst line\nsecond line'},
        {"id": "w2", "contents": "no title line"},
        {"id": "n", "text": "untitled"},
    ])
    assert load_corpus(path) == [
        {"id": "7", "title": "T", "text": "body"},
        {"id": "w1", "title": "Some Title", "text": "first line\nsecond line"},
        {"id": "w2", "title": "", "text": "no title line"},
        {"id": "n", "title": "", "text": "untitled"},
    ]
    assert split_wiki18_contents('"A "quoted" name"\nx') == ('A "quoted" name', "x")
    write_jsonl(tmp_path / "bad.jsonl", [{"id": "1", "text": "ok"}, {"title": "no id", "text": "x"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: passage has no 'id'"):
        load_corpus(tmp_path / "bad.jsonl")
    write_jsonl(tmp_path / "bad2.jsonl", [{"id": "1", "body": "x"}])
    with pytest.raises(ValueError, match=r"bad2\.jsonl:1: .*'text'"):
        load_corpus(tmp_path / "bad2.jsonl")
    with pytest.raises(FileNotFoundError):
        load_corpus(tmp_path / "absent.jsonl")
