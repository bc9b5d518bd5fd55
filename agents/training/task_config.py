"""The task a run trains on: the questions and what they are searched in (:class:`DataConfig`), and the
environment every episode runs in (:class:`EnvConfig`). Groups of :class:`~agents.training.config.TrainConfig`
(``--data.FIELD``, ``--env.FIELD``), kept apart from the groups that say how the run trains."""
from __future__ import annotations

from dataclasses import dataclass

from agents.training.config_fields import check_positive
from rewards.name_registry import UnknownNameError
from search_env.sources.registry import SOURCES

__all__ = ["DataConfig", "EnvConfig"]


@dataclass
class DataConfig:
    """The questions trained and evaluated on, and what they are searched in.

    Attributes:
        dataset: ``"synthetic"`` (the built-in world) or a FlashRAG jsonl / Search-R1 parquet path.
        corpus: the passages a real dataset is searched in: a ``{id, title, text}`` jsonl.
        retriever: how ``corpus`` is searched: ``bm25``, ``dense`` (an encoder and faiss index over it) or a
            retriever a module registered (:func:`search_env.sources.register_source`; ``--import MODULE``).
        retrieval_url: search a retrieval server (``python -m search_env.server``) instead of indexing
            ``corpus`` here: its URL, or the URLs of several replicas of it, comma-separated
            (:class:`~search_env.sources.remote.RemoteSource` spreads the searches over them and skips
            one that fails). Every rank of a data-parallel run, on every machine, searches the same
            servers.
        eval_dataset: held-out questions of a real dataset (default: its last ``eval.questions`` questions).
        answerable_at: train only on the real questions whose gold answer is in the first ``answerable_at``
            passages the question itself retrieves (``None``: every question). A small pretrained model
            whose cold start taught it to search the question and copy the answer gets a reward on those
            alone, so a group of its answers to any other question is all wrong and teaches nothing.
            Held-out questions are never filtered.
        world_seed: seed of the synthetic world trained on.
        world_size: questions of the synthetic world trained on.
        world_max_hops: most lookups a synthetic question takes (1: single-hop questions only).
        world_scale: entities of the synthetic worlds (trained on and held out), as a multiple of the
            default world's: in a larger world names repeat less, so a small model cannot fit its
            demonstrations by memorising names instead of copying them.
        world_chain_only: only chain questions (1 to ``world_max_hops`` lookups); no comparison or yes/no
            questions, which need reasoning over two results.
        world_stem_tokens: the invented words of names take exactly this many tokens of the built-in
            tokenizer (``None``: any number). Names a small model copies more exactly.
        eval_world_seed: seed of the held-out synthetic world (names are new, so the policy must search).
        eval_new_words: the held-out world uses none of the trained world's invented words (worlds of
            few-token words otherwise share some).
        bm25_stemmer: ``None`` or ``"light"``: strip one plural or past-tense ending before indexing and
            searching the synthetic world, so that a question's verb finds the passage stating the fact.
    """

    dataset: str = "synthetic"
    corpus: str | None = None
    retriever: str = "bm25"
    retrieval_url: str | None = None
    eval_dataset: str | None = None
    answerable_at: int | None = None
    world_seed: int = 0
    world_size: int = 1000
    world_max_hops: int = 2
    world_scale: int = 1
    world_chain_only: bool = False
    world_stem_tokens: int | None = None
    eval_world_seed: int = 1
    eval_new_words: bool = False
    bm25_stemmer: str | None = None

    def __post_init__(self) -> None:
        check_positive("data", self, "world_size", "world_max_hops", "world_scale", "world_stem_tokens", "answerable_at")
        if not SOURCES.has(self.retriever):
            raise UnknownNameError("data.retriever", self.retriever, SOURCES.names())
        if self.bm25_stemmer not in (None, "light"):
            raise ValueError(f"unknown data.bm25_stemmer {self.bm25_stemmer!r}; known: light (or null: none)")
        synthetic = self.dataset == "synthetic"
        if synthetic and self.corpus is not None:
            raise ValueError("data.corpus is for a real data.dataset; the synthetic world brings its own passages")
        if synthetic and self.eval_dataset is not None:
            raise ValueError("data.eval_dataset needs a real data.dataset (held-out synthetic questions come from data.eval_world_seed)")
        if synthetic and self.answerable_at is not None:
            raise ValueError("data.answerable_at is for a real data.dataset; every synthetic question is answerable")
        if synthetic and self.retrieval_url is not None:
            raise ValueError("data.retrieval_url is for a real data.dataset; the synthetic world searches its own passages")
        if not synthetic and self.corpus is None and self.retrieval_url is None:
            raise ValueError(f"data.dataset {self.dataset!r} needs data.corpus (the passages to search, a {{id, title, text}} "
                             "jsonl) or data.retrieval_url (a retrieval server searching them)")
        if self.corpus is not None and self.retrieval_url is not None:
            raise ValueError("give data.corpus (indexed here) or data.retrieval_url (searched on a server), not both")
        if self.retrieval_url is not None and not all(u.strip() for u in self.retrieval_url.split(",")):
            raise ValueError(f"data.retrieval_url has an empty URL: {self.retrieval_url!r}")


@dataclass
class EnvConfig:
    """The environment every episode runs in (training and held-out alike).

    Attributes:
        protocol: the tag dialect, prompt and default reward (a registered protocol's name).
        reward: a reward preset overriding the protocol's.
        reward_stages: ``[start_step, preset]`` pairs (R1-Searcher's two stages) that follow the trainer's step.
        evidence_model: the answer model of R-Search's evidence reward: ``"smollm2"`` or a local
            transformers folder, of another family than the policy as in R-Search; ``None``: the evidence
            F1 is skipped (scored 0).
        max_new_tokens: agent tokens per episode.
        max_context: tokens per episode, prompt and results included.
        max_turns: searches per episode (``None``: the protocol's).
        top_k: passages per search (``None``: the protocol's).
    """

    protocol: str = "search-r1"
    reward: str | None = None
    reward_stages: list[list] | None = None
    evidence_model: str | None = None
    max_new_tokens: int = 256
    max_context: int = 2048
    max_turns: int | None = None
    top_k: int | None = None

    def __post_init__(self) -> None:
        check_positive("env", self, "max_new_tokens", "max_context", "max_turns", "top_k")
        if self.reward is not None and self.reward_stages is not None:
            raise ValueError("give env.reward or env.reward_stages, not both")
        if self.reward_stages is not None:
            try:
                self.reward_stages = [[int(start), str(preset)] for start, preset in self.reward_stages]
            except (TypeError, ValueError):
                raise ValueError(f"env.reward_stages must be [start_step, preset] pairs, got {self.reward_stages!r}") from None
