"""Evaluate agents on SearchQA-v0 and print a results table.

With no arguments it runs on the embedded default (the synthetic world, BM25 sources, built-in
tokenizer): the scripted oracle, retrieve-then-answer and no-search agents under every built-in
protocol. Every figure is read from the episodes' trajectories (reward and its components, tool
calls), the same record a learner trains on. Each protocol's reward is its own preset's, with the
range it spans printed beside it (R-Search's reaches 2.4, most others 1).

Real data: ``--dataset`` (a FlashRAG jsonl or Search-R1 parquet file) with ``--corpus`` (a jsonl
corpus the questions are answered from, searched with BM25). Other agents: ``--agents`` takes the
registered names below or ``module:Class``, a class built without arguments that has the scripted
agents' ``start(example)`` and ``next_text(writer, observation_text)``.

Run: ``python -m benchmarks.evaluate [--episodes 100] [--protocols search-r1 research]
[--dataset ../shared/data/hotpotqa_dev.jsonl --corpus ../shared/data/corpus.jsonl]
[--agents oracle mypackage.agents:MyAgent] [--json out.json]``
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
from pathlib import Path
from typing import Any

import gymnasium as gym

import rewards
import search_env
from agents import NoSearchAgent, OracleAgent, RetrieveThenAnswerAgent, run_episode
from search_env.console import HelpFormatter, progress

AGENTS: dict[str, type] = {"oracle": OracleAgent, "retrieve-then-answer": RetrieveThenAnswerAgent, "no-search": NoSearchAgent}
"""The agents ``--agents`` knows by name."""

NOTES = {
    "evidence_skipped": "evidence F1 counted 0: no evidence model was given (it needs one)",
    "f1_stand_in": "no judge was given: answer F1 stood in for the judge",
}


def resolve_agent(spec: str) -> type:
    """The agent class named by ``spec``: a key of :data:`AGENTS`, or ``module:Class``."""
    if spec in AGENTS:
        return AGENTS[spec]
    module_name, colon, class_name = spec.partition(":")
    if not colon or not module_name or not class_name:
        raise ValueError(f"unknown agent {spec!r}: give one of {', '.join(AGENTS)} or module:Class")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load agent {spec!r}: {exc}") from None
    missing = [method for method in ("start", "next_text") if not callable(getattr(cls, method, None))]
    if missing:
        raise ValueError(f"agent {spec!r} lacks {' and '.join(missing)}: see agents.scripted.agents.ScriptedAgent")
    return cls


def evaluate(protocol: str, agent: str | type, episodes: int, seed: int = 0, **env_kwargs: Any) -> dict[str, Any]:
    """Run ``episodes`` episodes of one agent (a registered name or a class) under one protocol;
    return the mean figures, the reward's range and notes on reward parts that could not count.

    ``env_kwargs`` go to ``gym.make``; sources passed in them are the caller's to close."""
    agent_cls = resolve_agent(agent) if isinstance(agent, str) else agent
    agent_name = agent if isinstance(agent, str) else agent_cls.__name__
    env = gym.make("SearchQA-v0", protocol=protocol, **env_kwargs)
    base = env.unwrapped
    n = min(episodes, len(base.examples))
    rows, notes = [], set()
    for i in progress(range(n), total=n, desc=f"{protocol}/{agent_name}", leave=False):
        traj = run_episode(env, agent_cls(), seed=seed, options={"index": i})
        components = traj.reward_components
        answer = components.get("answer") or traj.answer or ""
        gold = set(base.examples[i].gold_passage_ids)
        found = {pid for call in traj.tool_calls for pid in call.passage_ids}
        notes.update(key for key in NOTES if components.get(key) is True or components.get("judge_source") == key)
        rows.append(
            {
                "reward": traj.reward,
                "em": rewards.exact_match(str(answer), traj.golden_answers),
                "f1": rewards.f1_score(str(answer), traj.golden_answers),
                "searches": len(traj.tool_calls),
                "gold_recall": len(gold & found) / len(gold) if gold else float("nan"),
                "agent_tokens": int(sum(traj.producers)),
                "env_tokens": traj.counters["env_tokens"],
            }
        )
    if "sources" not in env_kwargs:
        env.close()
    preset = base.reward if isinstance(base.reward, str) else base.reward.name  # a name, or a StepReward
    summary: dict[str, Any] = {"protocol": protocol, "agent": agent_name, "episodes": n, "preset": preset}
    for key in rows[0]:
        values = [r[key] for r in rows if r[key] == r[key]]  # drop NaN (no gold passages)
        summary[key] = statistics.fmean(values) if values else float("nan")
    summary["reward_range"] = rewards.value_range(preset) if isinstance(base.reward, str) else None
    summary["notes"] = sorted(notes)
    return summary


