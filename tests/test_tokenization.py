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
