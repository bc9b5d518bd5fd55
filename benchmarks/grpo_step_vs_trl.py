"""Speed of one GRPO step: our trainer against TRL's ``GRPOTrainer`` (its ``rollout_func`` hook), side by side.

Both sides train the same tiny model (:func:`agents.policies.loading.tiny_causal_lm` over the built-in tokenizer,
the same initial weights) on the same questions of a synthetic world, in the same environment
(:class:`search_env.BatchSearchQAEnv`, BM25), with the same settings: questions x
group size, agent-token budget per episode, sampling temperature (top-p off), AdamW at the same
learning rate, one update epoch of one optimiser step, the same micro-batch, token-mean loss over the
whole batch, group-std-scaled advantages, clip 0.2, KL off (or on, k3, in both), fp32, one torch thread.
``--task demo`` (the default) is the learning benchmark's task, the one the README's command trains:
a one-line prompt (12 tokens) in a compact Search-R1 dialect, a large world, a 2x64 model;
``--task search-r1`` keeps Search-R1's 276-token instruction prompt, the default world and a 2x128 model.

- Ours: :meth:`agents.training.trainer.Trainer.train_step` (``HFSampler`` keeping each row's KV cache across
  turns, :func:`agents.rollout.collect.collect_rollouts`, log-probs of the rollout policy, GRPO advantages, the
  update through ``TorchBackend``).
- TRL: ``GRPOTrainer.train()`` with the public adapter :class:`search_env.integrations.trl.SearchQARollout` as its
  ``rollout_func``: per turn, transformers ``generate`` over each whole context (re-prefilled each turn,
  which is what the hook gives a TRL user), the chunk to the environment, its tokens appended.

What each side does by its own design, and keeps here: both apply the LM head only where log-probs
are needed (TRL: completion positions, through its chunked ``fused_lm_head``; ours: from the first
trained column) and, with one update pass of one optimiser step, take the old log-probs from the
update's own forward pass instead of running one more. TRL pads a whole generation batch to its
longest episode; ours groups episodes by length into micro-batches trimmed to their own longest one.
``GRPOConfig`` fields set on TRL's side are listed, with the reason, in
:func:`benchmarks.peers.trl_grpo.build_trainer`.

The machine's speed drifts, so the two sides' steps alternate (TRL, ours, TRL, ours ...): TRL's loop
calls ours between two of its steps. The first ``--warmup`` steps of each side are dropped; the table
shows medians of the next ``--steps``: rollout (episodes played), update (everything else in the step),
total, agent tokens per second of the total, and what each side did per step (episodes, agent, env and
prompt tokens per episode, searches per episode) - both sample from the same policy, so these agree up
to sampling noise (at lr 1e-6 a few updates leave both policies where they started; TRL's linear
learning-rate decay against our constant rate changes no cost).

A random initial policy rarely closes a search tag, so by default the policy is first warm-started
(:func:`agents.training.warm_start.warm_start` on scripted demonstrations, ``--warm-start-steps``; ``--policy-cache DIR`` keeps
the weights for the next run, :mod:`benchmarks.common.warm_start_cache`) and episodes are multi-turn, as in training: after 120 steps about one
search and 26 agent tokens per episode on the demo task (one minute of warm start), 1.4 searches and 34
agent tokens on search-r1 (several minutes). ``--warm-start-steps 0`` measures from the random policy instead
(single-turn episodes that run to the token budget).

Run: ``python -m benchmarks.grpo_step_vs_trl`` (``--help`` for options); needs the ``trl`` extra.
``--output-dir DIR`` writes the table as ``grpo_step_vs_trl.md`` and ``.csv``, and with every step's record
as ``grpo_step_vs_trl.json``, there.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from agents.training.build import build_trainer
from agents.training.config import TrainConfig
from agents.training.trainer import Trainer
from benchmarks.common.report_files import command_line, markdown_table, write_results
from benchmarks.common.warm_start_cache import warm_started
from search_env import BatchSearchQAEnv
from search_env.console import HelpFormatter
from search_env.trajectory import Trajectory

TARGET_X = 1.5  #: ours must take at most 1 / TARGET_X of TRL's time per step
WARM_START_BATCH = 16  #: demonstrations per warm-start step
PROG = "python -m benchmarks.grpo_step_vs_trl"


@dataclass
class StepRecord:
    """One side's step: where its time went and what it did."""

    rollout_s: float
    total_s: float
    episodes: int
    prompt_tokens: int
    agent_tokens: int
    env_tokens: int
    searches: int
    reward: float

    @property
    def update_s(self) -> float:
        return self.total_s - self.rollout_s


