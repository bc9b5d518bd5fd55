"""Test-wide settings: offline hub, one torch thread (two threads on two busy cores is far slower)."""
import os
from pathlib import Path

import pytest

from search_env.sources.base import Passage, Source, SourceError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: real model or multi-process test (runs in CI, deselect with -m 'not slow')")
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The ../shared/data folder of real QA sets and corpus; skips the test when it is absent."""
    if not (SHARED_DATA / "corpus.jsonl").exists():
        pytest.skip(f"real data not found at {SHARED_DATA} (see ../shared/data/README.md)")
    return SHARED_DATA


class CountingSource(Source):
    """A deterministic in-memory source for environment tests: passage titles echo the query, and
    every batched call is recorded so tests can check batching."""

    def __init__(self, name: str = "all", fail: bool = False) -> None:
        self.name = name
        self.fail = fail
        self.calls: list[list[str]] = []

    def search(self, queries, k):
        self.calls.append(list(queries))
        if self.fail:
            raise SourceError("source is down")
        return [[Passage(f"{q}-{i}", f"T{i} {q}", f"text {i} about {q}", float(k - i)) for i in range(k)] for q in queries]


@pytest.fixture
def counting_source() -> CountingSource:
    """A fresh :class:`CountingSource` named "all"."""
    return CountingSource()


@pytest.fixture(scope="session")
def split_tag_tokenizer():
    """A tiny byte-level BPE with NO tags in its vocabulary, so every tag spans several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    text = ["the answer is in the search results about the question of where people live"] * 20
    tok.train_from_iterator(text, trainer)
    return tok
