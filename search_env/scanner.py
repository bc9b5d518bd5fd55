"""The byte-stream tag scanner: where, in an agent's token stream, a protocol's close tag completes.

A tag may be split across tokens (``</`` + ``search`` + ``>``) or hidden inside one, so it is looked
for in the exact bytes the ids stand for, never in re-tokenised text. Two tables, built once per
vocabulary and tag set, keep this cheap: ``may_close[id]`` (the id's bytes hold the last byte of a
watched tag, so it may complete one) and ``attention[id]`` (that, or the id is an end-of-sequence id).
Any other id can only append its bytes, which is the environment's per-token fast path.

The scanner holds no episode state: the environment passes its byte buffer, where the current turn
began (tags never span an observation), and the ids it is about to append.
"""
from __future__ import annotations

import bisect
from itertools import accumulate
from typing import Sequence

from search_env.tokenization import TokenCodec

__all__ = ["TagScanner", "token_range"]


class TagScanner:
    """Finds the protocol's watched close tags (by position in ``tags``) in an episode's bytes."""

    def __init__(self, codec: TokenCodec, tags: Sequence[str]) -> None:
        self.token_bytes = codec.token_bytes
        self.eos_ids = codec.eos_ids
        self.tags = tuple(tag.encode() for tag in tags)
        self.max_tag = max(len(tag) for tag in self.tags)
        self.may_close, self.attention = codec.tag_tables(frozenset(tag[-1] for tag in self.tags))

    def next_attention(self, ids: Sequence[int], i: int, room: int, buf: bytearray, turn_start: int) -> int:
        """The first index ``j >= i`` of ``ids`` whose token needs the single-token logic: it completes a
        watched tag, is EOS, or is the last of ``room`` tokens a budget leaves (``len(ids)`` when none
        is). Exact, so appending ``ids[i:j]`` in bulk never skips an event. ``buf`` holds the bytes
        before ``ids[i]``; a tag that ended before ``ids[i]`` was handled already."""
        limit = min(len(ids), i + room - 1)
        attention = self.attention
        for j in range(i, limit):
            if attention[ids[j]]:
                break
        else:
            return limit
        if j == i or not self.may_close[ids[j]] or ids[j] in self.eos_ids:
            return j
        # ids[j] may close a tag: search the joined bytes of ids[i:limit] once, in C.
        tb = self.token_bytes
        chunk = b"".join([tb[t] for t in ids[i:limit]])
        base = len(buf)
        back = min(self.max_tag - 1, base - turn_start)
        window = bytes(buf[base - back :]) + chunk
        end = None
        for tag in self.tags:
            pos = window.find(tag)
            while pos != -1 and pos + len(tag) <= back:  # ended before this chunk: already handled
                pos = window.find(tag, pos + 1)
            if pos != -1 and (end is None or pos + len(tag) < end):
                end = pos + len(tag)
        eos_at = next((k for k in range(j, limit) if ids[k] in self.eos_ids), limit)
        if end is None:
            return eos_at
        lengths = accumulate(len(tb[t]) for t in ids[i:limit])
        tag_at = i + bisect.bisect_left(list(lengths), end - back)
        return min(tag_at, eos_at)

    def completed_tag(self, buf: bytearray, before: int, turn_start: int) -> tuple[int, int] | None:
        """Which watched tag (its index in ``tags``) ends in the bytes after offset ``before``, and the
        offset where it starts; None when none does. The earliest-ending one wins."""
        best: tuple[int, int] | None = None
        best_end = 0
        for which, tag in enumerate(self.tags):
            pos = buf.find(tag, max(turn_start, before - len(tag) + 1))
            if pos != -1 and (best is None or pos + len(tag) < best_end):
                best, best_end = (which, pos), pos + len(tag)
        return best


def token_range(ends: Sequence[int], byte_start: int, byte_end: int) -> tuple[int, int]:
    """The tokens (first, end exclusive) that cover bytes ``[byte_start, byte_end)``, given each
    token's end offset ``ends`` (sorted)."""
    return bisect.bisect_right(ends, byte_start), bisect.bisect_left(ends, byte_end) + 1
