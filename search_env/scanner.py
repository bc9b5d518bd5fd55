"""The byte-stream tag scanner: where, in an agent's token stream, a protocol's close tag completes.

A tag may be split across tokens (``</`` + ``search`` + ``>``) or hidden inside one, so it is looked
for in the exact bytes the ids stand for, never in re-tokenised text. A table built once per vocabulary
and tag set keeps this cheap: ``attention[id]`` (also as the set ``attention_ids``) says whether the id's
bytes hold the last byte of a watched tag, so that it may complete one, or the id is an end-of-sequence
id. Any other id can only append its bytes, which is the environment's per-token fast path, and a run
of such ids is appended in bulk.

The scanner holds no episode state: the environment passes its byte buffer, where the current turn
began (tags never span an observation), and the offset after which a tag counts.
"""
from __future__ import annotations

import bisect
from typing import Sequence

from search_env.tokenization import TokenCodec

__all__ = ["TagScanner", "token_range"]


class TagScanner:
    """Finds the protocol's watched close tags (by position in ``tags``) in an episode's bytes."""

    def __init__(self, codec: TokenCodec, tags: Sequence[str]) -> None:
        self.eos_ids = codec.eos_ids
        self.tags = tuple(tag.encode() for tag in tags)
        final_bytes = frozenset(tag[-1] for tag in self.tags)
        self.attention = codec.tag_tables(final_bytes)[1]
        self.attention_ids = codec.attention_ids(final_bytes)
        self._lookups = tuple((which, tag, len(tag)) for which, tag in enumerate(self.tags))
        # Two tags (a call's and an answer's close tags, what the transition watches): the loop unrolled.
        self._pair = None if len(self.tags) != 2 else (
            self.tags[0], len(self.tags[0]) - 1, len(self.tags[0]), self.tags[1], len(self.tags[1]) - 1, len(self.tags[1])
        )

    def first_tag(self, buf: bytearray, after: int, turn_start: int) -> tuple[int, int, int] | None:
        """The watched tag (its index in ``tags``) that ends first among those ending after byte offset
        ``after`` (and starting in the current turn), with the offsets where it starts and ends; None
        when no tag ends there. Of two tags ending at the same byte, the first in ``tags`` wins.

        Two tags are searched without the loop over them, whose fixed cost every step that may close a
        tag (an answer turn) would pay."""
        if self._pair is not None:
            tag0, back0, length0, tag1, back1, length1 = self._pair
            start = after - back0
            pos0 = buf.find(tag0, start if start > turn_start else turn_start)
            start = after - back1
            pos1 = buf.find(tag1, start if start > turn_start else turn_start)
            if pos1 != -1 and (pos0 == -1 or pos1 + length1 < pos0 + length0):  # a tie goes to tags[0]
                return (1, pos1, pos1 + length1)
            return None if pos0 == -1 else (0, pos0, pos0 + length0)
        best: tuple[int, int, int] | None = None
        for which, tag, length in self._lookups:
            start = after - length + 1
            pos = buf.find(tag, start if start > turn_start else turn_start)
            if pos != -1 and (best is None or pos + length < best[2]):
                best = (which, pos, pos + length)
        return best


def token_range(ends: Sequence[int], byte_start: int, byte_end: int) -> tuple[int, int]:
    """The tokens (first, end exclusive) that cover bytes ``[byte_start, byte_end)``, given each
    token's end offset ``ends`` (sorted)."""
    return bisect.bisect_right(ends, byte_start), bisect.bisect_left(ends, byte_end) + 1
