"""One episode's growing record: token ids, the bytes they stand for, spans, counters and events.

:class:`EpisodeBuffer` is what :class:`~search_env.env.SearchQAEnv` writes as the agent's tokens and
the environment's observations come in, and what the tag scanner reads: the exact ids (never
re-tokenised), who produced each, their bytes with each token's end offset (so a byte position maps back
to tokens), and where the current turn began (tags never span an observation). Its
:class:`~search_env.trajectory.Trajectory` shares the id and producer buffers, so the record is
complete at every step without copying.
"""
from __future__ import annotations

from itertools import accumulate
from typing import Any, Sequence

from search_env.data.example import QAExample
from search_env.protocols import Dialect
from search_env.scanner import token_range
from search_env.trajectory import AGENT, Span, Trajectory

__all__ = ["EpisodeBuffer", "Prompt", "COUNTERS"]

#: A rendered prompt: its token ids, its bytes and each token's end offset in them.
Prompt = tuple[tuple[int, ...], bytes, tuple[int, ...]]

#: What an episode counts (``Trajectory.counters``): calls by outcome, cut queries, environment tokens.
COUNTERS = (
    "searches", "invalid_calls", "empty_queries", "budget_exhausted_calls", "calls_inside_answer", "source_errors",
    "invalid_plans", "queries_cut", "unterminated_calls", "env_tokens",
)


_AGENT_BYTE = bytes((AGENT,))


class EpisodeBuffer:
    """The record of one episode from its prompt on (see the module docstring).

    The environment's per-token fast path appends to ``ids``, ``producers``, ``text`` and ``ends``
    directly; everything else goes through the methods.
    """

    __slots__ = ("example", "ids", "producers", "text", "ends", "prompt_bytes", "turn_start", "n_new",
                 "n_searches", "events", "answer_at", "counters", "trajectory", "end_reason", "truncated")

    def __init__(self, example: QAExample, protocol_name: str, prompt: Prompt) -> None:
        prompt_ids, prompt_bytes, prompt_ends = prompt
        self.example = example
        self.ids: list[int] = list(prompt_ids)  #: every token id so far, prompt included
        self.producers = bytearray(len(prompt_ids))  #: per token: AGENT or ENVIRONMENT
        self.text = bytearray(prompt_bytes)  #: the bytes the ids stand for
        self.ends: list[int] = list(prompt_ends)  #: per token: where its bytes end in ``text``
        self.prompt_bytes = len(prompt_bytes)
        self.turn_start = len(prompt_bytes)  #: where the current turn began (after the last observation)
        self.n_new = 0  #: agent tokens so far
        self.n_searches = 0  #: search calls run so far (the turn budget's count)
        self.events: list[dict[str, Any]] = []  #: what happened in the step in progress
        self.answer_at: tuple[int, int] | None = None  #: bytes of the episode's first answer's content
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.end_reason: str | None = None  #: why the episode ended; None while it runs
        self.truncated = False  #: it ended by a budget (tokens or context) rather than terminating
        self.trajectory = Trajectory(
            question=example.question, golden_answers=list(example.golden_answers), protocol=protocol_name,
            example_id=example.id, prompt_length=len(prompt_ids), token_ids=self.ids,
            producers=self.producers, trained=bytearray(), counters=self.counters,
        )

    def append_agent(self, ids: Sequence[int], token_bytes: Sequence[bytes]) -> None:
        """Append a run of agent tokens. The bytes go on one token at a time, in place: up to a few
        hundred ids that is cheaper than building the run's pieces, their joined bytes and their
        running lengths first, whose fixed cost dominates the short runs LLM chunks mostly are."""
        text, ends = self.text, self.ends
        for t in ids:
            text += token_bytes[t]
            ends.append(len(text))
        n = len(ids)
        self.ids.extend(ids)
        self.producers += _AGENT_BYTE * n
        self.n_new += n

    def take_back(self, length: int) -> None:
        """Drop the agent tokens after the first ``length`` tokens (a run appended in bulk went on past
        the token where something happens; its rest is appended again after that)."""
        self.n_new -= len(self.ids) - length
        del self.text[self.ends[length - 1] :]
        del self.ids[length:], self.producers[length:], self.ends[length:]

    def append_environment(self, ids: Sequence[int], token_bytes: Sequence[bytes], kind: str) -> None:
        """Append an observation of ``kind`` (``result`` or ``error``); the next turn starts after it."""
        start = len(self.ids)
        base = len(self.text)
        self.ids.extend(ids)
        self.producers.extend(bytes(len(ids)))
        pieces = [token_bytes[t] for t in ids]
        self.ends.extend(x + base for x in accumulate(map(len, pieces)))
        self.text += b"".join(pieces)
        self.counters["env_tokens"] += len(ids)
        self.turn_start = len(self.text)
        self.trajectory.spans.append(Span(kind, start, len(self.ids)))

    def add_span(self, kind: str, byte_start: int, byte_end: int) -> None:
        """Record a span of agent text (``call`` or ``answer``) by its bytes."""
        first, end = token_range(self.ends, byte_start, byte_end)
        self.trajectory.spans.append(Span(kind, first, end))

    def event(self, name: str) -> None:
        """Note that ``name`` happened at the current token (reported in the step's ``info``)."""
        self.events.append({"event": name, "token_index": len(self.ids)})

    def decode(self, begin: int, end: int | None = None) -> str:
        """The text of bytes ``[begin, end)`` (a broken UTF-8 sequence becomes U+FFFD)."""
        return self.text[begin:end].decode("utf-8", errors="replace")

    def end(self, reason: str, *, truncated: bool) -> None:
        """Mark the episode ended (``reason``: ``answer``, ``eos``, ``empty_query``, ``max_new_tokens``
        or ``max_context``); nothing is appended after this."""
        self.end_reason, self.truncated = reason, truncated
        self.trajectory.end_reason = reason

    def complete(self, protocol: Dialect) -> Trajectory:
        """Fill in what the trajectory knows only at the end: the response text, the first answer's
        content, the trained-on mask, and whether a budget cut a call short."""
        if self.truncated and protocol.call_left_open(bytes(self.text[self.turn_start:])):
            self.counters["unterminated_calls"] += 1
        traj, text, begin = self.trajectory, self.text, self.prompt_bytes
        traj.response_text = response = text[begin:].decode("utf-8", "replace")  # self.decode(begin), inline
        if self.answer_at is not None:
            first, end = self.answer_at
            # self.decode(first, end): an ASCII response is its bytes, so the answer is a slice of it.
            answer = response[first - begin : end - begin] if response.isascii() else text[first:end].decode("utf-8", "replace")
            traj.answer = answer.strip()
        spans = protocol.untrained_agent_spans
        traj.trained = self.trained_mask(spans) if spans else self.producers[:]  # no spans: a copy of the producer mask
        return traj

    def trained_mask(self, untrained_spans: Sequence[tuple[str, str]]) -> bytearray:
        """Agent tokens are trained on, observations are not, nor agent tokens of the spans between
        each (open, close) pair of ``untrained_spans`` (an unclosed span runs to the end)."""
        mask = bytearray(self.producers)
        for open_tag, close_tag in untrained_spans:
            o, c = open_tag.encode(), close_tag.encode()
            pos = self.text.find(o, self.prompt_bytes)
            while pos != -1:
                end = self.text.find(c, pos + len(o))
                end = len(self.text) if end == -1 else end + len(c)
                first, last = token_range(self.ends, pos, end)
                for t in range(first, min(last, len(mask))):
                    mask[t] = 0
                pos = self.text.find(o, end)
        return mask
