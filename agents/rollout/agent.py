"""What a rollout needs of an agent, so any agent plugs into :func:`agents.rollout.collect.collect_rollouts`.

The rollout runs a batch of episodes ("rows") in turns:

1. ``begin`` gives the agent every row's prompt ids (the environment's tokenization of the prompt);
2. ``generate`` asks the still-running rows for their next chunk of token ids: the agent writes until
   a stop string of the protocol (:func:`turn_stop_strings`, found in the exact bytes
   ``codec.token_bytes`` of the ids, so a stop string split across tokens or ending inside a token
   counts), an end-of-sequence id (``codec.eos_ids``), or the row's token budget, whichever is first;
3. the environment consumes the chunks; ``feed`` hands each row the tokens the environment appended
   (search results, error messages; possibly none), which the agent must treat as part of its
   context, then ``generate`` again; ``finish`` tells it that a row's episode has ended.

The ids the agent returns are kept as they are (token-in/token-out): the trajectory, the reward and the
learner all read those ids. Implementations: :class:`agents.rollout.hf_sampler.HFSampler` (a local
``transformers`` model), :class:`agents.scripted.agents.ScriptedRolloutAgent` (the scripted baselines) and
:class:`agents.rollout.endpoint.CompletionsEndpointAgent` (an OpenAI-compatible server, for evaluation).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, runtime_checkable

from search_env.data.example import QAExample
from search_env.protocols import Dialect
from search_env.tokenization import TokenCodec

__all__ = ["Chunk", "RolloutAgent", "SamplingParams", "StreamingRolloutAgent", "turn_stop_strings"]


def turn_stop_strings(protocol: Dialect) -> tuple[str, ...]:
    """Where an agent must end a chunk: every tag after which the environment may append tokens.

    That is ``protocol.stop_strings`` and the answer's close tag: the environment answers a close tag
    with no open tag before it with an error observation, also under ReSearch, whose ``stop_strings``
    leave the answer tag out because a valid answer does not end its episode. Generating past such a
    tag would put the agent's next tokens before the error text it never saw.
    """
    return tuple(dict.fromkeys((*protocol.stop_strings, protocol.answer_close)))


@dataclass(frozen=True)
class SamplingParams:
    """How a decoding agent samples: one value, checked once, that the HF sampler and the vLLM agents share
    (each of them carried and checked its own copy before).

    Attributes:
        temperature: softmax temperature (> 0); the recorded log-probs are of this tempered distribution.
        top_p: nucleus sampling, in (0, 1] (1.0: off).
        greedy: take the most likely id instead of sampling.
        seed: the rollout's seed: each episode draws from a stream keyed by it and the episode's index.
        first_row: the index of the agent's first episode in the rollout's whole batch (>= 0; on a
            data-parallel rank, where the rank's share starts).

    Raises:
        ValueError: one line, for a temperature, top-p or first row out of range.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    seed: int = 0
    first_row: int = 0

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (use greedy=True for greedy decoding), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.first_row < 0:
            raise ValueError(f"first_row must be >= 0, got {self.first_row}")
        for name, kind in (("temperature", float), ("top_p", float), ("greedy", bool), ("seed", int), ("first_row", int)):
            object.__setattr__(self, name, kind(getattr(self, name)))

    def requested(self) -> tuple[float, float]:
        """The (temperature, top-p) a vLLM request carries: (0, 1) for greedy decoding (vLLM's greedy sampler)."""
        return (0.0, 1.0) if self.greedy else (self.temperature, self.top_p)


@dataclass(frozen=True)
class Chunk:
    """One row's generated ids for a turn, and (for a sampling policy) the log-prob of each id at the
    sampling temperature, so a learner can check or reuse them."""

    ids: list[int]
    logprobs: list[float] | None = None


@runtime_checkable
class RolloutAgent(Protocol):
    """The rollout's view of an agent (see the module docstring for the turn structure)."""

    def begin(self, prompt_ids: Sequence[Sequence[int]], *, examples: Sequence[QAExample], protocol: Dialect, codec: TokenCodec) -> None:
        """Start one episode per row from its prompt ids. ``examples`` are the rows' questions with their
        gold data: only scripted oracles may look past ``example.question``. ``codec`` is the
        environment's tokenizer view; an agent with its own tokenizer should check they agree."""
        ...

    def generate(self, rows: Sequence[int], budgets: Sequence[int]) -> list[Chunk]:
        """The next chunk for each of ``rows`` (non-empty, at most ``budgets[i]`` ids, ending at the first
        stop string, end-of-sequence id or the budget). ``rows`` are all the rows still running (the
        rollout always asks every one, so a batched agent may rely on it)."""
        ...

    def feed(self, row: int, token_ids: Sequence[int]) -> None:
        """The environment's tokens that follow the row's last chunk (may be empty)."""
        ...

    def finish(self, row: int) -> None:
        """The row's episode has ended; the agent may free what it holds for it."""
        ...


@runtime_checkable
class StreamingRolloutAgent(RolloutAgent, Protocol):
    """A rollout agent that reports each row's chunk as soon as the row stops, before ``generate`` returns.

    With an environment stepped in a worker process (:class:`search_env.worker.EnvWorker`), the rollout
    hands those chunks over at once, so the environment steps them while the agent decodes the rows still
    writing. An agent says it streams with ``streams_chunks = True``.
    """

    streams_chunks: bool

    def generate(self, rows: Sequence[int], budgets: Sequence[int], *,
                 on_chunks: Callable[[dict[int, Chunk]], None] | None = None) -> list[Chunk]:
        """As :meth:`RolloutAgent.generate`; besides, ``on_chunks`` (when given) receives, as rows stop,
        the chunks of the rows that stopped (row -> chunk), every row exactly once and with the chunk
        that ``generate`` then returns for it."""
        ...
