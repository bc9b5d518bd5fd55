"""The one thing both model backends share: turn a batch of user prompts into a batch of replies.

The answer model (R-Search's evidence reward) and the LLM judge only differ in the prompt they build
and in how they read the reply; where the text comes from (a local ``transformers`` model or an
OpenAI-compatible server) is a backend behind this small protocol, so each role is written once.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

__all__ = ["ChatModel", "ModelCallError", "check_same_length"]


class ModelCallError(RuntimeError):
    """A model backend could not produce a reply (server unreachable, refused, or answered nonsense)."""


@runtime_checkable
class ChatModel(Protocol):
    """Anything that answers user messages, one reply per prompt, in order.

    Implementations decide batching themselves (padded batches on a local model, requests in flight
    on a server); callers always hand over the whole batch they have.
    """

    def generate(self, prompts: Sequence[str]) -> list[str]:
        """Return the stripped reply to each prompt (sent as a single user message), in order."""
        ...


def check_same_length(**columns: Sequence[object]) -> int:
    """Return the common length of parallel batch columns, or raise naming the ones that differ.

    Batch methods take one list per argument; a silent ``zip`` over lists of different lengths would
    score the wrong pairs, so a mismatch is an error.
    """
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"batch columns differ in length: {lengths}")
    return next(iter(lengths.values()), 0)
