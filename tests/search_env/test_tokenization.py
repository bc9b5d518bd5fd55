"""The codec's id -> bytes table for vocabularies that are not byte-level."""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from search_env.tokenization import TokenCodec


def test_sentencepiece_pieces_and_byte_fallback():
    vocab = {"<unk>": 0, "</s>": 1, "\u2581who": 2, "\u2581search": 3, "<0xC3>": 4, "<0xA9>": 5, "s": 6}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    codec = TokenCodec(tok, eos_ids=[1])
    assert codec.token_bytes[2] == b" who" and codec.token_bytes[4] == b"\xc3" and codec.token_bytes[1] == b""
    assert codec.decode([2, 3, 4, 5, 6]) == " who searché" + "s"


def test_other_vocabularies_fall_back_to_the_tokenizers_own_decoding():
    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "[SEP]": 1, "zarbo": 2, "##works": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    codec = TokenCodec(tok, eos_ids=[1])
    assert codec.token_bytes[2] == b"zarbo" and codec.token_bytes[1] == b""


def test_encode_remembers_texts_without_sharing_its_lists(monkeypatch):
    import search_env.tokenization as tokenization
    from search_env.tokenization import as_codec

    codec = as_codec(None)
    calls = []
    real = codec.tokenizer.encode
    monkeypatch.setattr(codec.tokenizer, "encode", lambda text, **kw: calls.append(text) or real(text, **kw), raising=False)
    codec._encoded.clear()
    first = codec.encode("Question: who founded Zarbo?")
    first.append(-1)  # a caller's list is its own
    again = codec.encode("Question: who founded Zarbo?")
    assert again == real("Question: who founded Zarbo?", add_special_tokens=False).ids and calls == ["Question: who founded Zarbo?"]
    monkeypatch.setattr(tokenization, "ENCODE_CACHE_SIZE", 2)
    for text in ("a", "b", "c"):
        codec.encode(text)
    assert len(codec._encoded) <= 2  # bounded: it starts over when full
