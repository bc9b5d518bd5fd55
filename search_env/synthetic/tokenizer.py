"""The built-in byte-level BPE tokenizer, trained on the synthetic world and the protocols' prompt words.

It lets the environment and the small built-in policy run with no model download. Conventions the
environment relies on: the pre-tokenizer and decoder are ``ByteLevel`` (every string round-trips,
whatever its script); an ordinary token's string is written in the byte-level alphabet, while an added
token (a protocol tag, ``<|endoftext|>``, ``<|pad|>``) stands for its literal content; every tag is one
token wherever it appears in text.

Regenerate the committed asset with ``python -m search_env.synthetic.tokenizer``.
"""
from __future__ import annotations

import argparse
import itertools
import re
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from search_env.console import HelpFormatter
from search_env.synthetic.world import SyntheticWorld, generate_world

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
# Every tag of the five built-in protocols (PROTOCOLS.md).
TAG_TOKENS: tuple[str, ...] = (
    "<think>", "</think>", "<search>", "</search>", "<information>", "</information>",
    "<answer>", "</answer>", "<result>", "</result>",
    "<|begin_of_query|>", "<|end_of_query|>", "<|begin_of_documents|>", "<|end_of_documents|>",
    "<observation>", "</observation>", "<original_evidence>", "</original_evidence>",
)
DEFAULT_VOCAB_SIZE = 4096
BUILTIN_TOKENIZER_PATH = Path(__file__).resolve().parents[1] / "assets" / "searchqa_bpe.json"
# The worlds the committed asset is trained on, as (seed, difficulty): the default world of each
# difficulty, plus more seeds of the largest preset so that syllables (not just one world's names) are
# learnt. One world alone cannot fill 4096 ids.
BUILTIN_WORLDS: tuple[tuple[int, int], ...] = ((0, 1), (0, 2), (0, 3), (1, 3), (2, 3), (3, 3))
BUILTIN_QUESTIONS_PER_WORLD = 1000

# Generic instructions and result layouts in the style of the five protocols, so that prompt words,
# tags in context and result prefixes get compact tokens. Tags are stripped before training (they are
# added tokens, never seen by BPE); they stay here to show the layouts.
PROMPT_TEXTS: tuple[str, ...] = (
    "Answer the given question. Reason inside <think> and </think> first every time you get new "
    "information. If you lack some knowledge, call a search engine with <search> query </search> and "
    "it will return the top searched results between <information> and </information>. You can search "
    "as many times as you want. When no further external knowledge is needed, provide the answer "
    "inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing "
    "</answer>. Question: ",
    "The User asks a question, and the Assistant solves it. The Assistant first thinks about the "
    "reasoning process in the mind and then provides the User with the final answer. The Assistant can "
    "perform searching for uncertain knowledge if necessary with the format of <|begin_of_query|> "
    "search query (only list keywords, such as keyword_1 keyword_2 ...) <|end_of_query|>. A query must "
    "involve only a single triple. The search system provides the retrieval information with the "
    "format of <|begin_of_documents|> ...search results... <|end_of_documents|>.\n\nUser:\nAssistant: ",
    "A conversation between User and Assistant. During thinking, the assistant can invoke the wikipedia "
    "search tool to search for fact information about specific topics if needed. The reasoning process "
    "and answer are enclosed within <think> </think> and <answer> </answer> tags respectively, and the "
    "search query and result are enclosed within <search> </search> and <result> </result> tags "
    "respectively. The final exact answer is enclosed within \\boxed{} with latex format: <answer> The "
    "final answer is \\[ \\boxed{answer here} \\] </answer>.",
    "You are a helpful assistant that can solve the given question step by step. For each step, start "
    "by explaining your thought process. If additional information is needed, provide a specific query "
    "enclosed in <search> and </search>. The system will return the top search results within "
    "<observation> and </observation>. When you know the final answer, use <original_evidence> and "
    "</original_evidence> to provide all potentially relevant original information from the "
    "observations, preserving the original wording without modification. Finally, provide the final "
    "answer within <answer> and </answer> tags.",
    "Plan the search as a graph of sub-queries before answering. Write your reasoning in <think> "
    "</think>, then the plan in <search> with a Nodes: section, one line per node as Label: query "
    "(Tool), and an Edges: section such as A -> B ; C -> B. Tools: General (web), News, Academy "
    "(papers, English keywords). At most 8 nodes, no self-loops or cycles, edges only between declared "
    "nodes. Never write <result> yourself. Then give the answer in <answer> </answer>.\n"
    "Nodes:\nA: query one (General)\nB: query two (News)\nC: query three (Academy)\nEdges:\nA -> B ; C -> B",
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and "
    "</answer>. Let me try again.\n",
    "Error: the plan has a cycle. Error: unknown source. Error: unknown node. Error: empty query. "
    "Error: too many nodes. Error: the search timed out. No results found. None",
)
_TAG_PATTERN = re.compile("|".join(re.escape(t) for t in (*TAG_TOKENS, EOS_TOKEN, PAD_TOKEN)))


