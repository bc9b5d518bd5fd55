"""The built-in byte-level BPE: lossless on any text, one token per tag, offline, up to date."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, pre_tokenizers

from search_env.synthetic import generate_world, load_builtin_tokenizer, train_tokenizer
from search_env.synthetic import tokenizer as tokenizer_module

# Written out here (not imported) so that a tag dropped from the module fails this test: PROTOCOLS.md.
PROTOCOL_TAGS = [
    "<think>", "</think>", "<search>", "</search>", "<information>", "</information>", "<answer>", "</answer>",
    "<result>", "</result>", "<|begin_of_query|>", "<|end_of_query|>", "<|begin_of_documents|>",
    "<|end_of_documents|>", "<observation>", "</observation>", "<original_evidence>", "</original_evidence>",
]
SPECIAL = ["<|endoftext|>", "<|pad|>"]
BYTE_ALPHABET = set(pre_tokenizers.ByteLevel.alphabet())

texts_with_tags = st.lists(st.one_of(st.text(), st.sampled_from(PROTOCOL_TAGS + SPECIAL)), max_size=8).map("".join)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_builtin_tokenizer()


def _id_to_bytes(tok: Tokenizer) -> dict[int, bytes]:
    """The environment's convention: byte-level alphabet for ordinary tokens, literal content for added."""
    byte_of = {ch: i for i, ch in enumerate(_gpt2_byte_order())}
    added = {i: t.content.encode() for i, t in tok.get_added_tokens_decoder().items()}
    table = {}
    for token, i in tok.get_vocab(with_added_tokens=True).items():
        table[i] = added[i] if i in added else bytes(byte_of[ch] for ch in token)
    return table


def _gpt2_byte_order() -> list[str]:
    """The byte -> character table of byte-level BPE, rebuilt from its definition (printable Latin-1 bytes
    map to themselves, the others to U+0100 onwards, in byte order)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    chars, shift = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + shift))
            shift += 1
    return chars


@settings(max_examples=200, deadline=None)
@given(text=texts_with_tags)
def test_any_text_round_trips(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text).ids
    assert tok.decode(ids, skip_special_tokens=False) == text


@pytest.fixture(scope="module")
def byte_table(tok: Tokenizer) -> dict[int, bytes]:
    return _id_to_bytes(tok)


@settings(max_examples=200, deadline=None)
@given(text=texts_with_tags)
def test_id_bytes_table_rebuilds_the_utf8_of_any_text(tok: Tokenizer, byte_table: dict[int, bytes],
                                                      text: str) -> None:
    assert b"".join(byte_table[i] for i in tok.encode(text).ids) == text.encode("utf-8")


def test_byte_table_covers_every_id_with_the_byte_level_alphabet(tok: Tokenizer) -> None:
    assert set(_gpt2_byte_order()) == BYTE_ALPHABET
    added = {t.content for t in tok.get_added_tokens_decoder().values()}
    for token in tok.get_vocab(with_added_tokens=True):
        assert token in added or set(token) <= BYTE_ALPHABET, token
    assert len(_id_to_bytes(tok)) == tok.get_vocab_size()


@pytest.mark.parametrize("tag", PROTOCOL_TAGS + SPECIAL)
def test_each_tag_is_one_token_wherever_it_appears(tok: Tokenizer, tag: str) -> None:
    tag_id = tok.token_to_id(tag)
    assert tag_id is not None
    assert tok.encode(tag).ids == [tag_id]
    for context in (f"x{tag}y", f"The answer {tag} Zarbo Corp{tag}\n", f"{tag}{tag}"):
        ids = tok.encode(context).ids
        assert ids.count(tag_id) == context.count(tag)
        assert tok.decode(ids, skip_special_tokens=False) == context


def test_special_tokens_are_eos_and_pad_and_tags_survive_skipping_specials(tok: Tokenizer) -> None:
    assert tok.token_to_id("<|endoftext|>") == 0 and tok.token_to_id("<|pad|>") == 1
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    assert specials == set(SPECIAL)
    ids = tok.encode("<think> x </think><answer>y</answer><|endoftext|><|pad|>").ids
    assert tok.decode(ids, skip_special_tokens=True) == "<think> x </think><answer>y</answer>"


def test_builtin_is_byte_level_with_the_configured_vocabulary(tok: Tokenizer) -> None:
    config = json.loads(tok.to_str())
    assert config["decoder"]["type"] == "ByteLevel"
    assert config["pre_tokenizer"]["type"] == "ByteLevel"
    assert config["normalizer"] is None
    assert tok.get_vocab_size() == 4096
    assert tokenizer_module.BUILTIN_TOKENIZER_PATH.stat().st_size < 1_000_000


def test_training_gives_exactly_the_asked_vocabulary_size() -> None:
    world = generate_world(seed=3, n_questions=100)
    for size in (400, 900):
        trained = train_tokenizer(world, vocab_size=size)
        assert trained.get_vocab_size() == size
        assert all(trained.token_to_id(tag) is not None for tag in PROTOCOL_TAGS + SPECIAL)
    with pytest.raises(ValueError, match="support only"):
        train_tokenizer(world, vocab_size=8000)
    with pytest.raises(ValueError, match="must exceed"):
        train_tokenizer(world, vocab_size=100)


def test_builtin_is_compact_on_world_text(tok: Tokenizer) -> None:
    # Trained on such text: few tokens per word, even for a seed it never saw (names split into syllables).
    for seed, limit in ((0, 1.5), (123, 2.5)):
        passages = generate_world(seed=seed, n_questions=50).passages()
        n_tokens = sum(len(tok.encode(p["text"]).ids) for p in passages)
        n_words = sum(len(p["text"].split()) for p in passages)
        assert n_tokens / n_words < limit, seed


def test_loads_offline_from_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the built-in tokenizer must not touch the network")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    load_builtin_tokenizer.cache_clear()
    try:
        loaded = load_builtin_tokenizer()
        assert loaded is load_builtin_tokenizer()
        assert loaded.encode("<answer> Tarsk </answer>").ids[0] == loaded.token_to_id("<answer>")
    finally:
        load_builtin_tokenizer.cache_clear()


def test_missing_asset_is_reported_with_the_way_to_rebuild_it(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    monkeypatch.setattr(tokenizer_module, "BUILTIN_TOKENIZER_PATH", tmp_path / "absent.json")
    load_builtin_tokenizer.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="python -m search_env.synthetic.tokenizer"):
            load_builtin_tokenizer()
    finally:
        load_builtin_tokenizer.cache_clear()


def test_committed_asset_matches_what_the_generator_builds(tmp_path: Path) -> None:
    # Fails when the world's wording changed without regenerating the asset.
    out = tmp_path / "bpe.json"
    tokenizer_module.main(["--output", str(out)])
    rebuilt = json.loads(out.read_text(encoding="utf-8"))
    committed = json.loads(tokenizer_module.BUILTIN_TOKENIZER_PATH.read_text(encoding="utf-8"))
    assert rebuilt == committed, "the committed tokenizer is stale: run `python -m search_env.synthetic.tokenizer`"
