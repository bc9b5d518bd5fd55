"""Evaluate agents on SearchQA-v0 and print a results table.

With no arguments it runs on the embedded default (the synthetic world, BM25 sources, built-in
tokenizer): the scripted oracle, retrieve-then-answer and no-search agents under every built-in
protocol. Every figure is read from the episodes' trajectories (reward and its components, tool
calls), the same record a learner trains on.

Run: ``python -m benchmarks.evaluate [--episodes 100] [--protocols search-r1 research] [--json out.json]``
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import gymnasium as gym

import rewards
import search_env
from agents import NoSearchAgent, OracleAgent, RetrieveThenAnswerAgent, run_episode

AGENTS = {"oracle": OracleAgent, "retrieve-then-answer": RetrieveThenAnswerAgent, "no-search": NoSearchAgent}


def _progress(iterable, total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, leave=False, file=sys.stderr)


def evaluate(protocol: str, agent_name: str, episodes: int, seed: int = 0, **env_kwargs: Any) -> dict[str, Any]:
    """Run ``episodes`` episodes of one agent under one protocol; return the mean figures."""
    env = gym.make("SearchQA-v0", protocol=protocol, **env_kwargs)
    n = min(episodes, len(env.unwrapped.examples))
    rows = []
    for i in _progress(range(n), n, f"{protocol}/{agent_name}"):
        traj = run_episode(env, AGENTS[agent_name](), seed=seed, options={"index": i})
        answer = traj.reward_components.get("answer") or traj.answer or ""
        gold = set(env.unwrapped.examples[i].gold_passage_ids)
        found = {pid for call in traj.tool_calls for pid in call.passage_ids}
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
    env.close()
    summary = {"protocol": protocol, "agent": agent_name, "episodes": n}
    for key in rows[0]:
        values = [r[key] for r in rows if r[key] == r[key]]  # drop NaN (no gold passages)
        summary[key] = statistics.fmean(values) if values else float("nan")
    return summary


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=100, help="questions per (protocol, agent)")
    parser.add_argument("--protocols", nargs="+", default=search_env.available_protocols())
    parser.add_argument("--agents", nargs="+", default=list(AGENTS), choices=list(AGENTS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the table to this JSON file")
    args = parser.parse_args(argv)

    table = [evaluate(p, a, args.episodes, args.seed) for p in args.protocols for a in args.agents]
    header = f"{'protocol':18s} {'agent':22s} {'reward':>7s} {'EM':>6s} {'F1':>6s} {'searches':>8s} {'gold rec.':>9s} {'agent tok':>9s} {'env tok':>8s}"
    print(header)
    print("-" * len(header))
    for r in table:
        print(
            f"{r['protocol']:18s} {r['agent']:22s} {r['reward']:7.3f} {r['em']:6.3f} {r['f1']:6.3f} {r['searches']:8.2f} "
            f"{r['gold_recall']:9.3f} {r['agent_tokens']:9.1f} {r['env_tokens']:8.1f}"
        )
    print(f"({table[0]['episodes']} episodes each, synthetic world seed 0, episode seed {args.seed})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(table, f, indent=2)
    return table


if __name__ == "__main__":
    main()
