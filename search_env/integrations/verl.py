"""verl's side of SearchQA-v0 that needs no verl: the seed rewards as ``compute_score`` functions and the
retrieval that :class:`search_env.integrations.verl_tool.SearchQATool` puts behind verl's tool interface.

verl's multi-turn recipes (its ``ToolAgentLoop``) generate with the model's own tool-call format, run
the tools named in a tool config, and score each finished response with a reward function of the form
``compute_score(data_source, solution_str, ground_truth, extra_info)`` (``custom_reward_function.path``
and ``.name``). Here:

- :func:`compute_score` scores with the preset the row names (``extra_info["reward"]`` and
  ``extra_info["reward_options"]``, as :mod:`search_env.integrations.verl_data` writes them; else the
  protocol named in ``data_source`` = ``"searchqa/<protocol>"``), and ``compute_score_<preset>`` (one per
  seed preset: ``compute_score_search_r1``, ``compute_score_r1_searcher``, ``compute_score_research``,
  ``compute_score_r_search``, ``compute_score_reasoning_search``) with that preset whatever the row says.
  The score is :func:`rewards.score`'s total, the number ``gym.make("SearchQA-v0")`` gives the same
  response. verl decodes the response without special tokens, so whether it ended on the
  end-of-sequence token is not in ``solution_str``: it is read from ``extra_info["ended_with_eos"]``,
  True when absent (a response cut by verl's length limit is then scored as finished; ReSearch's preset
  is the one that tells them apart).
- :class:`ToolEpisode` answers a trajectory's search calls through one SearchQA-v0 episode, so the text
  the tool returns is exactly the environment's observation for that call (the protocol's result block,
  its errors, its search budget).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from rewards.registry import score

from search_env.integrations._text import TextEpisode, episode_env, example_from, shared_env
from search_env.protocols import SEED_PROTOCOLS, get_protocol

__all__ = ["compute_score", "ToolEpisode", "DATA_SOURCE_PREFIX", "data_source", *(
    f"compute_score_{get_protocol(name).reward.replace('-', '_')}" for name in SEED_PROTOCOLS)]

#: ``data_source`` of the rows :mod:`~search_env.integrations.verl_data` writes: ``"searchqa/<protocol>"``.
DATA_SOURCE_PREFIX = "searchqa/"


def data_source(protocol: str) -> str:
    """The ``data_source`` value of ``protocol``'s rows."""
    return DATA_SOURCE_PREFIX + protocol


def _answers(ground_truth: Any) -> list[str]:
    """The golden answers from verl's ``ground_truth`` (``{"target": [...]}``, a list, or one answer)."""
    if isinstance(ground_truth, Mapping):
        ground_truth = ground_truth["target"]
    return [ground_truth] if isinstance(ground_truth, str) else [str(a) for a in ground_truth]


def _options(options: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """A preset's options from a row (a JSON object, as the data files hold them, or a mapping); lists
    become tuples, as the environment passes them."""
    if isinstance(options, str):
        options = json.loads(options)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in dict(options or {}).items()}


def _score(preset: str, options: Mapping[str, Any] | str | None, solution_str: str, ground_truth: Any,
           extra_info: Mapping[str, Any] | None) -> float:
    info = extra_info or {}
    result = score(preset, solution_str, _answers(ground_truth), question=info.get("question"),
                   ended_with_eos=bool(info.get("ended_with_eos", True)), **_options(options))
    return float(result.total)


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None,
                  **_: Any) -> float:
    """verl's reward function: the row's preset (``extra_info["reward"]``, else the protocol of
    ``data_source``'s) on the decoded response."""
    info = extra_info or {}
    if info.get("reward"):
        return _score(str(info["reward"]), info.get("reward_options"), solution_str, ground_truth, info)
    if not data_source.startswith(DATA_SOURCE_PREFIX):
        raise ValueError(f"data_source {data_source!r} is not {DATA_SOURCE_PREFIX}<protocol> and extra_info names no reward")
    protocol = get_protocol(data_source[len(DATA_SOURCE_PREFIX):])
    return _score(protocol.reward, protocol.reward_options, solution_str, ground_truth, info)


def _preset_scorer(preset: str) -> Callable[..., float]:
    def compute(data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None,
                **_: Any) -> float:
        info = extra_info or {}
        options = info.get("reward_options") if info.get("reward") == preset else None
        return _score(preset, options, solution_str, ground_truth, info)

    compute.__name__ = f"compute_score_{preset.replace('-', '_')}"
    compute.__doc__ = f"verl's reward function scoring with the {preset!r} preset (the row's options when it names it)."
    return compute


compute_score_search_r1 = _preset_scorer("search-r1")
compute_score_r1_searcher = _preset_scorer("r1-searcher")
compute_score_research = _preset_scorer("research")
compute_score_r_search = _preset_scorer("r-search")
compute_score_reasoning_search = _preset_scorer("reasoning-search")


class ToolEpisode:
    """One trajectory's search calls, answered by one SearchQA-v0 episode.

    Args:
        question / golden_answers: the trajectory's question (the episode's example).
        settings: :class:`~search_env.SearchQAEnv`'s keyword arguments (protocol, sources, ``top_k``,
            ``max_turns`` ...); episodes with the same settings share one set of sources.

    :meth:`call` writes the call as the protocol's tags around the argument (a query, or an NL-DAG plan;
    under the ``tool-calls`` protocols, a native call of the first tool, ending the turn) and steps the
    episode with it; what the environment appends is the tool's answer.
    """

    def __init__(self, question: str, golden_answers: Any, settings: Mapping[str, Any] | None = None) -> None:
        settings = dict(settings or {})
        self.episode = TextEpisode(episode_env(shared_env(settings), settings))
        self.protocol = self.episode.env.protocol
        self.episode.reset(example_from(question, _answers(golden_answers)))

    @property
    def ended(self) -> bool:
        """The episode has ended (an R1-Searcher empty query, or the token budget)."""
        return self.episode.done

    def call(self, argument: str) -> str:
        """The environment's answer to the call with ``argument``: its result block, or its error text."""
        if self.episode.done:
            return self.protocol.error_text("the episode has ended: no more searches")
        calling = self.protocol.tool_calling
        if calling is not None:  # a native call of the first tool, run at the turn's end (EOS), as the model ends it
            step = self.episode.step(calling.write([(calling.default_tool, argument)]))
        else:
            step = self.episode.step(f"{self.protocol.call_open} {argument} {self.protocol.call_close}")
        return step.observation
