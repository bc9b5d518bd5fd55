"""How a baseline plays an episode: a script that asks its LLM and writes into the environment.

A baseline's episode is a generator (:data:`Episode`) that yields two kinds of steps:

- :class:`Ask`: a prompt of the baseline's own for its LLM; the generator is resumed with the completion;
- :class:`Write`: text in the protocol's dialect (a thought and a search call, or the answer) that goes
  into the environment as the agent's next chunk; the generator is resumed with the text of what the
  environment appended (the results, or an error message).

:class:`BaselineAgent` runs such scripts as a :class:`~agents.rollout.agent.RolloutAgent`, so baselines
play through :func:`~agents.rollout.collect.collect_rollouts` like any policy: the environment parses the
calls, runs the searches, enforces the budgets and scores the answer, and the trajectory records what
the baseline wrote. The asks of all the rows of a turn go to the LLM as one batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Generator, Protocol, Sequence

from agents.baselines.text import TextGenerator
from agents.rollout.agent import Chunk
from agents.scripted.agents import DialectWriter
from agents.scripted.rollout_agent import text_chunk
from search_env.data.example import QAExample
from search_env.protocols import Dialect
from search_env.tokenization import TokenCodec

__all__ = ["Ask", "Baseline", "BaselineAgent", "Episode", "Write"]


@dataclass(frozen=True)
class Ask:
    """A prompt for the LLM: the baseline's ``instruction`` as the user's message, and ``start``, the
    beginning of the LLM's reply that the completion continues (e.g. ``"Answer:"``)."""

    instruction: str
    start: str = ""
    max_new_tokens: int = 32
    stop: str = "\n"


@dataclass(frozen=True)
class Write:
    """The agent's next chunk of text in the environment."""

    text: str


#: A baseline's episode: yields asks and writes, is sent completions and observation texts.
Episode = Generator[Ask | Write, str, None]


class Baseline(Protocol):
    """A baseline: ``play`` scripts one episode. Only an oracle may read past ``example.question``.

    A baseline that cannot play some questions (the gold-passage oracle on a dataset without gold
    passages) also has ``unable(example) -> str | None``: the reason, or None when it can play it.
    """

    name: str

    def play(self, example: QAExample, writer: DialectWriter) -> Episode: ...


class BaselineAgent:
    """Plays ``baseline`` with ``llm`` as a rollout agent (see the module docstring).

    The LLM's prompts are rendered the way the environment renders its own: with the chat template of
    the environment's tokenizer when it has one (the assistant's turn opened, ``Ask.start`` after it),
    else as plain text. Each written chunk is encoded once with the environment's tokenizer; as with the
    scripted agents, the end-of-sequence id follows an answer that does not end the episode by itself
    (ReSearch), and a script that stops writing ends its episode with it.

    Attributes:
        codec: the LLM's tokenizer when it has one (``llm.codec``, a local model's). The harness builds
            the environment with it, as for the model's ``protocol`` row, so that prompts are rendered
            with the model's chat template and the rows count the same tokens.
    """

    def __init__(self, baseline: Baseline, llm: TextGenerator) -> None:
        self.baseline, self.llm = baseline, llm
        self.codec: TokenCodec | None = getattr(llm, "codec", None)

    def begin(self, prompt_ids: Sequence[Sequence[int]], *, examples: Sequence[QAExample], protocol: Dialect, codec: TokenCodec) -> None:
        self._codec, self._protocol = codec, protocol
        writer = DialectWriter(protocol)
        self._episodes: list[Episode | None] = [self.baseline.play(example, writer) for example in examples]
        self._sends: list[str | None] = [None] * len(examples)  # what resumes each script (None starts it)

    def generate(self, rows: Sequence[int], budgets: Sequence[int]) -> list[Chunk]:
        steps: dict[int, Ask | Write] = {row: self._advance(row, self._sends[row]) for row in rows}
        while asks := {row: step for row, step in steps.items() if isinstance(step, Ask)}:
            for (max_new_tokens, stop), group in _by_settings(asks).items():
                prompts = [self._render(asks[row]) for row in group]
                completions = self.llm.complete(prompts, max_new_tokens=max_new_tokens, stop=stop)
                for row, completion in zip(group, completions):
                    steps[row] = self._advance(row, completion)
        writes = {row: step for row, step in steps.items() if isinstance(step, Write)}  # every row's, now
        chunks = []
        for row, budget in zip(rows, budgets):
            chunks.append(text_chunk(writes[row].text, self._codec, self._protocol, budget))
        return chunks

    def feed(self, row: int, token_ids: Sequence[int]) -> None:
        self._sends[row] = self._codec.decode(token_ids)

    def finish(self, row: int) -> None:
        episode, self._episodes[row] = self._episodes[row], None
        if episode is not None:
            episode.close()

    def close(self) -> None:
        """Close the LLM's connections, where it has any."""
        close = getattr(self.llm, "close", None)
        if callable(close):
            close()

    def _advance(self, row: int, value: str | None) -> Ask | Write:
        """The row's next step; a script that has ended writes nothing (its episode then ends)."""
        episode = self._episodes[row]
        try:
            step = episode.send(value) if episode is not None else Write("")
        except StopIteration:
            step = Write("")
        if not isinstance(step, (Ask, Write)):
            raise TypeError(f"baseline {self.baseline.name!r} yielded a {type(step).__name__}, not an Ask or a Write")
        return step

    def _render(self, ask: Ask) -> str:
        if self._codec.chat_template:
            return self._codec.render_chat([{"role": "user", "content": ask.instruction}]) + ask.start
        return f"{ask.instruction}\n{ask.start}"


def _by_settings(asks: dict[int, Ask]) -> dict[tuple[int, str], list[int]]:
    """The rows of ``asks`` grouped by what one completion call shares: the token budget and the stop."""
    groups: dict[tuple[int, str], list[int]] = {}
    for row, ask in asks.items():
        groups.setdefault((ask.max_new_tokens, ask.stop), []).append(row)
    return groups