def work_record(trajectories: Sequence[Trajectory], rollout_s: float, total_s: float) -> StepRecord:
    """A step's record from the episodes it trained on."""
    agent = sum(int(t.agent_mask.sum()) for t in trajectories)
    return StepRecord(
        rollout_s=rollout_s, total_s=total_s, episodes=len(trajectories),
        prompt_tokens=sum(t.prompt_length for t in trajectories), agent_tokens=agent,
        env_tokens=sum(len(t.token_ids) - t.prompt_length for t in trajectories) - agent,
        searches=sum(len(t.tool_calls) for t in trajectories),
        reward=sum(t.reward for t in trajectories) / max(len(trajectories), 1),
    )


def build_ours(args: argparse.Namespace, output_dir: str) -> Trainer:
    """Our trainer for ``args.task`` with the benchmark's shared settings; no evaluation, logs or
    checkpoints inside a step. ``demo``: the learning benchmark's task (the demo recipe,
    ``agents/configs/demo.yaml``: its compact Search-R1 dialect, large chain-question world and model
    shape); ``search-r1``: Search-R1's own prompt over the default synthetic world, with the default
    model shape. The environment steps in-process on both sides (``rollout.env_worker`` off), as TRL's
    ``rollout_func`` steps it."""
    shared = {
        "run.seed": args.seed, "run.steps": args.warmup + args.steps, "rollout.questions_per_step": args.prompts,
        "algorithm.group_size": args.group, "env.max_new_tokens": args.max_new_tokens, "rollout.temperature": args.temperature,
        "rollout.top_p": 1.0, "optim.learning_rate": args.lr, "optim.micro_batch_size": args.micro_batch,
        "optim.update_epochs": 1, "optim.mini_batch_size": 0, "algorithm.kl_coef": args.kl_coef,
        "algorithm.kl_estimator": "k3", "algorithm.entropy_coef": 0.0, "algorithm.loss_agg_mode": "token-mean",
        "algorithm.scale_rewards": True, "algorithm.clip_low": 0.2, "algorithm.clip_high": 0.2,
        "optim.max_grad_norm": 1.0, "optim.weight_decay": 0.0, "warm_start.steps": args.warm_start_steps,
        "warm_start.batch_size": WARM_START_BATCH, "eval.questions": 0, "eval.every": 0, "run.save_every": 0,
        "run.report_to": [], "run.progress": False, "run.output_dir": output_dir, "run.num_threads": 1,
        "rollout.env_worker": False,
    }
    if args.task == "demo":
        from benchmarks.learning import demo_config

        config = demo_config().updated({"algo": "grpo", **shared})
    else:
        config = TrainConfig("grpo").updated({"model.name": "tiny", "env.protocol": "search-r1", "data.dataset": "synthetic",
                                              "data.world_seed": args.seed, **shared})
    return build_trainer(config)  # eval.questions 0: no held-out environment, no evaluation


def our_step(trainer: Trainer) -> StepRecord:
    """One :meth:`Trainer.train_step`; the episodes are the environment's last ones (one wave per step)."""
    metrics = trainer.train_step()
    return work_record([env.trajectory for env in trainer.env.envs], metrics["time/rollout"], metrics["time/step"])


