"""SearchQA-v0 as a SkyRL-gym text environment: :class:`SearchQASkyRLEnv`, one episode per instance.

SkyRL's generator builds one environment per dataset row (``env_class`` names it in the row) with
``(env_config, extras)``: the environment's settings from the run's config and the row's fields. It calls
``init(prompt)`` for the chat messages to generate from, then ``step(text)`` with each turn the model
generated, appending the returned observation messages until ``done``.

Here ``env_config`` holds :class:`~search_env.SearchQAEnv`'s keyword arguments (``protocol``, ``dataset``,
``sources``, ``tokenizer``, budgets ...): pass the trained model's tokenizer (its name or folder) so that
the environment's tokens are the model's. The row gives the question (``extra_info.question``) and its
answers (``reward_spec.ground_truth``: a list or ``{"target": [...]}``, as
:mod:`search_env.integrations.verl_data` writes them). Environments built from the same settings share
one dataset, tokenizer and set of sources (built on first use).

The turns are played by :class:`~search_env.integrations._text.TextEpisode`; the observation is the
environment's text, given as a ``user`` message. For the environment's exact tokens, run SkyRL's
generator with ``use_conversation_multi_turn=false`` (observations appended to the response as text,
the Search-R1 layout) and the protocol's stop strings as sampling ``stop``. The observation's token ids
are also in the step's ``metadata["observation_ids"]``.

Needs ``skyrl-gym`` (extra ``skyrl``); register it with :func:`register` (id ``"searchqa"``).
"""
from __future__ import annotations

from typing import Any, Mapping

from search_env._optional import requires_extra
from search_env.integrations._text import TextEpisode, episode_env, example_from, shared_env

with requires_extra("skyrl", "the SkyRL-gym environment"):
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

__all__ = ["SearchQASkyRLEnv", "register", "ENV_ID"]

#: The id :func:`register` gives the environment in SkyRL-gym's registry (``environment.env_class``).
ENV_ID = "searchqa"
#: SkyRL's turn cap when the protocol sets no search budget: SkyRL needs a finite one, and the token
#: budget ends an episode long before this many searches.
UNLIMITED_SEARCHES_CAP = 64


def _settings(env_config: Any) -> dict[str, Any]:
    """``env_config`` (a mapping, an OmegaConf config or None) as plain keyword arguments."""
    if env_config is None:
        return {}
    if hasattr(env_config, "items") and not isinstance(env_config, Mapping):  # an OmegaConf DictConfig
        from omegaconf import OmegaConf

        env_config = OmegaConf.to_container(env_config, resolve=True)
    return dict(env_config)


class SearchQASkyRLEnv(BaseTextEnv):
    """One SearchQA-v0 episode behind SkyRL-gym's ``BaseTextEnv`` (see the module docstring).

    Args:
        env_config: :class:`~search_env.SearchQAEnv`'s keyword arguments (a mapping or an OmegaConf config).
        extras: the dataset row: ``reward_spec.ground_truth`` (the answers), ``extra_info.question`` and
            optionally ``extra_info.id``; ``max_turns`` is SkyRL's turn cap (default: the protocol's search
            budget plus the answer turn).
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        extras = dict(extras or {})
        settings = _settings(env_config)
        self.episode = TextEpisode(episode_env(shared_env(settings), settings))
        info = dict(extras.get("extra_info") or {})
        spec = extras.get("reward_spec") or {}
        if "ground_truth" not in spec:
            raise ValueError("the row has no reward_spec.ground_truth (the question's answers)")
        if not info.get("question"):
            raise ValueError("the row has no extra_info.question (the question the episode asks)")
        self.example = example_from(str(info["question"]), spec["ground_truth"], info.get("id"))
        budget = self.episode.env.max_turns
        self.max_turns = int(extras.get("max_turns", (budget if budget is not None else UNLIMITED_SEARCHES_CAP) + 1))

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """Start the episode; returns the protocol's messages for the question (the row's prompt, when it was
        written by :mod:`~search_env.integrations.verl_data`) and the prompt's token ids."""
        ids, _ = self.episode.reset(self.example)
        return self.episode.messages(self.example.question), {"prompt_ids": ids}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Play one generated turn; the episode's reward comes on the turn that ends it."""
        self.turns += 1
        result = self.episode.step(action)
        done = result.done or self.turns >= self.max_turns
        observations = [{"role": "user", "content": result.observation}] if result.observation and not done else []
        metadata = {"observation_ids": result.observation_ids, "truncated": result.truncated}
        if result.done:
            metadata["end_reason"] = result.info.get("end_reason")
            metadata["reward_components"] = result.info.get("reward_components", {})
        return BaseTextEnvStepOutput(observations=observations, reward=result.reward, done=done, metadata=metadata,
                                     postprocessed_action=result.action)

    def get_metrics(self) -> dict[str, Any]:
        """Searches and reward of the episode (SkyRL averages them over a batch)."""
        if self.episode.env.done and self.turns:
            trajectory = self.episode.trajectory
            return {"searches": len(trajectory.tool_calls), "reward": trajectory.reward}
        return {}


def register(env_id: str = ENV_ID) -> None:
    """Register :class:`SearchQASkyRLEnv` in SkyRL-gym's registry under ``env_id`` (once per process)."""
    from skyrl_gym.envs.registration import register as skyrl_register, registry

    if env_id not in registry:
        skyrl_register(id=env_id, entry_point=f"{__name__}:SearchQASkyRLEnv")
