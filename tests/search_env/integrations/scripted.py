"""Scripted episodes for the adapters' fidelity tests: the same turns played through
``gym.make("SearchQA-v0")`` give the reference tokens and reward.

Imports only search_env and gymnasium, so GEM's virtualenv (which has no pytest) runs it too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym

import search_env  # noqa: F401 - registers SearchQA-v0
from search_env import ENVIRONMENT, SEED_PROTOCOLS, SearchQAEnv, get_protocol
from search_env.data.example import QAExample

#: Every built-in protocol: the five seed systems, the compact demo dialect and native tool calls.
PROTOCOLS = (*SEED_PROTOCOLS, "search-r1-compact", "tool-calls")


@dataclass
class Turn:
    """One generated turn: ``before`` the call, the call's ``argument`` (None: no call), ``after`` it."""

    before: str
    argument: str | None = None
    after: str = ""

    def text(self, protocol: str) -> str:
        p = get_protocol(protocol)
        if self.argument is None:
            call = ""
        elif p.tool_calling is not None:  # a native call, run when the turn ends, of the synthetic world's
            call = p.tool_calling.write([("all", self.argument)])  # default source: the adapters' first tool
        else:
            call = f"{p.call_open} {self.argument} {p.call_close}"
        return self.before + call + self.after


def script(protocol: str, example: QAExample, tool: str) -> list[Turn]:
    """Turns for ``protocol`` that search (twice where the protocol's budget allows) and then answer
    ``example`` correctly, with text generated past a stop string where a trainer might let it through.
    ``tool``: a plan tool the environment offers (NL-DAG protocols)."""
    answer = example.golden_answers[0]
    query = example.question.rstrip("?")
    if protocol == "reasoning-search":
        plan = f"\nNodes:\nA: {query} ({tool})\nB: who or what is it ({tool})\nEdges:\nA -> B\n"
        return [Turn("<think> I plan. </think>", plan, " text after the stop string"), Turn(f"<answer> {answer} </answer>")]
    if protocol == "r1-searcher":
        return [Turn(" I search. </think>", query), Turn(" ", f"{query} again"), Turn(f"<answer> {answer} </answer>")]
    if protocol == "research":  # the answer's close tag is no stop string: the turn runs on to EOS
        return [Turn("<think> search </think> ", query, " after the stop"),
                Turn(f" <think> ok </think> <answer> The final answer is \\[ \\boxed{{{answer}}} \\] </answer>")]
    if protocol == "tool-calls":  # calls end their turn (EOS), the answer's close tag stops the last one
        return [Turn("<think> I need facts. </think>\n", query), Turn("<think> more </think>\n", f"{query} details"),
                Turn(f"<think> found </think><answer> {answer} </answer> trailing text")]
    if protocol == "r-search":
        return [Turn("I should look it up. ", query), Turn(f"<original_evidence> {query} </original_evidence><answer> {answer} </answer>")]
    return [Turn("<think> I need facts. </think>", query), Turn("<think> and more </think>", f"{query} details"),
            Turn(f"<think> found </think><answer> {answer} </answer> trailing text")]


def stop_cut(codec: Any, protocol: str, ids: list[int]) -> tuple[list[int], bool]:
    """The shortest prefix of ``ids`` whose text holds a stop string, and whether one did (worked out from
    decoded prefixes, independently of the adapters' byte scan)."""
    stops = get_protocol(protocol).stop_strings
    for k in range(1, len(ids) + 1):
        if any(stop in codec.decode(ids[:k]) for stop in stops):
            return ids[:k], True
    return ids, False


@dataclass
class Reference:
    """A scripted episode as ``gym.make("SearchQA-v0")`` plays it."""

    prompt_ids: list[int]
    chunks: list[list[int]]  # what each turn stepped (cut at its stop string, EOS added when it had none)
    env_ids: list[list[int]]  # the environment's tokens after each turn
    token_ids: list[int]
    trained: list[int]
    reward: float
    response_text: str
    end_reason: str | None


def base_env(**settings: Any) -> SearchQAEnv:
    """The environment whose data, sources and tokenizer every test environment shares."""
    return SearchQAEnv(**settings)


def shared_settings(base: SearchQAEnv, protocol: str) -> dict[str, Any]:
    """Settings for ``protocol`` on ``base``'s data, sources and tokenizer (cheap to build again)."""
    return {"protocol": protocol, "dataset": base.examples, "sources": base.sources, "tokenizer": base.codec,
            "max_new_tokens": 256}


def plan_tool(base: SearchQAEnv, protocol: str) -> str:
    env = SearchQAEnv(**shared_settings(base, protocol))
    tools = env.protocol.plan_tools
    return tools[0][0] if tools else ""


def reference(settings: dict[str, Any], example: QAExample, turns: list[Turn]) -> Reference:
    """Play ``turns`` through ``gym.make("SearchQA-v0", **settings)``: each turn's ids cut after the first
    stop string, with the end-of-sequence id added when the turn held none (the model ended it)."""
    env = gym.make("SearchQA-v0", **settings)
    protocol = settings["protocol"]
    codec = env.unwrapped.codec
    obs, _ = env.reset(options={"example": example})
    chunks, env_ids, reward = [], [], 0.0
    for turn in turns:
        ids, stopped = stop_cut(codec, protocol, codec.encode(turn.text(protocol)))
        chunk = ids if stopped else ids + [min(codec.eos_ids)]
        obs, r, terminated, truncated, _ = env.step(chunk)
        chunks.append(chunk)
        env_ids.append([t for t, who in zip(obs["token_ids"], obs["producers"]) if who == ENVIRONMENT])
        reward += r
        if terminated or truncated:
            break
    else:
        raise AssertionError("the script did not end the episode")
    traj = env.unwrapped.trajectory  # not closed: its sources are the shared ones
    return Reference(list(traj.token_ids[:traj.prompt_length]), chunks, env_ids, list(traj.token_ids), list(traj.trained),
                     reward, traj.response_text, traj.end_reason)
