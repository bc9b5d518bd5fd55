"""The one thing a baseline asks of its LLM: complete some prompts (text in, text out).

A baseline prompts its LLM with its own instructions (answer directly, reason step by step, read these
passages), which are not the environment's prompt; only what it then writes into the environment is in
the protocol's dialect. :class:`TextGenerator` is that text interface. :class:`RolloutTextGenerator`
implements it over any :class:`~agents.rollout.agent.RolloutAgent` - the HF sampler for a local model,
the completions endpoint agent for a server - so a baseline decodes with exactly the engine, settings
and seed of the ``protocol`` row it is compared with.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from agents.rollout.agent import RolloutAgent
from search_env.data.example import QAExample
from search_env.protocols import Dialect
from search_env.tokenization import TokenCodec, as_codec

__all__ = ["RolloutTextGenerator", "TextGenerator"]


class TextGenerator(Protocol):
    """Completes prompts: a batch at a time, so a local model decodes the rows of a wave together."""

    def complete(self, prompts: Sequence[str], *, max_new_tokens: int, stop: str) -> list[str]:
        """Each prompt's continuation up to (without) the first ``stop``, the end of sequence, or
        ``max_new_tokens`` tokens, whichever comes first."""
        ...


class RolloutTextGenerator:
    """A :class:`TextGenerator` over a rollout agent: each :meth:`complete` is one turn of a fresh
    rollout whose prompts are the given texts and whose only stop string is ``stop``.

    Args:
        agent: the engine (:class:`~agents.rollout.hf_sampler.HFSampler`,
            :class:`~agents.rollout.endpoint.CompletionsEndpointAgent`, ...).
        codec: the tokenizer prompts are encoded with: the agent's own ``codec`` when it has one (a
            local model must be fed its own ids), else this one, else the built-in tokenizer, which
            is byte-level and so carries any text to a server and back unchanged.

    Attributes:
        codec: the model's tokenizer when the agent has one, else None.
    """

    def __init__(self, agent: RolloutAgent, codec: TokenCodec | None = None) -> None:
        self.agent = agent
        self.codec: TokenCodec | None = getattr(agent, "codec", None)
        self._ids = self.codec or codec or as_codec(None)

    def complete(self, prompts: Sequence[str], *, max_new_tokens: int, stop: str) -> list[str]:
        if not prompts:
            return []
        if max_new_tokens < 1 or not stop:
            raise ValueError(f"a completion needs max_new_tokens >= 1 and a non-empty stop string, got {max_new_tokens} and {stop!r}")
        rows = list(range(len(prompts)))
        self.agent.begin([self._ids.encode(p) for p in prompts], examples=[_NO_QUESTION] * len(prompts),
                         protocol=_stopping_at(stop), codec=self._ids)
        try:
            chunks = self.agent.generate(rows, [max_new_tokens] * len(rows))
        finally:
            for row in rows:
                self.agent.finish(row)
        return [self._ids.decode(chunk.ids).split(stop, 1)[0] for chunk in chunks]

    def close(self) -> None:
        """Close the agent's connections, where it has any (an endpoint's request threads)."""
        close = getattr(self.agent, "close", None)
        if callable(close):
            close()


#: A rollout's rows are questions; a completion's are not (engines do not read them).
_NO_QUESTION = QAExample("", "", [])


def _stopping_at(stop: str) -> Dialect:
    """A protocol whose only turn stop string is ``stop``: a rollout agent ends a chunk at its protocol's
    call and answer close tags, so both are ``stop``."""
    return Dialect(name="text-completion", call_open=stop, call_close=stop, result_open="", result_close="",
                    user_template="{question}", answer_open=stop, answer_close=stop)
