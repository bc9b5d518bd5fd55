"""The questions of a run: datasets by short name or path, and the synthetic world.

The seven QA sets of the search-agent papers have short names (:data:`DATASET_FILES`) that resolve to
their FlashRAG jsonl files in a data folder: ``--data-dir``, else ``$SEARCHQA_DATA`` (the folder
:func:`search_env.data.load_dataset` reads names from), else ``shared/data`` beside the repository.
A split's name, ``SET@SPLIT`` (``nq@held-out``; :mod:`search_env.data.splits`), asks that part of
the fixed split of the same files, in its hash order. Any other path is loaded as it is. A run takes the
first ``--episodes`` questions of each set, in file order, so a resumed or repeated run asks the same
questions; the table says which subset it was.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from search_env.data.example import QAExample
from search_env.data.loaders import DATA_DIR_ENV, load_dataset
from search_env.data.splits import default_data_dir, is_split_name

__all__ = ["DATASET_FILES", "SYNTHETIC", "WORLD_SEED", "Dataset", "default_data_dir", "load_datasets", "resolve_dataset_path"]

#: Short dataset names and their files in the data folder.
DATASET_FILES = {
    "nq": "nq_test.jsonl", "triviaqa": "triviaqa_test.jsonl", "popqa": "popqa_1000.jsonl", "hotpotqa": "hotpotqa_dev.jsonl",
    "2wiki": "2wikimultihopqa_dev.jsonl", "musique": "musique_dev.jsonl", "bamboogle": "bamboogle_test.jsonl",
}
#: The built-in world's name, and its seed and size (the environment's defaults).
SYNTHETIC = "synthetic"
WORLD_SEED = 0
WORLD_SIZE = 1000


@dataclass
class Dataset:
    """The questions a run asks of one dataset.

    Attributes:
        name: as the table shows it: a short name, ``synthetic``, or the path as given.
        path: the file, or None for the synthetic world and a split.
        examples: the questions asked (the first ``--episodes`` of the file).
        total: the questions the file holds.
        world: the synthetic world (whose own sources answer its questions), else None.
    """

    name: str
    path: Path | None
    examples: list[QAExample]
    total: int
    world: Any = None

    @property
    def subset(self) -> str:
        """Which questions were asked, for the table: ``all 125`` or ``first 100 of 439``."""
        n = len(self.examples)
        return f"all {n}" if n == self.total else f"first {n} of {self.total}"


def resolve_dataset_path(spec: str, data_dir: Path | None = None) -> Path:
    """The file of a short name (:data:`DATASET_FILES`) in ``data_dir`` (default :func:`default_data_dir`),
    or ``spec`` itself as a path. Raises ``FileNotFoundError`` in one line naming what was looked for."""
    if spec in DATASET_FILES:
        folder = data_dir if data_dir is not None else default_data_dir()
        path = folder / DATASET_FILES[spec]
        if not path.is_file():
            raise FileNotFoundError(f"dataset {spec!r} is {path}, which does not exist: give --data-dir (or ${DATA_DIR_ENV}) "
                                    "the folder holding it")
        return path
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"no dataset file {spec!r}: give a path, {SYNTHETIC!r} or a short name ({', '.join(DATASET_FILES)})")
    return path


def load_datasets(specs: list[str], limit: int, data_dir: Path | None = None) -> list[Dataset]:
    """The first ``limit`` questions of each dataset named in ``specs`` (see :func:`resolve_dataset_path`)."""
    datasets = []
    for spec in dict.fromkeys(specs):
        if spec == SYNTHETIC:
            from search_env.synthetic import generate_world

            world = generate_world(seed=WORLD_SEED, n_questions=WORLD_SIZE)
            questions = list(world.questions)
            datasets.append(Dataset(SYNTHETIC, None, questions[:limit], len(questions), world))
        elif is_split_name(spec):  # a part of the fixed split, e.g. nq@held-out (in hash order)
            examples = load_dataset(spec, data_dir=data_dir if data_dir is not None else default_data_dir())
            datasets.append(Dataset(spec, None, examples[:limit], len(examples)))
        else:
            path = resolve_dataset_path(spec, data_dir)
            examples = load_dataset(path)
            datasets.append(Dataset(spec, path, examples[:limit], len(examples)))
    return datasets
