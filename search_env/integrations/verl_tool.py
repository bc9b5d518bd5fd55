"""SearchQA-v0's retrieval behind verl's tool interface: :class:`SearchQATool`, a verl ``BaseTool``.

verl's multi-turn agent loop (``ToolAgentLoop``) builds its tools from a tool config (``class_name``,
``config``, ``tool_schema``) and, for each call the model makes, runs ``create`` (with the row's
``tools_kwargs[<tool name>]["create_kwargs"]``), ``execute`` and ``release``. Each trajectory's calls
go to one SearchQA-v0 episode (:class:`search_env.integrations.verl.ToolEpisode`, kept in the agent
loop's per-trajectory ``agent_data.extra_fields``), so the text the tool returns is the environment's
observation for that call, and the protocol's search budget holds across the trajectory's calls.

Tool config (``config``: ``type: native`` plus :class:`~search_env.SearchQAEnv`'s keyword arguments;
``tool_schema`` may be left out, :func:`default_tool_schema` is used)::

    tools:
      - class_name: search_env.integrations.verl_tool.SearchQATool
        config: {type: native, protocol: search-r1}

The row's ``create_kwargs`` hold ``question`` and ``ground_truth`` (written by
:mod:`search_env.integrations.verl_data`). Needs verl (extra ``verl``; its own virtualenv here:
``.ci/verl_venv.sh``).
"""
from __future__ import annotations

import asyncio
from typing import Any, Mapping

from search_env._optional import requires_extra
from search_env.integrations.verl import ToolEpisode
from search_env.protocols import get_protocol

with requires_extra("verl", "the verl tool"):
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["SearchQATool", "default_tool_schema", "TOOL_NAME"]

#: The tool's default function name (the key of the row's ``tools_kwargs``).
TOOL_NAME = "search"

#: Where a trajectory's episode is kept in the agent loop's ``agent_data.extra_fields``.
_EPISODE_FIELD = "searchqa_episode"


def argument_name(protocol: str) -> str:
    """The tool's one argument: ``plan`` for an NL-DAG protocol, else ``query``."""
    return "plan" if get_protocol(protocol).call_kind == "dag" else "query"


def default_tool_schema(protocol: str = "search-r1", name: str = TOOL_NAME) -> OpenAIFunctionToolSchema:
    """The OpenAI function schema of the tool for ``protocol``."""
    argument = argument_name(protocol)
    what = ("an NL-DAG search plan: a 'Nodes:' line, one 'Label: sub-query (Tool)' line per node, then an 'Edges:' line"
            if argument == "plan" else "the search query")
    return OpenAIFunctionToolSchema.model_validate({
        "type": "function",
        "function": {"name": name, "description": "Search for passages that help answer the question.",
                     "parameters": {"type": "object", "properties": {argument: {"type": "string", "description": what}},
                                    "required": [argument]}},
    })


def _plain(config: Any) -> dict[str, Any]:
    """The tool config as a plain dict (verl passes an OmegaConf node or a dict)."""
    if not isinstance(config, Mapping) and hasattr(config, "items"):
        from omegaconf import OmegaConf

        config = OmegaConf.to_container(config, resolve=True)
    return dict(config or {})


class SearchQATool(BaseTool):
    """verl's ``BaseTool`` answering search calls with a SearchQA-v0 episode per trajectory (see the
    module docstring).

    Args:
        config: ``type`` (verl's) and :class:`~search_env.SearchQAEnv`'s keyword arguments.
        tool_schema: the function schema (None: :func:`default_tool_schema` for the configured protocol).
    """

    def __init__(self, config: Any, tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        config = _plain(config)
        self.settings = {key: value for key, value in config.items() if key != "type"}
        protocol = str(self.settings.get("protocol", "search-r1"))
        self.argument = argument_name(protocol)
        super().__init__(config, tool_schema or default_tool_schema(protocol))
        self._rows: dict[str, tuple[str, Any]] = {}  # instance id -> (question, ground truth)
        self._own: dict[str, ToolEpisode] = {}  # episodes of calls made without verl's agent_data

    async def create(self, instance_id: str | None = None, create_kwargs: Mapping[str, Any] | None = None,
                     **kwargs: Any) -> tuple[str, ToolResponse]:
        """Note the trajectory's question and answers (``create_kwargs``: ``question``, ``ground_truth``)."""
        instance_id, response = await super().create(instance_id)
        row = dict(create_kwargs or kwargs)
        if "question" not in row or "ground_truth" not in row:
            raise ValueError("the row's tools_kwargs must give create_kwargs with 'question' and 'ground_truth'")
        self._rows[instance_id] = (str(row["question"]), row["ground_truth"])
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], agent_data: Any = None,
                      **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        """Answer one call; returns the environment's observation text, no step reward, and the metrics."""
        question, ground_truth = self._rows[instance_id]
        store = agent_data.extra_fields if agent_data is not None else self._own
        key = _EPISODE_FIELD if agent_data is not None else instance_id
        episode = store.get(key)
        if episode is None:
            episode = store[key] = ToolEpisode(question, ground_truth, self.settings)
        text = await asyncio.to_thread(episode.call, str(parameters.get(self.argument, "")))
        return ToolResponse(text=text), 0.0, {"searches": len(episode.episode.trajectory.tool_calls)}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Forget the instance (a trajectory's episode lives in its ``agent_data``)."""
        self._rows.pop(instance_id, None)
        self._own.pop(instance_id, None)
