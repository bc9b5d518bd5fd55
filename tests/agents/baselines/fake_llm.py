"""A scripted stand-in for an LLM: a deterministic :class:`~agents.baselines.text.TextGenerator` whose
replies are chosen by what the prompt holds, recording every prompt and setting it was given."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass
class Call:
    prompt: str
    max_new_tokens: int
    stop: str


@dataclass
class ScriptedLLM:
    """Replies with ``reply(prompt)``; the reply is cut at ``stop`` as a real engine would stop there.

    ``batches`` records each :meth:`complete` call's prompts (how the rows of a turn were batched)."""

    reply: Callable[[str], str]
    calls: list[Call] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)

    def complete(self, prompts: Sequence[str], *, max_new_tokens: int, stop: str) -> list[str]:
        self.batches.append(len(prompts))
        self.calls += [Call(p, max_new_tokens, stop) for p in prompts]
        return [self.reply(p).split(stop, 1)[0] for p in prompts]


def by_prompt(*rules: tuple[str, str], default: str = "") -> Callable[[str], str]:
    """Reply with the first rule's text whose key the prompt contains, else ``default``."""
    def reply(prompt: str) -> str:
        return next((text for key, text in rules if key in prompt), default)
    return reply
