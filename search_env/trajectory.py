"""The record of one episode: the single truth that rewards, metrics, logs and learners read.

Token-level arrays (ids, who produced each token, trained-on mask) live next to the text spans of calls,
results and the answer, the tool calls with their timings, counters, and the reward with its components.
:meth:`Trajectory.to_dict` turns it into plain JSON-able data.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["AGENT", "ENVIRONMENT", "Span", "ToolCall", "Trajectory"]

ENVIRONMENT = 0  #: producer code of prompt, results and error messages
AGENT = 1  #: producer code of tokens the agent emitted


@dataclass
class Span:
    """A text span of the trajectory: ``kind`` is one of ``call``, ``result``, ``error``, ``answer``;
    ``start``/``end`` are token indices (end exclusive) into :attr:`Trajectory.token_ids`."""

    kind: str
    start: int
    end: int


@dataclass
class ToolCall:
    """One search call: what was asked, of which source(s), what came back and how long it took."""

    turn: int
    kind: str  # "query", "dag" or "tool" (one native tool call)
    content: str  # the query, or the plan text
    sources: list[str]
    k: int
    passage_ids: list[str] = field(default_factory=list)
    error: str | None = None
    started_at: float = 0.0
    duration_s: float = 0.0
    nodes: list[dict[str, Any]] = field(default_factory=list)  # per-node details of a DAG call


@dataclass
class Trajectory:
    """Everything that happened in one episode (see the module docstring)."""

    question: str
    golden_answers: list[str]
    protocol: str
    example_id: str
    prompt_length: int
    token_ids: list[int]
    producers: bytearray
    trained: bytearray
    spans: list[Span] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    response_text: str = ""
    answer: str | None = None
    end_reason: str | None = None
    reward: float = 0.0
    reward_components: dict[str, Any] = field(default_factory=dict)

    @property
    def agent_mask(self) -> np.ndarray:
        """Boolean mask of agent-produced tokens (over the whole sequence, prompt included)."""
        return np.frombuffer(bytes(self.producers), dtype=np.uint8) == AGENT

    @property
    def trained_mask(self) -> np.ndarray:
        """Boolean mask of the tokens a learner computes its loss on."""
        return np.frombuffer(bytes(self.trained), dtype=np.uint8).astype(bool)

    @property
    def response_ids(self) -> list[int]:
        """Token ids after the prompt (agent tokens and inserted observations)."""
        return self.token_ids[self.prompt_length :]

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, dicts, str, numbers) for JSON export."""
        data = asdict(self)
        data["producers"] = list(self.producers)
        data["trained"] = list(self.trained)
        return data
