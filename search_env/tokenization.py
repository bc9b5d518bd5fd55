"""One view of any tokenizer that the environment needs: ids -> bytes, text -> ids, once.

The environment never re-tokenises what the agent generated (token-in/token-out). To detect tags in
the agent's output it only needs the exact bytes each id stands for; to append results it encodes
environment text once. :class:`TokenCodec` builds that id -> bytes table once per tokenizer, for:

* byte-level BPE (GPT-2, Qwen, Llama-3, SmolLM2 and the built-in tokenizer): token strings are in the
  GPT-2 byte alphabet;
* SentencePiece-style vocabularies (Llama-2, Mistral): ``▁`` is a space, ``<0xNN>`` a raw byte;
* anything else: each id decoded on its own (exact for vocabularies without partial characters).

Added tokens (tags, chat markers) stand for their literal content; end-of-sequence tokens stand for no
text at all, because they end the episode rather than add to the answer.
"""
from __future__ import annotations

import json
import os
from functools import lru_cache
from itertools import compress, count
from typing import Any, Sequence

from search_env._optional import requires_extra

__all__ = ["GENERIC_TOKENIZER_CLASSES", "TokenCodec", "as_codec", "byte_level_alphabet", "folder_tokenizer"]


@lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """The GPT-2 byte-level map from printable stand-in characters back to byte values."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codepoints = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codepoints.append(256 + extra)
            extra += 1
    return {chr(cp): byte for byte, cp in zip(printable, codepoints)}


def _piece_bytes_byte_level(piece: str) -> bytes | None:
    table = byte_level_alphabet()
    try:
        return bytes(table[ch] for ch in piece)
    except KeyError:
        return None


def _piece_bytes_sentencepiece(piece: str) -> bytes:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    return piece.replace("\u2581", " ").encode("utf-8")


#: How many distinct texts :meth:`TokenCodec.encode` remembers (then it starts over).
ENCODE_CACHE_SIZE = 4096


class TokenCodec:
    """The environment's handle on a tokenizer.

    Attributes:
        vocab_size: size of the action space (``Discrete(vocab_size)``).
        token_bytes: ``token_bytes[id]`` is the exact byte string id ``id`` contributes to the text.
        eos_ids: ids that end the episode (they contribute no text).
        pad_id: id used to pad fixed windows (an EOS id when the tokenizer has no pad token).
    """

    def __init__(self, tokenizer: Any, *, eos_ids: Sequence[int] | None = None) -> None:
        self.tokenizer = tokenizer
        self._is_hf = hasattr(tokenizer, "convert_ids_to_tokens")
        # The underlying `tokenizers.Tokenizer` (None for a slow transformers tokenizer).
        backend = getattr(tokenizer, "backend_tokenizer", None) if self._is_hf else tokenizer
        self.vocab_size = len(tokenizer) if self._is_hf else tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_ids = frozenset(eos_ids if eos_ids is not None else self._find_eos_ids())
        if not self.eos_ids:
            raise ValueError("the tokenizer has no end-of-sequence token; pass eos_ids=[...] explicitly")
        self.pad_id = self._find_pad_id()
        self.token_bytes: list[bytes] = self._build_byte_table(backend)
        self._tag_tables: dict[frozenset[int], tuple[list[bool], list[bool]]] = {}
        self._attention_ids: dict[frozenset[int], frozenset[int]] = {}
        self._encoded: dict[str, tuple[int, ...]] = {}

    # -- construction helpers -------------------------------------------------------------------
    def _find_eos_ids(self) -> list[int]:
        if self._is_hf:
            ids = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
            return sorted(i for i in ids if i is not None)
        for name in ("<|endoftext|>", "</s>", "<eos>", "<|im_end|>"):
            tid = self.tokenizer.token_to_id(name)
            if tid is not None:
                return [tid]
        return []

    def _find_pad_id(self) -> int:
        if self._is_hf and self.tokenizer.pad_token_id is not None:
            return int(self.tokenizer.pad_token_id)
        if not self._is_hf:
            for name in ("<|pad|>", "<pad>"):
                tid = self.tokenizer.token_to_id(name)
                if tid is not None:
                    return tid
        return min(self.eos_ids)

    def _added_tokens(self, backend: Any) -> dict[int, str]:
        if backend is not None and hasattr(backend, "get_added_tokens_decoder"):
            return {i: tok.content for i, tok in backend.get_added_tokens_decoder().items()}
        if self._is_hf:
            return {i: tok.content for i, tok in self.tokenizer.added_tokens_decoder.items()}
        return {}

    def _build_byte_table(self, backend: Any) -> list[bytes]:
        added = self._added_tokens(backend)
        if self._is_hf:
            pieces = self.tokenizer.convert_ids_to_tokens(list(range(self.vocab_size)))
        else:
            pieces = [backend.id_to_token(i) for i in range(self.vocab_size)]
        decoder = type(backend.decoder).__name__ if backend is not None and backend.decoder is not None else ""
        sentencepiece = decoder in ("Metaspace", "Sequence") and any("\u2581" in p for p in pieces[:2000] if p)
        byte_level = decoder in ("ByteLevel", "")
        table: list[bytes] = []
        for tid, piece in enumerate(pieces):
            if tid in self.eos_ids:
                table.append(b"")
            elif tid in added:
                table.append(added[tid].encode("utf-8"))
            elif piece is None:
                table.append(b"")
            elif sentencepiece:
                table.append(_piece_bytes_sentencepiece(piece))
            else:
                raw = _piece_bytes_byte_level(piece) if byte_level else None
                # Last resort: the tokenizer's own decoding of the id alone.
                table.append(raw if raw is not None else self.tokenizer.decode([tid]).encode("utf-8"))
        return table

    def tag_tables(self, final_bytes: frozenset[int]) -> tuple[list[bool], list[bool]]:
        """Per id: does its text hold one of ``final_bytes`` (so it may complete a tag ending in it),
        and does it need the environment's attention (that, or it is an EOS id). One pass over the
        vocabulary per set of tags, shared by every environment using this codec."""
        tables = self._tag_tables.get(final_bytes)
        if tables is None:
            may_close = [any(b in final_bytes for b in tb) for tb in self.token_bytes]
            attention = [flag or (i in self.eos_ids) for i, flag in enumerate(may_close)]
            tables = self._tag_tables[final_bytes] = (may_close, attention)
        return tables

    def attention_ids(self, final_bytes: frozenset[int]) -> frozenset[int]:
        """The ids whose ``tag_tables(final_bytes)`` attention flag is set, as a set: one C-level
        ``isdisjoint`` then tells whether a chunk of ids holds any. Built once per set of tags."""
        ids = self._attention_ids.get(final_bytes)
        if ids is None:
            ids = self._attention_ids[final_bytes] = frozenset(compress(count(), self.tag_tables(final_bytes)[1]))
        return ids

    # -- text <-> ids -----------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of environment text, without BOS/EOS or other special tokens added.

        The last :data:`ENCODE_CACHE_SIZE` texts' ids are remembered: a group's samples share their prompt,
        and the same query's results recur across them."""
        ids = self._encoded.get(text)
        if ids is None:
            encoded = self.tokenizer.encode(text, add_special_tokens=False)
            ids = tuple(encoded if self._is_hf else encoded.ids)
            if len(self._encoded) >= ENCODE_CACHE_SIZE:
                self._encoded.clear()
            self._encoded[text] = ids
        return list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` as the environment sees it (EOS ids add nothing; bad UTF-8 becomes U+FFFD)."""
        return b"".join(self.token_bytes[i] for i in ids).decode("utf-8", errors="replace")

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template, if it has one (only transformers tokenizers do)."""
        return getattr(self.tokenizer, "chat_template", None) if self._is_hf else None

    def render_chat(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                    add_generation_prompt: bool = True) -> str:
        """Render chat ``messages`` with the tokenizer's template and (by default) the assistant generation
        prompt; ``tools`` (JSON schemas) go to templates that list tools."""
        options: dict[str, Any] = {"tools": tools} if tools is not None else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  **options)


_CODEC_CACHE: dict[int, TokenCodec] = {}


#: ``tokenizer_class`` values of a folder whose ``tokenizer.json`` is the whole tokenizer (as transformers
#: writes a bare ``tokenizers.Tokenizer``, the built-in one among them).
GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def folder_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The transformers tokenizer of a model folder. A folder whose ``tokenizer_config.json`` names the
    generic class (:data:`GENERIC_TOKENIZER_CLASSES`) is loaded as that class: ``AutoTokenizer`` would
    rebuild the model type's own pipeline around its vocabulary instead (for a ``qwen2`` config, Qwen2's
    pre-tokenizer), which splits the built-in tokenizer's text otherwise than it was trained on. Any other
    folder loads as ``AutoTokenizer`` loads it."""
    with requires_extra("agents", "a transformers tokenizer"):
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = os.path.join(os.fspath(path), "tokenizer_config.json")
    if os.path.isfile(config):
        with open(config, encoding="utf-8") as file:
            declared = json.load(file).get("tokenizer_class")
        if declared in GENERIC_TOKENIZER_CLASSES:
            return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def as_codec(tokenizer: Any = None) -> TokenCodec:
    """A :class:`TokenCodec` for ``tokenizer``: ``None`` (the built-in tokenizer), a codec, a
    ``tokenizers.Tokenizer``, a transformers tokenizer, or a path to a ``tokenizer.json`` file or a
    transformers tokenizer folder. Codecs are cached per tokenizer object (building the byte table of a
    150k vocabulary takes a fraction of a second, and every environment of a vector env shares it)."""
    if isinstance(tokenizer, TokenCodec):
        return tokenizer
    if tokenizer is None:
        from search_env.synthetic import load_builtin_tokenizer

        tokenizer = load_builtin_tokenizer()
    elif isinstance(tokenizer, (str, os.PathLike)):
        path = os.fspath(tokenizer)
        if path.endswith(".json"):
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(path)
        else:
            tokenizer = folder_tokenizer(path)
    key = id(tokenizer)
    codec = _CODEC_CACHE.get(key)
    if codec is None or codec.tokenizer is not tokenizer:
        codec = TokenCodec(tokenizer)
        _CODEC_CACHE[key] = codec
    return codec