def _range_text(value_range: tuple[float, float] | None) -> str:
    return f"[{value_range[0]:g}, {value_range[1]:g}]" if value_range is not None else "?"


def print_table(table: list[dict[str, Any]], data_line: str) -> None:
    width = max(22, *(len(r["agent"]) for r in table))
    header = (f"{'protocol':18s} {'agent':{width}s} {'reward':>7s} {'of range':>10s} {'EM':>6s} {'F1':>6s} {'searches':>8s} "
              f"{'gold rec.':>9s} {'agent tok':>9s} {'env tok':>8s}")
    print(header)
    print("-" * len(header))
    for r in table:
        print(
            f"{r['protocol']:18s} {r['agent']:{width}s} {r['reward']:7.3f} {_range_text(r['reward_range']):>10s} {r['em']:6.3f} "
            f"{r['f1']:6.3f} {r['searches']:8.2f} {r['gold_recall']:9.3f} {r['agent_tokens']:9.1f} {r['env_tokens']:8.1f}"
        )
    print(f"({data_line})")
    print("reward: the protocol's reward preset, which spans the range beside it at its default options ('?': it declares none); "
          "EM/F1: the extracted answer against the golds; gold rec.: gold passages among those retrieved")
    notes = {}
    for r in table:
        for key in r["notes"]:
            notes.setdefault((r["preset"], key), []).append(r["agent"])
    for (preset, key), agents in sorted(notes.items()):
        print(f"note: {preset}: {NOTES[key]} ({', '.join(agents)})")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.evaluate", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--episodes", type=int, default=100, help="questions per (protocol, agent)")
    parser.add_argument("--protocols", nargs="+", default=search_env.available_protocols(), help="registered protocol names")
    parser.add_argument("--agents", "--agent", nargs="+", default=list(AGENTS), metavar="AGENT",
                        help=f"registered names ({', '.join(AGENTS)}) or module:Class")
    parser.add_argument("--dataset", type=Path, default=None,
                        help="questions: a FlashRAG jsonl or Search-R1 parquet file (unset: the synthetic world, seed 0)")
    parser.add_argument("--corpus", type=Path, default=None, help="jsonl corpus the --dataset questions are answered from, searched with BM25")
    parser.add_argument("--seed", type=int, default=0, help="episode seed")
    parser.add_argument("--json", help="also write the table to this JSON file")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be at least 1, got {args.episodes}")
    if (args.dataset is None) != (args.corpus is None):
        parser.error("give --dataset and --corpus together: the synthetic world has its own sources, real questions need a corpus")
    for spec in args.agents:
        try:
            resolve_agent(spec)
        except ValueError as exc:
            parser.error(str(exc))

    env_kwargs: dict[str, Any] = {}
    data_line = f"{{n}} episodes each, synthetic world seed 0, episode seed {args.seed}"
    if args.dataset is not None:
        from search_env.data.loaders import load_dataset
        from search_env.sources.bm25 import BM25Source

        env_kwargs["dataset"] = load_dataset(args.dataset, limit=args.episodes)
        env_kwargs["sources"] = BM25Source(args.corpus, name="wiki")
        data_line = f"{{n}} episodes each, {args.dataset} searched with BM25 over {args.corpus}, episode seed {args.seed}"
    try:
        table = [evaluate(p, spec, args.episodes, args.seed, **env_kwargs) for p in args.protocols for spec in args.agents]
    finally:
        if "sources" in env_kwargs:
            env_kwargs["sources"].close()
    print_table(table, data_line.format(n=table[0]["episodes"]))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(table, f, indent=2)
    return table


if __name__ == "__main__":
    main()