def run(args: argparse.Namespace) -> tuple[list[StepRecord], list[StepRecord]]:
    """Both sides' step records (warm-up steps included), TRL's and ours alternated."""
    from benchmarks.peers.trl_grpo import StepClock, build_trainer as build_trl_trainer
    from search_env.integrations.trl import SearchQARollout, hf_tokenizer

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="grpo-vs-trl-") as workdir:  # models, TRL's output dir
        ours = build_ours(args, os.path.join(workdir, "ours"))
        config = ours.config
        if args.warm_start_steps > 0:
            warm_started(ours.backend, config, ours.env, args.policy_cache)
        first = ours.env.envs[0]
        examples = first.examples
        env = BatchSearchQAEnv(
            ours.env.num_envs, protocol=first.protocol, dataset=examples, sources=first.sources, tokenizer=first.codec,
            max_new_tokens=first.max_new_tokens, max_context=first.max_context, max_turns=first.max_turns,
        )
        # The same questions in the same order as our trainer takes them.
        order = copy.deepcopy(ours.order)
        chosen = [examples[i] for i in order.take(args.prompts * config.run.steps)]
        tokenizer = hf_tokenizer(first.codec)
        rollout = SearchQARollout(env, examples=chosen, tokenizer=tokenizer)
        trl_records: list[StepRecord] = []
        our_records: list[StepRecord] = []

        def between(step: int) -> None:
            trl_records.append(work_record([e.trajectory for e in env.envs], rollout.last.seconds, clock.step_seconds[-1]))
            our_records.append(our_step(ours))

        clock = StepClock(between)
        # TRL loads the policy (and, with KL on, its reference) from a folder, as its users do.
        model_dir = os.path.join(workdir, "model")
        ours.policy.model.save_pretrained(model_dir)
        peer = build_trl_trainer(
            model_dir, tokenizer, rollout, [ex.question for ex in chosen], steps=config.run.steps,
            group_size=args.group, micro_batch_size=args.micro_batch, learning_rate=args.lr, temperature=args.temperature,
            top_p=1.0, beta=args.kl_coef, max_new_tokens=args.max_new_tokens, seed=args.seed, callbacks=[clock],
            output_dir=os.path.join(workdir, "trl"),
        )
        peer.train()
        env.close()
    return trl_records, our_records


def _median(records: Sequence[StepRecord], name: str) -> float:
    return statistics.median(getattr(r, name) for r in records)


