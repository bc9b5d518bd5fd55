"""Run by the verl virtualenv's Python (``.ci/verl_venv.sh``; it has no pytest): verl builds
:class:`search_env.integrations.verl_tool.SearchQATool` from a tool config, and the tool, driven as verl's
``ToolAgentLoop`` drives it (``create``, ``execute`` with the trajectory's ``agent_data``, ``release`` per
call), answers a scripted episode's calls with ``gym.make("SearchQA-v0")``'s observations.

Prints one JSON line per check, ``{"check": ..., "ok": bool, "detail": ...}``; test_verl_tool.py asserts on them.
"""
from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from verl.tools.tool_registry import initialize_tools_from_config

from search_env import SearchQAEnv
from search_env.integrations.verl_data import rows
from tests.search_env.integrations.scripted import base_env, plan_tool, reference, script, shared_settings


REPO_ROOT = Path(__file__).resolve().parents[3]


def report(check: str, ok: bool, detail: object = None) -> None:
    print(json.dumps({"check": check, "ok": bool(ok), "detail": detail}), flush=True)


async def play(tool, row, arguments: list[str], argument_name: str) -> list[str]:
    """The calls of one trajectory, each as verl's agent loop makes it."""
    agent_data = SimpleNamespace(extra_fields={})
    kwargs = row["extra_info"]["tools_kwargs"][tool.name]
    texts = []
    for argument in arguments:
        instance_id, _ = await tool.create(create_kwargs=kwargs.get("create_kwargs", {}))
        response, reward, _ = await tool.execute(instance_id, {argument_name: argument}, agent_data=agent_data)
        await tool.release(instance_id)
        texts.append(response.text)
        assert reward == 0.0
    return texts


def check(protocol: str, base, folder: Path) -> None:
    config = REPO_ROOT / "examples" / "verl_tool_config.yaml"  # the README's config, for search-r1
    if protocol != "search-r1":
        config = folder / f"{protocol}.yaml"
        config.write_text(f"tools:\n  - class_name: search_env.integrations.verl_tool.SearchQATool\n"
                          f"    config: {{type: native, protocol: {protocol}}}\n", encoding="utf-8")
    [tool] = initialize_tools_from_config(str(config))
    schema = tool.get_openai_tool_schema().model_dump()
    argument = "plan" if protocol == "reasoning-search" else "query"
    report(f"{protocol}: schema", schema["function"]["name"] == "search"
           and schema["function"]["parameters"]["required"] == [argument])
    example = base.examples[3]
    settings = shared_settings(base, protocol)
    turns = script(protocol, example, plan_tool(base, protocol))
    ref = reference(settings, example, turns)
    row = rows(SearchQAEnv(**settings), [example], "train")[0]
    calls = [(turn.argument, env_ids) for turn, env_ids in zip(turns, ref.env_ids) if turn.argument is not None]
    texts = asyncio.run(play(tool, row, [a for a, _ in calls], argument))
    expected = [base.codec.decode(env_ids) for _, env_ids in calls]
    report(f"{protocol}: observations", texts == expected and all(expected), {"got": texts[:1], "expected": expected[:1]})


def main() -> None:
    base = base_env()  # the default settings, which the tool config's protocol-only settings also build
    with tempfile.TemporaryDirectory() as folder:
        for protocol in sys.argv[1:] or ("search-r1", "r1-searcher", "reasoning-search"):
            check(protocol, base, Path(folder))


if __name__ == "__main__":
    main()
