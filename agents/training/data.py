"""The questions a run trains and evaluates on, with the sources they are searched in, from the ``data``
and ``eval`` groups of its config.

Synthetic data: a world of ``data.world_size`` questions from ``data.world_seed``; held out, questions of a
world from ``data.eval_world_seed`` (new names, so the policy must search). Real data: ``data.dataset``
over ``data.corpus``; held out, ``data.eval_dataset`` or else the dataset's last ``eval.questions``
questions (which training then does not see).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from search_env.data.example import QAExample
from search_env.sources.base import Source

if TYPE_CHECKING:
    from agents.training.config import DataConfig, TrainConfig

__all__ = ["Data", "QuestionOrder", "light_stem", "split_data", "synthetic_data"]

Data = tuple[list[QAExample], dict[str, Source]]
"""Questions and the named sources they are searched in."""

_SUFFIXES = (("ies", "y"), ("ied", "y"), ("es", ""), ("ed", ""), ("s", ""))


def light_stem(word: str) -> str:
    """Strip one plural or past-tense ending ("studied" -> "study", "works" -> "work", "publishes" ->
    "publish"), so that a question's verb finds the passage that states the fact: without it, BM25 ranks
    a person's passages equally for "Where did X study?" and the one that answers is not first."""
    for suffix, replacement in _SUFFIXES:
        if word.endswith(suffix) and len(word) > len(suffix) + 2:
            return word[: -len(suffix)] + replacement
    return word


def split_data(config: TrainConfig) -> tuple[Data, Data | None]:
    """Training questions with their sources, and held-out questions with theirs (``None``: no
    evaluation). Dataset files are read before any corpus is indexed, so a bad dataset fails at once."""
    data, n_eval = config.data, config.eval.questions
    if data.dataset == "synthetic":
        train = synthetic_data(data, data.world_seed, data.world_size)
        if n_eval <= 0:
            return train, None
        # With by_hops, eval.questions counts each hop count: draw enough for the rarest.
        size = 4 * n_eval * data.world_max_hops if config.eval.by_hops else n_eval
        held_out_from = data.world_seed if data.eval_new_words else None
        return train, synthetic_data(data, data.eval_world_seed, size, held_out_from=held_out_from)
    from search_env.data.loaders import load_dataset

    examples = load_dataset(data.dataset)
    held_out = load_dataset(data.eval_dataset, limit=n_eval) if data.eval_dataset is not None and n_eval > 0 else None
    if held_out is None and n_eval > 0 and len(examples) <= n_eval:
        raise ValueError(f"dataset {data.dataset!r} has {len(examples)} questions: too few to hold out eval.questions={n_eval}")
    sources = {"wiki": _corpus_source(config)}
    if n_eval <= 0:
        return (examples, sources), None
    if held_out is not None:
        return (examples, sources), (held_out, sources)
    return (examples[:-n_eval], sources), (examples[-n_eval:], sources)


def synthetic_data(data: DataConfig, seed: int, size: int, *, held_out_from: int | None = None) -> Data:
    """A synthetic world's questions and a BM25 source per world source, plus ``"all"`` over every
    passage, as the environment's default world has. ``held_out_from``: the seed of a world made with
    the same settings whose invented words this one must not use."""
    from search_env.sources.bm25 import BM25Source
    from search_env.synthetic import WorldConfig, generate_world

    options: dict = {"max_hops": data.world_max_hops, "stem_tokens": data.world_stem_tokens}
    if data.world_chain_only:
        options.update(comparison_fraction=0.0, yes_no_fraction=0.0)
    elif data.world_max_hops < 2:  # comparison questions take two lookups: a 1-hop world has none
        options["comparison_fraction"] = 0.0
    world_config = WorldConfig(**options).scaled(data.world_scale)
    if held_out_from is not None:
        trained_on = generate_world(seed=held_out_from, n_questions=0, config=world_config)  # names do not depend on questions
        world_config = replace(world_config, excluded_stems=trained_on.invented_words())
    world = generate_world(seed=seed, n_questions=size, config=world_config)
    stemmer = light_stem if data.bm25_stemmer == "light" else None
    sources: dict[str, Source] = {name: BM25Source(passages, name=name, stemmer=stemmer)
                                  for name, passages in world.sources.items()}
    sources["all"] = BM25Source(world.passages(), name="all", stemmer=stemmer)
    return list(world.questions), sources


def _corpus_source(config: TrainConfig) -> Source:
    """The corpus as one source named ``wiki`` (where the NL-DAG protocols' tool names point): indexed
    here, or searched on the retrieval servers of ``data.retrieval_url``."""
    from search_env.console import progress_enabled

    if config.data.retrieval_url is not None:
        from search_env.sources.remote import RemoteSource

        return RemoteSource([url.strip() for url in config.data.retrieval_url.split(",")], name="wiki")
    corpus = config.data.corpus
    if not Path(corpus).is_file():
        raise FileNotFoundError(f"corpus file not found: {corpus}")
    if config.data.retriever == "bm25":
        from search_env.sources.bm25 import BM25Source

        return BM25Source(corpus, name="wiki")
    from search_env.sources.dense import DenseSource

    return DenseSource(corpus, index_dir=Path(config.run.output_dir) / "dense-index", name="wiki",
                       show_progress=progress_enabled(config.run.progress))


class QuestionOrder:
    """The questions of each step: the dataset in a seeded random order, reshuffled every epoch.

    The position (epoch, offset) is all the state there is, so a checkpoint stores two ints.
    """

    def __init__(self, size: int, seed: int) -> None:
        if size < 1:
            raise ValueError("the training set is empty")
        self.size, self.seed = size, seed
        self.epoch, self.offset = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.size)

    def take(self, k: int) -> list[int]:
        """The next ``k`` question indices (crossing into the next epoch's order when needed)."""
        out: list[int] = []
        while len(out) < k:
            if self.offset == self.size:
                self.epoch, self.offset = self.epoch + 1, 0
                self._order = self._permutation()
            n = min(k - len(out), self.size - self.offset)
            out += self._order[self.offset : self.offset + n].tolist()
            self.offset += n
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self._order = self._permutation()
