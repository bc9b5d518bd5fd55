"""The fixed split of the real QA sets: the rule recomputed independently on small files written here, its
names through load_dataset, and the real files' split (no question in two parts)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from search_env.data import load_dataset
from search_env.data.splits import (
    ALL_SETS, HELD_OUT, HELD_OUT_SETS, SETS, TRAIN_CAP, VALIDATION, is_split_name, load_split, split_key,
)


def _write(folder: Path, stem: str, n: int) -> list[str]:
    ids = [f"{stem}_{i}" for i in range(n)]
    rows = [{"id": i, "question": f"question {i}?", "golden_answers": [f"answer {i}"]} for i in ids]
    (folder / f"{stem}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return ids


def _by_hash(stem: str, ids: list[str]) -> list[str]:
    return sorted(ids, key=lambda i: hashlib.sha256(f"{stem}:{i}".encode()).hexdigest())


@pytest.fixture()
def small_data(tmp_path: Path) -> dict[str, list[str]]:
    """Every set's file, with 130 questions each (a split set then has 10 training questions)."""
    return {name: _write(tmp_path, set_file.stem, 130) for name, set_file in SETS.items()}


def test_split_sets_hold_out_the_first_by_hash_then_validation_then_train(tmp_path, small_data):
    stem = SETS["nq"].stem
    order = _by_hash(stem, small_data["nq"])
    assert [e.id for e in load_split("nq@held-out", tmp_path)] == order[:HELD_OUT]
    assert [e.id for e in load_split("nq@validation", tmp_path)] == order[HELD_OUT:HELD_OUT + VALIDATION]
    assert [e.id for e in load_split("nq@train", tmp_path)] == order[HELD_OUT + VALIDATION:]


def test_held_out_sets_are_all_held_out_and_train_samples_never(tmp_path, small_data):
    assert sorted(e.id for e in load_split("bamboogle@held-out", tmp_path)) == sorted(small_data["bamboogle"])
    assert load_split("bamboogle@train", tmp_path) == [] and load_split("musique@validation", tmp_path) == []
    order = _by_hash(SETS["hotpotqa-train"].stem, small_data["hotpotqa-train"])
    assert load_split("hotpotqa-train@held-out", tmp_path) == []
    assert [e.id for e in load_split("hotpotqa-train@validation", tmp_path)] == order[:VALIDATION]
    assert [e.id for e in load_split("hotpotqa-train@train", tmp_path)] == order[VALIDATION:]


def test_every_question_is_in_exactly_one_part(tmp_path, small_data):
    parts = {split: [e.id for e in load_split(f"{ALL_SETS}@{split}", tmp_path)] for split in ("train", "validation", "held-out")}
    seen = [i for ids in parts.values() for i in ids]
    assert len(seen) == len(set(seen)) == sum(len(ids) for ids in small_data.values())


def test_all_sets_interleave_held_out_questions_so_a_prefix_covers_every_set(tmp_path, small_data):
    first = load_dataset(f"{ALL_SETS}@held-out", data_dir=tmp_path, limit=len(HELD_OUT_SETS))
    sets_seen = {e.id.rsplit("_", 1)[0] for e in first}
    assert sets_seen == {SETS[name].stem for name in HELD_OUT_SETS}


def test_training_side_is_capped_per_set(tmp_path):
    ids = _write(tmp_path, SETS["triviaqa"].stem, HELD_OUT + VALIDATION + TRAIN_CAP + 7)
    train = load_split("triviaqa@train", tmp_path)
    assert len(train) == TRAIN_CAP
    assert [e.id for e in train] == _by_hash(SETS["triviaqa"].stem, ids)[HELD_OUT + VALIDATION:HELD_OUT + VALIDATION + TRAIN_CAP]


def test_split_names_and_their_errors(tmp_path):
    assert is_split_name("nq@held-out") and is_split_name("real-qa@train")
    assert not is_split_name("nq") and not is_split_name("nq@test") and not is_split_name("squad@train")
    with pytest.raises(ValueError, match="unknown split 'nq@test'"):
        load_split("nq@test", tmp_path)
    with pytest.raises(FileNotFoundError, match="nq_test.jsonl"):
        load_split("nq@train", tmp_path)
    assert split_key("nq_test", "nq_test_0") == hashlib.sha256(b"nq_test:nq_test_0").hexdigest()


def test_repeated_ids_are_refused(tmp_path):
    row = json.dumps({"id": "same", "question": "q?", "golden_answers": ["a"]})
    (tmp_path / f"{SETS['popqa'].stem}.jsonl").write_text(f"{row}\n{row}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="ids repeat"):
        load_split("popqa@train", tmp_path)


def test_the_real_files_split_with_at_least_100_held_out_questions_per_set(shared_data):
    folder = shared_data
    for name in HELD_OUT_SETS:
        held = load_dataset(f"{name}@held-out", data_dir=folder)
        assert len(held) >= 100, name
        train_ids = {e.id for e in load_dataset(f"{name}@train", data_dir=folder)}
        assert not train_ids & {e.id for e in held}, name
    train = load_dataset(f"{ALL_SETS}@train", data_dir=folder)
    held_out = {e.id for e in load_dataset(f"{ALL_SETS}@held-out", data_dir=folder)}
    assert train and not {e.id for e in train} & held_out
