"""Classic RL on the same environment: Stable-Baselines3 PPO on macro actions, against a random policy.

    python -m benchmarks.classic_rl [--timesteps N] [--seeds 0 1 2] [--output-dir runs/classic_rl] [--quick]

The environment is ``SearchQA-v0`` on the built-in synthetic world, restricted to its chain questions
(1 and 2 hops), wrapped in :class:`~search_env.wrappers.MacroActions`: each turn the policy picks one
of a few candidate calls (search the question's subject, the question, or a value of the last results;
answer with a value) and observes a small feature vector; the reward is the environment's own
(search-r1's: exact match of the answer). PPO (``MlpPolicy``) trains on the questions of one world
(``--world-seed``) and is evaluated greedily on held-out questions of a world with another seed
(``--eval-world-seed``), before training and every ``--eval-every`` timesteps; the random policy
(uniform over the actions) and the scripted policy that reads the observation (the strategy the
observation is made for) play the same held-out questions once per seed. Every held-out question is
played once per evaluation, so an evaluation is a mean over ``--eval-questions`` episodes.

Prints a table (medians over the seeds) and writes ``classic_rl.md`` (the table), ``classic_rl.csv`` (every
evaluation), ``classic_rl.json`` (the settings and every evaluation) and ``classic_rl.png`` (held-out reward
against timesteps) into ``--output-dir``.
``--quick`` runs about a minute on two CPU cores. Measured results are in ``benchmarks/RESULTS.md``.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import gymnasium as gym
import numpy as np
from numpy.typing import NDArray

from benchmarks.common.report_files import command_line, write_results
from search_env._optional import requires_extra
from search_env.console import HelpFormatter
from search_env.resolve import resolve_sources
from search_env.synthetic import generate_world
from search_env.wrappers import MacroActions

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PPO_SETTINGS", "chain_env", "evaluate", "format_table", "main", "plot", "run_seed"]

PPO_SETTINGS: dict[str, Any] = {"n_steps": 256, "batch_size": 64}
"""Stable-Baselines3's PPO defaults but for the rollout length: an episode is 2-4 turns, so the default
2048 steps per update would update only a handful of times in a short run; 256 steps (about 100
episodes) per update give the curve a point per update."""

WORLD_QUESTIONS = 1000
"""Questions drawn per world; 60% of them are chain questions (half 1-hop, half 2-hop)."""

#: The settings ``--quick`` uses for what the command line leaves out: (timesteps, eval_every, eval_questions).
QUICK = (3072, 512, 100)
FULL = (10240, 1024, 200)

Policy = Callable[[NDArray[np.float32]], int]
_HOPS = (1, 2)


def chain_env(world_seed: int) -> MacroActions:
    """``SearchQA-v0`` on the chain questions of the synthetic world of ``world_seed`` (its default
    sources: BM25 per world source and over all of them), with macro actions."""
    world = generate_world(seed=world_seed, n_questions=WORLD_QUESTIONS)
    chain = [question for question in world.questions if question.metadata["type"] == "chain"]
    return MacroActions(gym.make("SearchQA-v0", dataset=chain, sources=resolve_sources(None, world)))


def evaluate(env: MacroActions, policy: Policy, questions: int) -> dict[str, float]:
    """Mean reward of ``policy`` on the first ``questions`` questions of ``env``, each played once:
    ``reward`` over all of them and ``reward_<h>hop`` by hop count."""
    examples = env.unwrapped.examples
    if questions > len(examples):
        raise ValueError(f"asked for {questions} held-out questions, the held-out world has {len(examples)}")
    rewards: dict[int, list[float]] = {hops: [] for hops in _HOPS}
    for index in range(questions):
        observation, _ = env.reset(options={"index": index})
        reward, done = 0.0, False
        while not done:
            observation, reward, terminated, truncated, _ = env.step(policy(observation))
            done = terminated or truncated
        rewards[examples[index].metadata["hops"]].append(reward)
    every = [r for hops in _HOPS for r in rewards[hops]]
    return {"reward": float(np.mean(every)), **{f"reward_{hops}hop": float(np.mean(rewards[hops])) for hops in _HOPS}}


def run_seed(seed: int, train_env: MacroActions, eval_env: MacroActions, *, timesteps: int, eval_every: int,
             eval_questions: int, log: Callable[[str], Any] = print) -> list[dict[str, Any]]:
    """One seed: the held-out reward of the random and the scripted policy
    (:meth:`~search_env.wrappers.MacroActions.scripted_action`), then PPO's before training and every
    ``eval_every`` timesteps up to ``timesteps``. One row per evaluation, with the training time so far
    (wall and process CPU seconds, evaluations left out: a shared machine's wall clock depends on the
    others' load)."""
    with requires_extra("sb3", "the classic-RL benchmark"):
        from stable_baselines3 import PPO

    rng = np.random.default_rng(seed)
    n_actions = int(train_env.action_space.n)
    baselines = {"random": lambda _: int(rng.integers(n_actions)), "scripted": eval_env.scripted_action}
    rows = [{"seed": seed, "policy": name, "timesteps": 0, "train_seconds": 0.0, "train_cpu_seconds": 0.0,
             **evaluate(eval_env, policy, eval_questions)} for name, policy in baselines.items()]
    model = PPO("MlpPolicy", train_env, seed=seed, device="cpu", **PPO_SETTINGS)

    def greedy(observation: NDArray[np.float32]) -> int:
        return int(model.predict(observation, deterministic=True)[0])

    seconds = cpu_seconds = 0.0
    while True:
        row = {"seed": seed, "policy": "PPO", "timesteps": model.num_timesteps, "train_seconds": round(seconds, 2),
               "train_cpu_seconds": round(cpu_seconds, 2), **evaluate(eval_env, greedy, eval_questions)}
        rows.append(row)
        log(f"seed {seed} PPO at {row['timesteps']} timesteps: held-out reward {row['reward']:.3f} (1-hop "
            f"{row['reward_1hop']:.3f}, 2-hop {row['reward_2hop']:.3f}; random {rows[0]['reward']:.3f}, scripted "
            f"{rows[1]['reward']:.3f}), {seconds:.0f} s")
        if model.num_timesteps >= timesteps:
            return rows
        start, cpu_start = time.perf_counter(), time.process_time()
        model.learn(min(eval_every, timesteps - model.num_timesteps), reset_num_timesteps=False)
        seconds, cpu_seconds = seconds + time.perf_counter() - start, cpu_seconds + time.process_time() - cpu_start


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def format_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: the random policy, PPO before training, PPO at the end and the scripted policy, each
    the median over the seeds (the last column lists the seeds' own values), and the timesteps PPO took
    to first reach a held-out reward of 0.9."""
    seeds = sorted({row["seed"] for row in rows})
    ppo = [row for row in rows if row["policy"] == "PPO"]
    last = [max((row for row in ppo if row["seed"] == seed), key=lambda row: row["timesteps"]) for seed in seeds]
    groups = [("random", [row for row in rows if row["policy"] == "random"]),
              ("PPO, untrained", [row for row in ppo if row["timesteps"] == 0]),
              (f"PPO, {max(row['timesteps'] for row in last)} timesteps", last),
              ("scripted (reads the observation)", [row for row in rows if row["policy"] == "scripted"])]
    lines = ["| policy | held-out reward | 1-hop | 2-hop | per seed |", "| --- | --- | --- | --- | --- |"]
    for name, group in groups:
        per_seed = ", ".join(f"{row['reward']:.3f}" for row in sorted(group, key=lambda row: row["seed"]))
        lines.append(f"| {name} | {_median(group, 'reward'):.3f} | {_median(group, 'reward_1hop'):.3f} | "
                     f"{_median(group, 'reward_2hop'):.3f} | {per_seed} |")
    reached = []
    for seed in seeds:
        hits = [row["timesteps"] for row in ppo if row["seed"] == seed and row["reward"] >= 0.9]
        reached.append(str(min(hits)) if hits else "not reached")
    times = [f"{row['train_seconds']:.0f} / {row['train_cpu_seconds']:.0f}" for row in last]
    lines.append("")
    lines.append(f"Seeds {', '.join(map(str, seeds))}. PPO first reached a held-out reward of 0.9 at timesteps: "
                 f"{', '.join(reached)}. Training seconds (wall / process CPU): {', '.join(times)}.")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], figure: Figure) -> None:
    """Held-out reward against timesteps: each seed's PPO curve, their median, and the random and
    scripted policies' median rewards."""
    ppo = [row for row in rows if row["policy"] == "PPO"]
    steps = sorted({row["timesteps"] for row in ppo})
    ax = figure.subplots()
    for seed in sorted({row["seed"] for row in ppo}):
        mine = [row for row in ppo if row["seed"] == seed]
        ax.plot([row["timesteps"] for row in mine], [row["reward"] for row in mine], color="C0", alpha=0.3, linewidth=1)
    median = [_median([row for row in ppo if row["timesteps"] == step], "reward") for step in steps]
    ax.plot(steps, median, "-o", color="C0", label="PPO (median over seeds; thin: each seed)")
    for name, color, style in (("random", "C3", "--"), ("scripted", "C2", ":")):
        ax.axhline(_median([row for row in rows if row["policy"] == name], "reward"), color=color, linestyle=style,
                   label=f"{name} policy (median over seeds)")
    ax.set(xlabel="PPO timesteps (macro actions)", ylabel="mean held-out reward", ylim=(-0.02, 1.05),
           title="SB3 PPO on SearchQA-v0 macro actions (1- and 2-hop chain questions)")
    ax.title.set_fontsize(10)
    ax.legend(loc="lower right", bbox_to_anchor=(1, 0.1), fontsize=8)


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.classic_rl", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--timesteps", type=int, help=f"PPO timesteps per seed (default: {FULL[0]}, --quick: {QUICK[0]})")
    parser.add_argument("--eval-every", type=int, help=f"timesteps between held-out evaluations (default: {FULL[1]}, --quick: {QUICK[1]})")
    parser.add_argument("--eval-questions", type=int,
                        help=f"held-out questions per evaluation (default: {FULL[2]}, --quick: {QUICK[2]})")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one PPO run (and random policy) per seed")
    parser.add_argument("--world-seed", type=int, default=0, help="seed of the training world")
    parser.add_argument("--eval-world-seed", type=int, default=1, help="seed of the held-out world")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/classic_rl"),
                        help="where classic_rl.md, .csv, .json and .png go")
    parser.add_argument("--quick", action="store_true", help="a run of about a minute (the --quick settings above)")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    timesteps, eval_every, eval_questions = (given if given is not None else default for given, default in
                                             zip((args.timesteps, args.eval_every, args.eval_questions), defaults))
    if timesteps < 1 or eval_every < 1 or eval_questions < 1:
        parser.error("--timesteps, --eval-every and --eval-questions must be >= 1")
    if args.world_seed == args.eval_world_seed:
        parser.error("the held-out world needs a seed of its own (--eval-world-seed != --world-seed)")

    with requires_extra("sb3", "the classic-RL benchmark"):
        import torch

    torch.set_num_threads(1)  # a 64-unit MLP gains nothing from more; on shared cores they cost (RESULTS.md)
    train_env, eval_env = chain_env(args.world_seed), chain_env(args.eval_world_seed)
    if eval_questions > len(eval_env.unwrapped.examples):
        parser.error(f"--eval-questions {eval_questions}: the held-out world has {len(eval_env.unwrapped.examples)} chain questions")
    rows = [row for seed in args.seeds for row in run_seed(seed, train_env, eval_env, timesteps=timesteps,
                                                             eval_every=eval_every, eval_questions=eval_questions)]
    table = format_table(rows)
    print()
    print(table)
    settings = {**vars(args), "timesteps": timesteps, "eval_every": eval_every, "eval_questions": eval_questions,
                "ppo": PPO_SETTINGS}
    write_results(args.output_dir, "classic_rl", title="Stable-Baselines3 PPO on macro actions, against a random policy",
                  command=command_line(parser.prog, argv), body=table, rows=rows, data={"settings": settings, "evaluations": rows},
                  plot=lambda figure: plot(rows, figure))
    return table


if __name__ == "__main__":
    main()
