"""The embedded demo task: what a tiny policy trained from scratch learns on a CPU in minutes.

Four choices make the task learnable at that size:

* a compact dialect of Search-R1 (:data:`COMPACT_SEARCH_R1`): the same tags, stop strings and reward
  (EM of the last ``<answer>``), but a one-line prompt and results without the ``Doc i(Title: ...)``
  prefixes. A model trained from scratch gets nothing from instruction text, and every token of
  context costs it compute: an episode is about half as long as with Search-R1's 279-token prompt;
* a *large* world (:func:`demo_world`): a tiny model memorises a small world's facts before it learns
  to copy names from the question and the results, and memorised facts score nothing on a world with
  another seed. Measured on the held-out world's 1-hop questions, greedy, after 2,400 warm-start steps of
  the 2x64 demo model (2-core CPU, 2026-11-22): 0.46 EM with 10 times the default world's entities and
  4,000 questions (training loss 0.010: memorised), 0.73 with 50 times and 20,000 questions (loss 0.046);
  and 0.56 after 3,600 steps at 10 times. The default here is 50 times; the demo
  (``demo_config`` in ``benchmarks/learning.py``) trains on 500 times, where even with two-token names the
  warm start cannot fit its demonstrations by memorising names;
* BM25 over lightly stemmed words (:func:`light_stem`) and two results per search: the passage that
  answers a lookup comes first in about 97% of lookups (74% unstemmed), so that the answer is where a
  small model learns to look. On the demo's 500x held-out world the first passage holds the answer of
  99.9% of 1-hop questions and of both lookups of 99.7% of 2-hop ones (2,000 questions, 2026-11-25), yet
  one result per search trained worse (seeds 0/1, 2-hop greedy EM 0.71/0.62 after 100/40 GRPO steps
  against 0.82/0.83 with two, from warm starts of the older 30,000-demonstration setting);
* names whose invented words take exactly two tokens of the built-in tokenizer
  (:attr:`~search_env.synthetic.WorldConfig.stem_tokens`; most take three or four, irregularly split):
  an answer is a copy of unseen names, and how exactly a tiny model copies decides the held-out score.
  With the default names the demo's held-out 2-hop greedy EM stayed at 0.46-0.69 in every probe, its
  failures nearly all miscopied names ("Grymisand" answered "Gryvirnand"); after SFT on demonstrations
  that all take the second hop it reached 0.84, against 0.90 with stems of one or two tokens (seed 0,
  2026-11-25; exactly two since, as a one-token stem is a rare token). A held-out world leaves out the
  training world's words (``held_out_from``).

Questions are chain questions (1 and 2 lookups): comparisons and yes/no checks need reasoning over two
results that a model of this size does not learn in minutes.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from search_env.data.example import QAExample
from search_env.protocols import Protocol, available_protocols, get_protocol, register_protocol
from search_env.sources.base import Passage, Source

__all__ = ["COMPACT_SEARCH_R1", "demo_world", "light_stem"]


def _passage_texts(passages: Sequence[Passage]) -> str:
    return "".join(f"{p.text}\n" for p in passages)


COMPACT_SEARCH_R1: Protocol = get_protocol("search-r1").with_options(
    name="search-r1-compact",
    user_template="Question: {question}\n",
    result_prefix="\n<information>",
    result_suffix="</information>\n",
    format_docs=_passage_texts,
    error_template="\n<information>{message}</information>\n",
    top_k=2,
)
"""Search-R1's tags and reward with a one-line prompt and title-less results (see the module docstring)."""

if COMPACT_SEARCH_R1.name not in available_protocols():
    register_protocol(COMPACT_SEARCH_R1)


_SUFFIXES = (("ies", "y"), ("ied", "y"), ("es", ""), ("ed", ""), ("s", ""))


def light_stem(word: str) -> str:
    """Strip one plural or past-tense ending ("studied" -> "study", "works" -> "work", "publishes" ->
    "publish"), so that a question's verb finds the passage that states the fact: without it, BM25 ranks
    a person's three passages equally for "Where did X study?" and the one that answers is not first."""
    for suffix, replacement in _SUFFIXES:
        if word.endswith(suffix) and len(word) > len(suffix) + 2:
            return word[: -len(suffix)] + replacement
    return word


def demo_world(seed: int, n_questions: int, *, scale: int = 50, max_hops: int = 2, stem_tokens: int | None = 2,
               held_out_from: int | None = None) -> tuple[list[QAExample], dict[str, Source]]:
    """A synthetic world of chain questions (1..``max_hops`` lookups) with ``scale`` times the default
    world's entities, names whose invented words take exactly ``stem_tokens`` tokens of the built-in
    tokenizer (``None``: any number), and its sources: BM25 (words stemmed by :func:`light_stem`) over each
    world source plus ``"all"`` over every passage.

    ``held_out_from``: the seed of a world made with the same settings whose invented words this one must
    not use (a held-out world of all-new names: two worlds of two-token stems share about 4.5% of their
    words otherwise)."""
    from search_env.sources.bm25 import BM25Source
    from search_env.synthetic import WorldConfig, generate_world

    config = WorldConfig(max_hops=max_hops, comparison_fraction=0.0, yes_no_fraction=0.0, stem_tokens=stem_tokens).scaled(scale)
    if held_out_from is not None:
        trained_on = generate_world(seed=held_out_from, n_questions=0, config=config)  # names do not depend on questions
        config = replace(config, excluded_stems=trained_on.invented_words())
    world = generate_world(seed=seed, n_questions=n_questions, config=config)
    sources: dict[str, Source] = {name: BM25Source(passages, name=name, stemmer=light_stem)
                                  for name, passages in world.sources.items()}
    sources["all"] = BM25Source(world.passages(), name="all", stemmer=light_stem)
    return list(world.questions), sources
