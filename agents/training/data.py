"""The questions a run trains and evaluates on, with the sources they are searched in, from the ``data``
and ``eval`` groups of its config.

Synthetic data: a world of ``data.world_size`` questions from ``data.world_seed``; held out, questions of a
world from ``data.eval_world_seed`` (new names, so the policy must search). Real data: ``data.dataset``
over ``data.corpus``; held out, ``data.eval_dataset`` or else the dataset's last ``eval.questions``
questions (which training then does not see).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from search_env.data.example import QAExample
from search_env.sources.base import Source

if TYPE_CHECKING:
    from agents.training.config import DataConfig, TrainConfig
    from search_env.synthetic import SyntheticWorld

__all__ = ["Data", "QuestionOrder", "RunData", "answerable", "build_data", "data_settings", "light_stem", "split_data", "synthetic_data",
           "synthetic_world", "world_sources"]

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
        world = synthetic_world(data, data.world_seed, data.world_size)
        train = list(world.questions), world_sources(world, data)
        if n_eval <= 0:
            return train, None
        # With by_hops, eval.questions counts each hop count: draw enough for the rarest.
        size = 4 * n_eval * data.world_max_hops if config.eval.by_hops else n_eval
        # the trained world's words, from the world itself (its names do not depend on its questions)
        excluded = world.invented_words() if data.eval_new_words else frozenset()
        del world  # its passages live on in the sources; the rest can go before the next world is made
        held_out = synthetic_world(data, data.eval_world_seed, size, excluded_stems=excluded)
        return train, (list(held_out.questions), world_sources(held_out, data))
    from search_env.data.loaders import load_dataset

    examples = load_dataset(data.dataset)
    held_out = load_dataset(data.eval_dataset, limit=n_eval) if data.eval_dataset is not None and n_eval > 0 else None
    if held_out is None and n_eval > 0 and len(examples) <= n_eval:
        raise ValueError(f"dataset {data.dataset!r} has {len(examples)} questions: too few to hold out eval.questions={n_eval}")
    sources = {"wiki": _corpus_source(config)}
    if held_out is None and n_eval > 0:
        examples, held_out = examples[:-n_eval], examples[-n_eval:]
    if data.answerable_at is not None:
        examples = answerable(examples, sources["wiki"], data.answerable_at)
    if n_eval <= 0:
        return (examples, sources), None
    return (examples, sources), (held_out, sources)


def answerable(examples: list[QAExample], source: Source, k: int) -> list[QAExample]:
    """The ``examples`` whose gold answer (SQuAD-normalised, as the EM reward compares it) is in the first
    ``k`` passages ``source`` returns for the question itself. Raises ``ValueError`` when none is."""
    from rewards.metrics import answer_in_text

    results = source.search([example.question for example in examples], k)
    kept = [example for example, passages in zip(examples, results)
            if answer_in_text(" ".join(f"{p.title} {p.text}" for p in passages), example.golden_answers)]
    if not kept:
        raise ValueError(f"no training question has its gold answer in the first {k} passages it retrieves (data.answerable_at)")
    return kept


@dataclass
class RunData:
    """What :func:`split_data` builds for a config, kept to build several trainers on: pass it to
    :func:`agents.training.build.build_trainer` as ``data=`` and the world, its indexes and the held-out
    world are built once, not per trainer.

    Attributes:
        train: the training questions and their sources.
        held_out: the held-out questions and theirs (``None``: built for a config without evaluation).
        settings: the config values it was built from (:func:`data_settings`).

    Every trainer built on it shares its sources: ``Trainer.close_environments`` closes them for all of
    them, so close them once (:meth:`close`) after the last trainer is done.
    """

    train: Data
    held_out: Data | None
    settings: dict[str, Any]

    def check(self, config: TrainConfig) -> None:
        """Raise ``ValueError`` (one line, naming the settings that differ) unless ``config`` asks for
        this data: the same ``data`` group and, when ``config`` evaluates, the same held-out questions
        (``eval.questions`` and ``eval.by_hops``). A config without evaluation takes data built with it."""
        wanted = data_settings(config)
        if config.eval.questions <= 0:
            wanted = {k: v for k, v in wanted.items() if not k.startswith("eval.")}
        differ = [key for key, value in wanted.items() if self.settings.get(key) != value]
        if differ:
            raise ValueError("the pre-built data was made for another config: "
                             + ", ".join(f"{key} is {self.settings.get(key)!r} there, {wanted[key]!r} here" for key in differ))

    def for_config(self, config: TrainConfig) -> tuple[Data, Data | None]:
        """:func:`split_data`'s result for ``config``, which :meth:`check` accepts (held-out questions
        only when it evaluates)."""
        self.check(config)
        return self.train, self.held_out if config.eval.questions > 0 else None

    def close(self) -> None:
        """Close every distinct source (training and held-out) once."""
        sources = [*self.train[1].values(), *(self.held_out[1].values() if self.held_out is not None else ())]
        for source in {id(s): s for s in sources}.values():
            source.close()


def build_data(config: TrainConfig) -> RunData:
    """:func:`split_data` for ``config``, kept with the settings it was built from."""
    train, held_out = split_data(config)
    return RunData(train, held_out, data_settings(config))


def data_settings(config: TrainConfig) -> dict[str, Any]:
    """The config values :func:`split_data` builds from: the ``data`` group, ``eval.questions`` and
    ``eval.by_hops`` (how many held-out questions), as ``{"group.field": value}``."""
    return {**{f"data.{name}": value for name, value in asdict(config.data).items()},
            "eval.questions": config.eval.questions, "eval.by_hops": config.eval.by_hops}


def synthetic_data(data: DataConfig, seed: int, size: int, *, held_out_from: int | None = None) -> Data:
    """A synthetic world's questions and a BM25 source per world source, plus ``"all"`` over every
    passage, as the environment's default world has. ``held_out_from``: the seed of a world made with
    the same settings whose invented words this one must not use."""
    excluded: frozenset[str] = frozenset()
    if held_out_from is not None:
        excluded = synthetic_world(data, held_out_from, 0).invented_words()  # names do not depend on questions
    world = synthetic_world(data, seed, size, excluded_stems=excluded)
    return list(world.questions), world_sources(world, data)


def synthetic_world(data: DataConfig, seed: int, size: int, *, excluded_stems: frozenset[str] = frozenset()) -> SyntheticWorld:
    """The synthetic world of ``seed`` with ``size`` questions, as ``data``'s ``world_*`` settings make it,
    using none of ``excluded_stems`` (invented words, e.g. another world's)."""
    from search_env.synthetic import WorldConfig, generate_world

    options: dict = {"max_hops": data.world_max_hops, "stem_tokens": data.world_stem_tokens}
    if data.world_chain_only:
        options.update(comparison_fraction=0.0, yes_no_fraction=0.0)
    elif data.world_max_hops < 2:  # comparison questions take two lookups: a 1-hop world has none
        options["comparison_fraction"] = 0.0
    world_config = replace(WorldConfig(**options).scaled(data.world_scale), excluded_stems=excluded_stems)
    return generate_world(seed=seed, n_questions=size, config=world_config)


def world_sources(world: SyntheticWorld, data: DataConfig) -> dict[str, Source]:
    """A BM25 source per source of ``world``, plus ``"all"`` over every passage (``world.passages()``), with
    ``data.bm25_stemmer``; each passage is tokenised once for both of the indexes that hold it."""
    from search_env.sources.bm25 import bm25_sources

    stemmer = light_stem if data.bm25_stemmer == "light" else None
    return dict(bm25_sources(world.sources, union="all", stemmer=stemmer))


def _corpus_source(config: TrainConfig) -> Source:
    """The corpus as one source named ``wiki`` (where the NL-DAG protocols' tool names point): indexed
    here by the retriever ``data.retriever`` names (an index it keeps goes to ``<run.output_dir>/<retriever>-index``),
    or searched on the retrieval servers of ``data.retrieval_url``."""
    from search_env.console import progress_enabled
    from search_env.sources.registry import SourceOptions, build_source

    if config.data.retrieval_url is not None:
        from search_env.sources.remote import RemoteSource

        return RemoteSource([url.strip() for url in config.data.retrieval_url.split(",")], name="wiki")
    corpus = config.data.corpus
    if not Path(corpus).is_file():
        raise FileNotFoundError(f"corpus file not found: {corpus}")
    retriever = config.data.retriever
    options = SourceOptions(name="wiki", index_dir=Path(config.run.output_dir) / f"{retriever}-index",
                            show_progress=progress_enabled(config.run.progress))
    return build_source(retriever, corpus, options)


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