def training_texts(world: SyntheticWorld) -> Iterator[str]:
    """The texts BPE is trained on for one world: every passage (also in the protocols' result layouts),
    question, sub-query and answer of ``world``."""
    for i, passage in enumerate(world.passages()):
        title, text = passage["title"], passage["text"]
        yield f"Doc {i % 5 + 1}(Title: {title}) {text}\n"
        yield f"({i % 5 + 1}){title}\n{text}\n"
        yield f"(Title: {title}) {text}\n"
    for example in world.questions:
        yield f"Question: {example.question}\n"
        yield f"{example.question} {' '.join(example.golden_answers)}"
        for node in example.decomposition:
            tool = f" ({node.source})" if node.source else ""
            yield f"{node.label}: {node.query}{tool}\n"
            yield f"The answer is {node.answer}. The final answer is \\[ \\boxed{{{node.answer}}} \\]"


def train_tokenizer(
    worlds: SyntheticWorld | Sequence[SyntheticWorld], vocab_size: int = DEFAULT_VOCAB_SIZE
) -> Tokenizer:
    """Train a byte-level BPE of exactly ``vocab_size`` ids on one or more worlds (see
    ``training_texts``) and the protocols' prompt texts (tags removed: they are added tokens).

    Ids 0 and 1 are ``<|endoftext|>`` and ``<|pad|>`` (special: dropped by
    ``decode(skip_special_tokens=True)``); the last ``len(TAG_TOKENS)`` ids are the tags (added, not
    special: decoding keeps them). Raises ValueError when the texts cannot fill ``vocab_size``.
    """
    n_fixed = 256 + 2 + len(TAG_TOKENS)
    if vocab_size <= n_fixed:
        raise ValueError(f"vocab_size must exceed {n_fixed} (bytes, special tokens and tags), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAG_TOKENS),
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    if isinstance(worlds, SyntheticWorld):
        worlds = [worlds]
    texts = itertools.chain(
        (_TAG_PATTERN.sub(" ", text) for text in PROMPT_TEXTS),
        itertools.chain.from_iterable(training_texts(world) for world in worlds),
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAG_TOKENS])
    if tokenizer.get_vocab_size() != vocab_size:
        raise ValueError(
            f"the worlds' texts support only {tokenizer.get_vocab_size()} ids, not {vocab_size}: "
            "train on more or larger worlds or ask for a smaller vocabulary"
        )
    return tokenizer


@lru_cache(maxsize=1)
def load_builtin_tokenizer() -> Tokenizer:
    """The committed tokenizer (no network, no download). The object is cached and shared: copy it with
    ``Tokenizer.from_str(tok.to_str())`` before changing padding or truncation."""
    if not BUILTIN_TOKENIZER_PATH.exists():
        raise FileNotFoundError(
            f"built-in tokenizer missing at {BUILTIN_TOKENIZER_PATH}; "
            "regenerate it with `python -m search_env.synthetic.tokenizer`"
        )
    return Tokenizer.from_file(str(BUILTIN_TOKENIZER_PATH))


def _seed_and_difficulty(text: str) -> tuple[int, int]:
    seed, _, difficulty = text.partition(":")
    try:
        return int(seed), int(difficulty)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected SEED:DIFFICULTY such as 0:3, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> None:
    """Train the built-in tokenizer and write it (by default over the committed asset)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("--worlds", nargs="+", type=_seed_and_difficulty, default=list(BUILTIN_WORLDS),
                        metavar="SEED:DIFFICULTY", help="worlds to train on")
    parser.add_argument("--n-questions", type=int, default=BUILTIN_QUESTIONS_PER_WORLD,
                        help="questions per world")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, help="ids in the vocabulary")
    parser.add_argument("--output", type=Path, default=BUILTIN_TOKENIZER_PATH, help="tokenizer.json to write")
    args = parser.parse_args(argv)
    worlds = [generate_world(seed=seed, n_questions=args.n_questions, difficulty=difficulty)
              for seed, difficulty in args.worlds]
    tokenizer = train_tokenizer(worlds, args.vocab_size)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.output))
    print(f"wrote {args.output} ({tokenizer.get_vocab_size()} ids, {args.output.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
