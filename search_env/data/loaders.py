"""Dataset loaders: every supported format becomes a list of :class:`QAExample`.

Formats:

- FlashRAG-style JSON lines (``{id, question, golden_answers, metadata, contexts}``), the format of
  the benchmark files in ``../shared/data``; gold passages come from the supporting contexts'
  ``corpus_id`` and MuSiQue's ``metadata.question_decomposition`` becomes a gold decomposition;
- Search-R1-style parquet, as its ``scripts/data_process`` scripts write it (``data_source``,
  ``prompt``, ``ability``, ``reward_model.ground_truth.target``, ``extra_info``, plus the FlashRAG
  columns that ``datasets.map`` keeps);
- ``"synthetic"``: the questions of the built-in synthetic world;
- ``"SET@SPLIT"``: a part of the fixed split of the real QA sets (:mod:`search_env.data.splits`).

Malformed rows raise ``ValueError`` naming the file and the line (jsonl) or row (parquet): text that
is not UTF-8, fields of the wrong type, a parquet file that cannot be read. A file without any
example is an error too, naming the file.
"""
from __future__ import annotations

import itertools
import os
import random
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from search_env.data.corpus import iter_jsonl
from search_env._optional import requires_extra
from search_env.data.example import QAExample, SubQuestion
from search_env.data.splits import is_split_name, load_split

#: Environment variable naming the folder that dataset names (``"hotpotqa_dev"``) resolve against.
DATA_DIR_ENV = "SEARCHQA_DATA"

_PARENT_REFERENCE = re.compile(r"#(\d+)")
_FORMATS = {".jsonl": "flashrag", ".parquet": "searchr1"}


def load_dataset(
    name_or_path: str | Path,
    *,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    world_options: Mapping[str, Any] | None = None,
) -> list[QAExample]:
    """Load examples by file path, by dataset name, or ``"synthetic"``.

    A path ending in ``.jsonl`` is read as FlashRAG jsonl, ``.parquet`` as Search-R1 parquet. A bare
    name (``"hotpotqa_dev"``, ``"nq_search/test"``) is looked up as ``<name>.jsonl`` or
    ``<name>.parquet`` in ``data_dir`` or, when that is not given, in ``$SEARCHQA_DATA``.
    ``"synthetic"`` returns ``generate_world(**world_options).questions``. ``"SET@SPLIT"``
    (``"nq@held-out"``, ``"real-qa@train"``) is a part of the fixed split of the real QA sets
    (:mod:`search_env.data.splits`), read from ``data_dir``, else ``$SEARCHQA_DATA``, else
    ``shared/data`` beside the repository. ``shuffle`` (seeded by
    ``seed``) happens before ``limit``, so ``limit`` with ``shuffle`` is a random subset.
    """
    if str(name_or_path) == "synthetic":
        from search_env.synthetic import generate_world  # imported here: the world is optional

        world = generate_world(**dict(world_options or {}))
        return _select(iter(world.questions), limit=limit, shuffle=shuffle, seed=seed)
    if world_options is not None:
        raise TypeError("world_options only applies to load_dataset('synthetic')")
    if is_split_name(str(name_or_path)) and not Path(name_or_path).is_file():
        return _select(iter(load_split(str(name_or_path), data_dir)), limit=limit, shuffle=shuffle, seed=seed)
    path = _resolve(name_or_path, data_dir)
    fmt = _FORMATS.get(path.suffix)
    if fmt == "flashrag":
        return load_flashrag_jsonl(path, limit=limit, shuffle=shuffle, seed=seed)
    if fmt == "searchr1":
        return load_searchr1_parquet(path, limit=limit, shuffle=shuffle, seed=seed)
    raise ValueError(f"{path}: unknown dataset format {path.suffix!r}; expected one of {sorted(_FORMATS)}")


