"""SearchQA-v0 as a GEM environment: :class:`SearchQAGemEnv`.

GEM (axon-rl's General Experience Maker, PyPI ``gem-llm``) trains on ``gem.Env`` objects that take text:
``reset(seed)`` returns the first observation and an info dict, ``step(text)`` returns
``(observation, reward, terminated, truncated, info)``. GEM's own trainers and its adapters for other
frameworks (verl, OpenRLHF, ROLL, Oat) run any environment registered with ``gem.register``.

Each reset starts one SearchQA-v0 episode: on the question given at construction, or else one drawn
from the environment's dataset with its seeded generator (``reset(seed)`` as ``gym.make("SearchQA-v0")``
draws it). The first observation is the prompt exactly as the environment renders it (with the
tokenizer's chat template when it has one, so let GEM apply no template of its own); each step's
observation is the text the environment appended (search results, errors), "" when none. The turns
are played by :class:`~search_env.integrations._text.TextEpisode`: pass the trained model's tokenizer
so that the environment's tokens are the model's (their ids are in ``info["observation_ids"]``), and
stop generation at the protocol's stop strings (``info["stop_strings"]`` after a reset).

Needs ``gem-llm`` (extra ``gem``; its exact pins clash with other extras, so it gets a virtualenv of
its own: ``.ci/gem_venv.sh`` builds one). :func:`register` registers the id ``"searchqa:SearchQA-v0"``.
"""
from __future__ import annotations

from typing import Any, Sequence

from search_env._optional import requires_extra
from search_env.integrations._text import TextEpisode, episode_env, example_from, shared_env

with requires_extra("gem", "the GEM environment"):
    import gem

__all__ = ["SearchQAGemEnv", "register", "ENV_ID"]

#: The id :func:`register` gives the environment in GEM's registry.
ENV_ID = "searchqa:SearchQA-v0"


class SearchQAGemEnv(gem.Env):
    """SearchQA-v0 behind ``gem.Env`` (see the module docstring).

    Args:
        question / answers: the one question every reset asks, and its golden answers (both or neither;
            neither: each reset draws a question from the dataset).
        **settings: :class:`~search_env.SearchQAEnv`'s keyword arguments (``protocol``, ``dataset``,
            ``sources``, ``tokenizer``, budgets ...). Instances with the same settings share one dataset,
            tokenizer and set of sources.
    """

    def __init__(self, question: str | None = None, answers: str | Sequence[str] | None = None, **settings: Any) -> None:
        super().__init__()
        if (question is None) != (answers is None):
            raise ValueError("give both question and answers, or neither")
        self.settings = settings
        self.example = None if question is None else example_from(question, answers)
        self.episode = TextEpisode(episode_env(shared_env(settings), settings))

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; returns the prompt text and ``{"prompt_ids", "question", "stop_strings"}``."""
        ids, text = self.episode.reset(self.example, seed=seed)
        example = self.episode.env.example
        return text, {"prompt_ids": ids, "question": example.question, "stop_strings": list(self.episode.stop_strings)}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one generated turn; the episode's reward comes on the turn that ends it."""
        result = self.episode.step(action)
        info = dict(result.info)
        info.pop("trajectory", None)  # GEM's loggers copy info; the episode's record is ``episode.trajectory``
        info.update(observation_ids=result.observation_ids, action=result.action)
        return result.observation, result.reward, result.done and not result.truncated, result.truncated, info

    def spawn(self, same_state: bool = False, **kwargs: Any) -> "SearchQAGemEnv":
        """A new instance with these settings (``kwargs`` override them); a running episode is not copied."""
        if same_state:
            raise ValueError("a SearchQA episode cannot be copied mid-way; spawn with same_state=False")
        question = None if self.example is None else self.example.question
        answers = None if self.example is None else self.example.golden_answers
        return SearchQAGemEnv(**{"question": question, "answers": answers, **self.settings, **kwargs})


def register(env_id: str = ENV_ID, **settings: Any) -> None:
    """Register :class:`SearchQAGemEnv` with GEM under ``env_id`` (``gem.make(env_id)`` then builds one with
    ``settings``); registering an id twice is a no-op."""
    from gem.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        gem.register(env_id, entry_point=f"{__name__}:SearchQAGemEnv", **settings)
