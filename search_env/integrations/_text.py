"""What every adapter shares: where a generated turn ends, one environment per setting, and an episode
driven by text turns.

Text-in/text-out trainers (SkyRL-gym, GEM) hand the environment one turn of the model's text at a time:
what the model generated until a stop string or its end-of-sequence token. :class:`TextEpisode` turns
such a turn into the chunk of token ids that a token-level rollout would have sent
``gym.make("SearchQA-v0")`` - the text's ids with the environment's tokenizer, cut after the first stop
string, with the end-of-sequence token added when the turn stopped anywhere else - so both give the same
episode: the same environment tokens and the same reward.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Sequence

from search_env.data.example import QAExample
from search_env.env import SearchQAEnv
from search_env.tokenization import TokenCodec
from search_env.trajectory import ENVIRONMENT, Trajectory
from search_env.types import Info

__all__ = ["TextEpisode", "TextStep", "chunk_end", "shared_env", "episode_env", "example_from"]

#: Environments built by :func:`shared_env`, one per distinct setting (building the synthetic world and its
#: BM25 indexes takes seconds; an episode's own environment then takes a millisecond).
_SHARED: dict[tuple, SearchQAEnv] = {}


def chunk_end(codec: TokenCodec, stop_strings: Sequence[str], ids: Sequence[int]) -> int:
    """How many of the generated ``ids`` form the turn: up to and including the first end-of-sequence id or
    the id that completes a stop string (all of them when neither comes). A generation engine may run past
    a stop string (or pad a finished row); the environment must not see what follows it."""
    stops = [s.encode() for s in stop_strings]
    text = bytearray()
    token_bytes, eos = codec.token_bytes, codec.eos_ids
    for k, token in enumerate(ids):
        if token in eos:
            return k + 1
        before = len(text)
        text += token_bytes[token]
        if any(text.find(stop, max(0, before - len(stop) + 1)) != -1 for stop in stops):
            return k + 1
    return len(ids)


def _key(value: Any) -> Hashable:
    """A setting's part of the cache key: the value when it is hashable, else the object's identity."""
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return value


def shared_env(settings: Mapping[str, Any]) -> SearchQAEnv:
    """The environment built from ``settings`` (:class:`SearchQAEnv`'s keyword arguments), built once per
    distinct setting and kept; episodes get their own environment on its data, sources and tokenizer with
    :func:`episode_env`."""
    key = tuple(sorted((name, _key(value)) for name, value in settings.items()))
    env = _SHARED.get(key)
    if env is None:
        env = _SHARED[key] = SearchQAEnv(**settings)
    return env


def episode_env(shared: SearchQAEnv, settings: Mapping[str, Any]) -> SearchQAEnv:
    """A new environment with ``settings`` that reuses ``shared``'s examples, sources and tokenizer."""
    return SearchQAEnv(**{**settings, "dataset": shared.examples, "sources": shared.sources, "tokenizer": shared.codec,
                          "default_source": shared.default_source, "source_aliases": shared.source_aliases,
                          "cache_size": 0, "source_timeout_s": None})  # the shared sources are wrapped already


def example_from(question: str, golden_answers: Any, example_id: str | None = None) -> QAExample:
    """A :class:`QAExample` from a trainer's data row: ``golden_answers`` one answer, a list, or verl's
    ``{"target": [...]}``."""
    if isinstance(golden_answers, Mapping):
        golden_answers = golden_answers["target"]
    answers = [golden_answers] if isinstance(golden_answers, str) else [str(a) for a in golden_answers]
    if not answers:
        raise ValueError(f"no golden answer given for {question!r}")
    return QAExample(example_id or question, question, answers)


@dataclass
class TextStep:
    """What one text turn did.

    Attributes:
        action: the part of the turn the environment used (cut after the first stop string), as text.
        observation: the environment's text appended after it ("" when none came).
        observation_ids: the environment's token ids of that text, exactly as the episode holds them.
        reward: the episode's reward on the turn that ends it, else 0.
        done / truncated: the episode ended; it ended by a budget (tokens or context).
        info: the environment's info of the turn's last step.
    """

    action: str
    observation: str
    observation_ids: list[int]
    reward: float
    done: bool
    truncated: bool
    info: Info = field(default_factory=dict)


class TextEpisode:
    """One SearchQA-v0 episode played by text turns.

    Args:
        env: the environment the episode runs in (its protocol, tokenizer, sources and budgets).

    A turn's text is encoded with the environment's tokenizer (the trainer's, for token fidelity), cut
    after its first stop string (the protocol's :attr:`~search_env.protocols.Dialect.stop_strings`) and
    stepped as one chunk. A turn that stops anywhere else ended on the model's end-of-sequence token (or
    its length limit), so when such a turn leaves the episode running the end-of-sequence id is stepped
    too, as in a token-level rollout: the episode ends, or, where the turn holds native tool calls (the
    ``tool-calls`` protocols), the calls run and their tool turn is the observation.
    """

    def __init__(self, env: SearchQAEnv) -> None:
        self.env = env
        self.codec = env.codec
        self.stop_strings = env.protocol.stop_strings
        self.reward = 0.0
        self._eos = min(self.codec.eos_ids)

    def reset(self, example: QAExample | None = None, *, seed: int | None = None) -> tuple[list[int], str]:
        """Start the episode on ``example`` (None: one the environment draws, as ``reset(seed=seed)`` of
        ``gym.make("SearchQA-v0")`` draws it); returns the prompt's ids and its text."""
        obs, _ = self.env.reset(seed=seed, options=None if example is None else {"example": example})
        self.reward = 0.0
        ids = list(obs["token_ids"])
        return ids, self.codec.decode(ids)

    def messages(self, question: str) -> list[dict[str, str]]:
        """The protocol's chat messages for ``question`` (for trainers that render prompts themselves)."""
        return self.env.protocol.messages(question)

    @property
    def done(self) -> bool:
        """The episode has ended (or has not started)."""
        return self.env.done

    @property
    def trajectory(self) -> Trajectory:
        """The episode's record (tokens, producers, training mask, reward)."""
        return self.env.trajectory

    def step(self, action: str | Sequence[int]) -> TextStep:
        """Play one turn: ``action`` as text (encoded with the environment's tokenizer) or as token ids."""
        if self.env.done:
            raise RuntimeError("the episode has ended (or not started): reset it first")
        ids = self.codec.encode(action) if isinstance(action, str) else [int(t) for t in action]
        ids = ids[:chunk_end(self.codec, self.stop_strings, ids)]
        used = self.codec.decode(ids)
        env_ids: list[int] = []
        reward, terminated, truncated, info = 0.0, False, False, {}
        if ids:
            obs, reward, terminated, truncated, info = self.env.step(ids)
            env_ids = [t for t, who in zip(obs["token_ids"], obs["producers"]) if who == ENVIRONMENT]
        if not (terminated or truncated) and not env_ids:
            # The turn stopped on no stop string and nothing answered it: the model ended its generation.
            obs, reward, terminated, truncated, info = self.env.step([self._eos])
            env_ids = [t for t, who in zip(obs["token_ids"], obs["producers"]) if who == ENVIRONMENT]
        self.reward += float(reward)
        return TextStep(used, self.codec.decode(env_ids), env_ids, float(reward), bool(terminated or truncated),
                        bool(truncated), info)