def load_flashrag_jsonl(path: str | Path, *, limit: int | None = None, shuffle: bool = False,
                        seed: int = 0) -> list[QAExample]:
    """Read FlashRAG-style jsonl rows into examples.

    ``gold_passage_ids`` are the ``corpus_id`` of contexts flagged ``is_supporting`` (first-seen
    order, no repeats); the contexts themselves are kept in ``metadata["contexts"]``. Rows with
    ``metadata.question_decomposition`` (MuSiQue) get a gold decomposition, see
    :func:`parse_musique_decomposition`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    examples = (_flashrag_example(row, f"{path}:{line}", f"{path.stem}-{line}") for line, row in iter_jsonl(path))
    return _select(_not_empty(examples, path), limit=limit, shuffle=shuffle, seed=seed)


def load_searchr1_parquet(path: str | Path, *, limit: int | None = None, shuffle: bool = False,
                          seed: int = 0) -> list[QAExample]:
    """Read a Search-R1 training/evaluation parquet file into examples.

    The question is the ``question`` column when present, else the text after the last
    ``"Question: "`` of the user prompt; the answers are ``golden_answers`` when present, else
    ``reward_model.ground_truth.target``. Ids are ``"<data_source>:<id>"`` (or
    ``"<data_source>:<split>_<index>"``), because merged Search-R1 files repeat FlashRAG ids across
    data sources. ``prompt``, ``data_source``, ``ability`` and ``extra_info`` go to ``metadata``.
    """
    with requires_extra("data", "reading parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"{path}: not a readable parquet file ({error})") from None

    def examples() -> Iterator[QAExample]:
        number = 0
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as error:
                raise ValueError(f"{path}: rows from {number} on cannot be read ({error})") from None
            if batch is None:
                return
            for row in batch.to_pylist():
                yield _searchr1_example(row, f"{path}: row {number}", number)
                number += 1

    return _select(_not_empty(examples(), path), limit=limit, shuffle=shuffle, seed=seed)


def parse_musique_decomposition(steps: list[Mapping[str, Any]], where: str) -> list[SubQuestion]:
    """Turn MuSiQue's ``question_decomposition`` into labelled sub-questions.

    Step ``i`` gets label ``"A"``, ``"B"``, … in order; a reference ``#n`` in a step's question (the
    answer of step ``n``) becomes the placeholder ``{X}`` for step ``n``'s label and makes that step a
    parent. References must point to earlier steps, so the result is a DAG in topological order.
    """
    if len(steps) > 26:
        raise ValueError(f"{where}: {len(steps)} decomposition steps; labels only go up to 'Z'")
    labels = [chr(ord("A") + i) for i in range(len(steps))]
    decomposition = []
    for i, step in enumerate(steps):
        question, answer = step.get("question"), step.get("answer")
        if not isinstance(question, str) or not isinstance(answer, str):
            raise ValueError(f"{where}: decomposition step {i + 1} needs string 'question' and 'answer'")
        parents: list[str] = []

        def placeholder(match: re.Match[str], step_number: int = i + 1) -> str:
            referenced = int(match.group(1))
            if not 1 <= referenced < step_number:
                raise ValueError(f"{where}: decomposition step {step_number} refers to #{referenced}, "
                                 f"which is not an earlier step")
            label = labels[referenced - 1]
            if label not in parents:
                parents.append(label)
            return "{" + label + "}"

        query = _PARENT_REFERENCE.sub(placeholder, question)
        decomposition.append(SubQuestion(label=labels[i], query=query, answer=answer,
                                         parents=sorted(parents)))
    return decomposition


def _resolve(name_or_path: str | Path, data_dir: str | Path | None) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    folder = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV)
    if folder is None:
        raise FileNotFoundError(f"no file {str(name_or_path)!r}; to load a dataset by name pass data_dir= "
                                f"or set ${DATA_DIR_ENV} to the folder holding <name>.jsonl/.parquet")
    folder = Path(folder)
    candidates = [folder / path] if path.suffix in _FORMATS else [folder / f"{path}{ext}" for ext in _FORMATS]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    available = sorted(p.stem for p in folder.glob("*") if p.suffix in _FORMATS) if folder.is_dir() else []
    raise FileNotFoundError(f"dataset {str(name_or_path)!r} not found in {folder} (looked for "
                            f"{', '.join(c.name for c in candidates)}); available: {', '.join(available) or 'none'}")


def _not_empty(examples: Iterator[QAExample], path: Path) -> Iterator[QAExample]:
    """``examples``, raising ValueError naming ``path`` if there are none (read lazily, so that
    ``limit`` still stops reading early)."""
    empty = True
    for example in examples:
        empty = False
        yield example
    if empty:
        raise ValueError(f"{path}: the dataset file has no examples")


def _select(examples: Iterator[QAExample], *, limit: int | None, shuffle: bool, seed: int) -> list[QAExample]:
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if not shuffle:
        return list(itertools.islice(examples, limit))
    selected = list(examples)
    random.Random(seed).shuffle(selected)
    return selected if limit is None else selected[:limit]


def _answers(value: Any, where: str, field: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise ValueError(f"{where}: '{field}' must be a non-empty list of strings, got {value!r}")


def _typed(row: Mapping[str, Any], key: str, kind: type, where: str, what: str) -> Any:
    """``row[key]`` when absent, None or of type ``kind``; else a ValueError naming the field and type."""
    value = row.get(key)
    if value is not None and not isinstance(value, kind):
        raise ValueError(f"{where}: '{key}' must be {what}, got {type(value).__name__}")
    return value


def _flashrag_example(row: dict[str, Any], where: str, fallback_id: str) -> QAExample:
    question = _typed(row, "question", str, where, "a string")
    if question is None or not question.strip():
        raise ValueError(f"{where}: missing or empty 'question'")
    if "golden_answers" not in row:
        raise ValueError(f"{where}: missing 'golden_answers'")
    answers = _answers(row["golden_answers"], where, "golden_answers")
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ValueError(f"{where}: 'metadata' must be an object")
    contexts = row.get("contexts") or []
    if not isinstance(contexts, list) or not all(isinstance(c, dict) for c in contexts):
        raise ValueError(f"{where}: 'contexts' must be a list of objects")
    gold_ids: list[str] = []
    for context in contexts:
        corpus_id = context.get("corpus_id")
        if context.get("is_supporting") and corpus_id is not None and str(corpus_id) not in gold_ids:
            gold_ids.append(str(corpus_id))
    steps = metadata.get("question_decomposition")
    if steps is not None and not (isinstance(steps, list) and all(isinstance(s, dict) for s in steps)):
        raise ValueError(f"{where}: 'metadata.question_decomposition' must be a list of objects")
    decomposition = parse_musique_decomposition(steps, where) if steps else []
    if contexts:
        metadata = {**metadata, "contexts": contexts}
    row_id = row.get("id")
    return QAExample(id=str(row_id) if row_id is not None else fallback_id, question=question,
                     golden_answers=answers, gold_passage_ids=gold_ids, decomposition=decomposition,
                     metadata=metadata)


def _searchr1_example(row: dict[str, Any], where: str, number: int) -> QAExample:
    extra_info = _typed(row, "extra_info", dict, where, "a struct") or {}
    question = _typed(row, "question", str, where, "a string")
    if question is None or not question.strip():
        question = _question_from_prompt(_typed(row, "prompt", list, where, "a list of messages"), where)
    if row.get("golden_answers") is not None:
        answers = _answers(row["golden_answers"], where, "golden_answers")
    else:
        reward_model = _typed(row, "reward_model", dict, where, "a struct") or {}
        ground_truth = _typed(reward_model, "ground_truth", dict, where, "a struct") or {}
        if ground_truth.get("target") is None:
            raise ValueError(f"{where}: no 'golden_answers' column and no reward_model.ground_truth.target")
        answers = _answers(ground_truth["target"], where, "reward_model.ground_truth.target")
    if row.get("id") is not None:
        local_id = str(row["id"])
    elif "index" in extra_info:
        local_id = f"{extra_info.get('split', 'row')}_{extra_info['index']}"
    else:
        local_id = f"row_{number}"
    data_source = row.get("data_source")
    metadata = dict(_typed(row, "metadata", dict, where, "a struct") or {})
    metadata.update({key: row[key] for key in ("data_source", "ability", "prompt") if row.get(key) is not None})
    if extra_info:
        metadata["extra_info"] = extra_info
    return QAExample(id=f"{data_source}:{local_id}" if data_source else local_id, question=question.strip(),
                     golden_answers=answers, metadata=metadata)


def _question_from_prompt(prompt: Any, where: str) -> str:
    """The question of a Search-R1 prompt: what follows the last "Question: " of its last user turn."""
    messages = [m for m in prompt or [] if isinstance(m, dict) and m.get("role") == "user"]
    content = messages[-1].get("content") if messages else None
    if not isinstance(content, str) or "Question:" not in content:
        raise ValueError(f"{where}: no 'question' column and no 'Question: ...' in the user prompt")
    question = content.rpartition("Question:")[2].strip()
    if not question:
        raise ValueError(f"{where}: the user prompt's 'Question:' is empty")
    return question