def summary_rows(trl: Sequence[StepRecord], ours: Sequence[StepRecord], args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per side (TRL, ours): medians over the timed steps (warm-up dropped) of the step's parts,
    agent tokens per second and what the side did per episode."""
    rows = []
    for name, records in (("TRL", trl[args.warmup:]), ("ours", ours[args.warmup:])):
        episodes = _median(records, "episodes")
        rows.append({"side": name, "rollout_s": _median(records, "rollout_s"), "update_s": _median(records, "update_s"),
                     "total_s": _median(records, "total_s"),
                     "agent_tokens_per_s": statistics.median(r.agent_tokens / r.total_s for r in records), "episodes": episodes,
                     **{f"{field}_per_episode": _median(records, field) / max(episodes, 1)
                        for field in ("agent_tokens", "env_tokens", "prompt_tokens", "searches")},
                     "reward": _median(records, "reward")})
    return rows


def _ratios(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """TRL's median time over ours, per part of the step (above 1: ours is faster)."""
    trl, ours = rows
    return {name: trl[name] / ours[name] for name in ("rollout_s", "update_s", "total_s")}


def _verdict(ratios: dict[str, float]) -> str:
    return f"target: ours >= {TARGET_X}x faster per step: {'met' if ratios['total_s'] >= TARGET_X else 'NOT met'} ({ratios['total_s']:.2f}x)"


def _settings_line(args: argparse.Namespace) -> str:
    import trl as trl_package

    return (f"One GRPO step on the {args.task} task: ours vs TRL {trl_package.__version__} GRPOTrainer (rollout_func), "
            f"{args.prompts} questions x {args.group} samples, <= {args.max_new_tokens} agent tokens per episode, "
            f"micro-batch {args.micro_batch}, lr {args.lr:g}, T={args.temperature:g}, KL {args.kl_coef:g}, "
            f"warm start {args.warm_start_steps} steps, fp32, 1 torch thread")


def report(trl: Sequence[StepRecord], ours: Sequence[StepRecord], args: argparse.Namespace) -> str:
    """The table of medians over the timed steps (warm-up dropped) and the TRL/ours ratios."""
    rows = summary_rows(trl, ours, args)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        _settings_line(args),
        f"medians of {len(ours) - args.warmup} steps per side after {args.warmup} warm-up, sides alternated; load average {load}",
        "",
        f"{'side':<10}{'rollout s':>10}{'update s':>10}{'total s':>9}{'agent tok/s':>13}{'episodes':>10}"
        f"{'agent/ep':>10}{'env/ep':>8}{'prompt/ep':>11}{'search/ep':>11}{'reward':>8}",
    ]
    for row in rows:
        lines.append(
            f"{row['side']:<10}{row['rollout_s']:>10.2f}{row['update_s']:>10.2f}{row['total_s']:>9.2f}"
            f"{row['agent_tokens_per_s']:>13.0f}{row['episodes']:>10.0f}{row['agent_tokens_per_episode']:>10.1f}"
            f"{row['env_tokens_per_episode']:>8.1f}{row['prompt_tokens_per_episode']:>11.1f}"
            f"{row['searches_per_episode']:>11.2f}{row['reward']:>8.3f}"
        )
    ratios = _ratios(rows)
    lines.append(
        f"{'TRL/ours':<10}{ratios['rollout_s']:>9.2f}x{ratios['update_s']:>9.2f}x{ratios['total_s']:>8.2f}x"
    )
    lines.append(_verdict(ratios))
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.splitlines()[0], formatter_class=HelpFormatter,
    )
    parser.add_argument("--task", choices=("demo", "search-r1"), default="demo",
                        help="demo: the learning benchmark's task (compact prompt); search-r1: Search-R1's prompt")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per side (the median is reported)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed first steps per side (>= 1: TRL's first step also holds its training setup)")
    parser.add_argument("--prompts", type=int, default=8, help="questions per step")
    parser.add_argument("--group", type=int, default=8, help="samples per question (GRPO group size)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="agent tokens per episode")
    parser.add_argument("--micro-batch", type=int, default=8, help="episodes per forward/backward pass")
    parser.add_argument("--lr", type=float, default=1e-6, help="AdamW learning rate (TRL's default)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    parser.add_argument("--kl-coef", type=float, default=0.0, help="KL to the reference (k3) in both; 0: off")
    parser.add_argument("--warm-start-steps", type=int, default=120,
                        help="warm-start steps before timing, enough for multi-turn episodes (0: the random policy)")
    parser.add_argument("--policy-cache", type=Path, default=None,
                        help="folder of warm-started policies kept between runs, one per set of settings (made on the first run)")
    parser.add_argument("--seed", type=int, default=0, help="model init, world and sampling seed")
    parser.add_argument("--output-dir", type=Path, default=None, help="write grpo_step_vs_trl.md, .csv and .json here")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")
    if (args.prompts * args.group) % args.micro_batch:
        parser.error("--prompts x --group must be a multiple of --micro-batch (TRL's accumulation needs it)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    args = parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # TRL loading the model prints one
    try:
        import trl  # noqa: F401
    except ImportError:
        print("this benchmark needs TRL: pip install 'searchqa-gym[trl]'")
        return 2
    trl_records, our_records = run(args)
    print(report(trl_records, our_records, args))
    if args.output_dir is not None:
        rows = summary_rows(trl_records, our_records, args)
        ratios = _ratios(rows)
        body = (f"{_settings_line(args)}; medians of {args.steps} steps per side after {args.warmup} warm-up, sides alternated."
                f"\n\n{markdown_table(rows)}\n\nTRL / ours: rollout {ratios['rollout_s']:.2f}x, update {ratios['update_s']:.2f}x, "
                f"whole step {ratios['total_s']:.2f}x. {_verdict(ratios)}.")
        steps = {side: [{"warmup": i < args.warmup, **asdict(record), "update_s": record.update_s} for i, record in enumerate(records)]
                 for side, records in (("TRL", trl_records), ("ours", our_records))}
        write_results(args.output_dir, "grpo_step_vs_trl", title="One GRPO step: ours against TRL's GRPOTrainer",
                      command=command_line(PROG, argv), body=body, rows=rows,
                      data={"settings": vars(args), "summary": rows, "trl_over_ours": ratios, "target_x": TARGET_X, "steps": steps})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
