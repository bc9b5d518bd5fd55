"""A fixed train / validation / held-out split of the real QA sets, by a rule anyone can recompute.

The seven QA sets the search-agent papers evaluate on (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue,
Bamboogle) and the HotpotQA and MuSiQue train samples are split question by question, by a hash of the
file's name and the question's id, never by a random draw, so every run, machine and reader gets the same
split. The rule:

1. Each file's questions are ordered by ``sha256("<file stem>:<id>")`` (hex digest, ascending).
2. Its role decides the rest (:data:`SETS`):

   - ``held-out`` (HotpotQA dev, MuSiQue dev, Bamboogle): every question is held out;
   - ``split`` (NQ, TriviaQA, PopQA, 2Wiki): the first :data:`HELD_OUT` questions in that order are held
     out, the next :data:`VALIDATION` are the validation slice, and the rest are training questions (at most
     :data:`TRAIN_CAP`: the large sets would otherwise be nearly all of the training mix);
   - ``train`` (the HotpotQA and MuSiQue train samples): the first :data:`VALIDATION` are validation, the
     rest train.

Held-out questions are never trained on, warm start included, and nothing is tuned on them: settings are
chosen on the validation slice, which is drawn from the training side only.

A split is named ``SET@SPLIT``: ``nq@held-out`` (one set's held-out questions, in hash order, so the
first 100 are a fixed sample), or ``real-qa@train`` (every set's training questions). ``real-qa@held-out``
and ``real-qa@validation`` interleave the sets one question at a time, so their first ``n`` questions
cover every set nearly equally. :func:`search_env.data.load_dataset` reads these names, with the files in
``data_dir``, else ``$SEARCHQA_DATA``, else ``shared/data`` beside the repository.
"""
from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from search_env.data.example import QAExample

__all__ = ["ALL_SETS", "HELD_OUT", "HELD_OUT_SETS", "SETS", "SPLITS", "TRAIN_CAP", "VALIDATION", "SetFile",
           "default_data_dir", "is_split_name", "load_split", "split_key", "split_of"]

Split = Literal["train", "validation", "held-out"]
#: The splits a set can be read as.
SPLITS: tuple[str, ...] = ("train", "validation", "held-out")
#: Held-out questions taken from each ``split`` set.
HELD_OUT = 100
#: Validation questions taken from each set with a training side.
VALIDATION = 20
#: Most training questions taken from one set.
TRAIN_CAP = 1000
#: The name of every set together.
ALL_SETS = "real-qa"


@dataclass(frozen=True)
class SetFile:
    """One QA file and its role in the split.

    Attributes:
        stem: the file's name without ``.jsonl`` in the data folder.
        role: ``held-out``, ``split`` or ``train`` (see the module's rule).
    """

    stem: str
    role: Literal["held-out", "split", "train"]


#: Every set of the split by short name (the evaluation harness's names for the seven QA sets).
SETS: dict[str, SetFile] = {
    "nq": SetFile("nq_test", "split"),
    "triviaqa": SetFile("triviaqa_test", "split"),
    "popqa": SetFile("popqa_1000", "split"),
    "hotpotqa": SetFile("hotpotqa_dev", "held-out"),
    "2wiki": SetFile("2wikimultihopqa_dev", "split"),
    "musique": SetFile("musique_dev", "held-out"),
    "bamboogle": SetFile("bamboogle_test", "held-out"),
    "hotpotqa-train": SetFile("hotpotqa_train_sample", "train"),
    "musique-train": SetFile("musique_train_sample", "train"),
}
#: The seven sets with held-out questions, in the order the papers' tables list them.
HELD_OUT_SETS: tuple[str, ...] = ("nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle")


def split_key(stem: str, question_id: str) -> str:
    """The hash that orders a file's questions: ``sha256("<stem>:<id>")`` as hex."""
    return hashlib.sha256(f"{stem}:{question_id}".encode()).hexdigest()


def split_of(examples: list[QAExample], set_file: SetFile) -> dict[str, list[QAExample]]:
    """A file's questions divided by the rule: ``{"train": [...], "validation": [...], "held-out": [...]}``,
    each in hash order.

    Raises:
        ValueError: two questions of the file share an id (the hash would not tell them apart).
    """
    ids = [example.id for example in examples]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{set_file.stem}: question ids repeat, so the split's hash cannot order them")
    ordered = sorted(examples, key=lambda example: split_key(set_file.stem, example.id))
    if set_file.role == "held-out":
        return {"train": [], "validation": [], "held-out": ordered}
    held = HELD_OUT if set_file.role == "split" else 0
    return {"held-out": ordered[:held], "validation": ordered[held:held + VALIDATION],
            "train": ordered[held + VALIDATION:held + VALIDATION + TRAIN_CAP]}


def is_split_name(name: str) -> bool:
    """Whether ``name`` is a split's name (``SET@SPLIT``) rather than a file or dataset name."""
    base, at, split = str(name).rpartition("@")
    return bool(at) and split in SPLITS and (base in SETS or base == ALL_SETS)


def load_split(name: str, data_dir: str | Path | None = None) -> list[QAExample]:
    """The questions of ``SET@SPLIT`` (see the module's rule), read from the files in ``data_dir``.

    Raises:
        ValueError: ``name`` is not ``SET@SPLIT`` with a known set and split (one line, the known names).
        FileNotFoundError: a set's file is not in the data folder.
    """
    base, _, split = str(name).rpartition("@")
    if split not in SPLITS or (base not in SETS and base != ALL_SETS):
        raise ValueError(f"unknown split {name!r}: give SET@SPLIT with SET one of {ALL_SETS}, {', '.join(SETS)} "
                         f"and SPLIT one of {', '.join(SPLITS)}")
    folder = Path(data_dir) if data_dir is not None else default_data_dir()
    names = list(SETS) if base == ALL_SETS else [base]
    parts = [_read_split(folder, SETS[set_name], split) for set_name in names]
    if base != ALL_SETS or split == "train":
        return [example for part in parts for example in part]
    interleaved = itertools.zip_longest(*parts)
    return [example for row in interleaved for example in row if example is not None]


def _read_split(folder: Path, set_file: SetFile, split: str) -> list[QAExample]:
    from search_env.data.loaders import load_flashrag_jsonl

    path = folder / f"{set_file.stem}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"the split needs {path}, which does not exist: give the folder of the QA files "
                                f"(data_dir, or $SEARCHQA_DATA)")
    return split_of(load_flashrag_jsonl(path), set_file)[split]


def default_data_dir() -> Path:
    """``$SEARCHQA_DATA`` when set, else ``shared/data`` beside the repository (``../shared/data``)."""
    from search_env.data.loaders import DATA_DIR_ENV

    configured = os.environ.get(DATA_DIR_ENV)
    return Path(configured) if configured else Path(__file__).resolve().parents[3] / "shared" / "data"
