"""Learning through TRL: TRL's GRPOTrainer (the public adapter) and our trainer, from one warm start, on the demo's 2-hop task.

    python -m benchmarks.trl_learning [--steps 40] [--eval-every 5] [--seeds 0 1 2] [--output-dir runs/trl_learning] [--set GROUP.FIELD=VALUE ...]
    python -m benchmarks.trl_learning --quick     # a few steps of everything, a tiny warm start (minutes)

Both trainers start from the very same weights: the demo recipe's (``agents/configs/demo.yaml``) supervised
warm start of its tiny Qwen2-shaped model on scripted demonstrations, made once and kept in
``<output-dir>/warm_start`` (:func:`benchmarks.common.warm_start_cache.cached_warm_start`, a transformers
model folder), so a second run skips it. From there, with the demo's world, protocol
(``search-r1-compact``) and environment budgets (agent tokens, context, turns, results per search):

- **TRL**: ``GRPOTrainer`` loads the folder and trains through the public adapter,
  :class:`search_env.integrations.trl.SearchQARollout` as its ``rollout_func`` and
  :func:`~search_env.integrations.trl.environment_reward` as its reward, on TRL's own loss and optimiser;
  the ``GRPOConfig`` fields set are the recipe's (see :func:`trl_config`).
- **ours**: :class:`agents.training.trainer.Trainer` (what ``python -m agents.train`` runs) with the demo
  recipe, ``model.name`` the folder and no warm start of its own.

Per seed of ``--seeds`` (``run.seed`` for ours, ``GRPOConfig.seed`` for TRL: sampling and the question order;
the warm start's is ``--warm-start-seed``, the worlds' the recipe's), both take the same training questions in
the same order (the trainer's question order, which TRL's dataset follows unshuffled; the results record
whether each step's questions matched), the same questions x group size per step and the same number of steps. Held-out greedy EM on 1-hop and
2-hop questions of the demo's held-out world (``data.eval_world_seed`` 11, new words) is measured the same
way for both, by the trainer's own evaluation (``eval.by_hops``): before RL, every ``--eval-every`` steps
and at the end; TRL's weights are copied into a second, never-trained trainer for it.

Writes ``results.json`` (settings, the warm start, per seed and trainer every step's reward, loss and grad
norm and the curve), ``results.md`` and ``.csv`` (the table: a row per trainer and seed, and with several
seeds each trainer's median) and ``results.png`` (held-out 2-hop and 1-hop EM, the median over seeds, and
the training reward against the step, both trainers). Measured results are in ``benchmarks/RESULTS.md``.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from search_env.console import HelpFormatter

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from agents.training.config import TrainConfig
    from agents.training.evaluation import EvalResult
    from agents.training.trainer import Trainer

__all__ = ["QUICK", "SideRun", "main", "rl_config", "run", "summary_rows", "trl_config"]

PROG = "python -m benchmarks.trl_learning"
#: ``--quick``'s recipe changes: a small world, a short warm start, 4 questions x 4 answers per step and 10
#: held-out questions per hop count. It checks the machinery; its numbers show no learning. The warm start is
#: long enough for some answers to be right (120 steps left every reward, and so TRL's gradient, at 0).
QUICK = {
    "data.world_size": 2000, "data.world_scale": 50, "warm_start.steps": 300, "warm_start.copy_steps": 100,
    "warm_start.examples": 3000, "rollout.questions_per_step": 4, "algorithm.group_size": 4, "eval.questions": 10,
}
QUICK_STEPS, QUICK_EVAL_EVERY = 3, 1
SIDES = ("TRL", "ours")


@dataclass
class SideRun:
    """One trainer's run: every step's training record, the held-out curve and the training minutes.

    Attributes:
        steps: per RL step: ``step``, ``reward`` (training episodes' mean), ``loss``, ``grad_norm``,
            ``seconds`` (the step's wall time) and ``questions`` (the step's distinct questions, sorted).
        curve: per evaluation: ``step`` (0: before RL) and held-out greedy ``em_1hop``, ``em_2hop``.
        minutes: wall minutes of the RL steps (evaluations left out).
    """

    trainer: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    curve: list[dict[str, Any]] = field(default_factory=list)
    minutes: float = 0.0

    def add_point(self, step: int, results: Mapping[str, EvalResult]) -> None:
        self.curve.append({"step": step, "em_1hop": results["greedy 1-hop"].em, "em_2hop": results["greedy 2-hop"].em})
        print(f"{self.trainer} step {step}: held-out greedy EM 1-hop {results['greedy 1-hop'].em:.3f}, "
              f"2-hop {results['greedy 2-hop'].em:.3f}; load {os.getloadavg()[0]:.1f}", flush=True)


def _distinct(questions: Sequence[str]) -> list[str]:
    """A step's distinct questions, sorted (each trainer lists its episodes in an order of its own)."""
    return sorted(set(questions))


def rl_config(base: TrainConfig, policy_dir: str | Path, output_dir: Path, *, steps: int, eval_every: int, seed: int) -> TrainConfig:
    """The RL runs' config: ``base`` trained from ``policy_dir`` (no warm start of its own) for ``steps`` steps,
    evaluated greedy by hop count every ``eval_every`` steps, writing into ``output_dir``."""
    return base.updated({
        "model.name": str(policy_dir), "warm_start.steps": 0, "warm_start.copy_steps": 0, "run.steps": steps,
        "run.seed": seed, "eval.every": eval_every, "eval.by_hops": True, "eval.periodic_sampled": False,
        "run.output_dir": str(output_dir), "run.overwrite": True, "run.resume": False, "run.report_to": [], "run.progress": False,
    })


def trl_config(config: TrainConfig, output_dir: Path) -> Any:
    """``GRPOConfig`` with the recipe's settings where TRL has the same one: episodes per step (``rollout.questions_per_step``
    x ``algorithm.group_size``, one optimiser step over them in micro-batches of ``optim.micro_batch_size``), the
    sampling temperature and top-p, the agent-token budget, AdamW's rate (constant, as ours), betas, weight decay
    and gradient clipping, the clip range, KL (``beta``) and the seed; fp32 on the CPU, questions in order
    (``shuffle_dataset=False``), every step logged, no checkpoints. The rest is TRL's default: the ``dapo`` loss
    (a token mean over the step's episodes, as the recipe's ``token-mean``), group-std-scaled advantages
    (``scale_rewards="group"``, the recipe's ``scale_rewards``), one update pass."""
    from trl import GRPOConfig

    optim, algorithm = config.optim, config.algorithm
    episodes = config.rollout.questions_per_step * algorithm.group_size
    return GRPOConfig(
        output_dir=str(output_dir), use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none", save_strategy="no",
        disable_tqdm=True, logging_steps=1, per_device_train_batch_size=optim.micro_batch_size,
        gradient_accumulation_steps=episodes // optim.micro_batch_size, num_generations=algorithm.group_size,
        max_completion_length=config.env.max_new_tokens, temperature=config.rollout.temperature, top_p=config.rollout.top_p,
        learning_rate=optim.learning_rate, lr_scheduler_type="constant", adam_beta1=optim.adam_betas[0],
        adam_beta2=optim.adam_betas[1], weight_decay=optim.weight_decay, max_grad_norm=optim.max_grad_norm,
        epsilon=algorithm.clip_low, epsilon_high=algorithm.clip_high, beta=algorithm.kl_coef, seed=config.run.seed,
        max_steps=config.run.steps, shuffle_dataset=False,
    )


# -- ours -------------------------------------------------------------------------------------------------


def _our_record(side: SideRun) -> Any:
    """A trainer callback recording our trainer's steps and held-out curve into ``side``."""
    from agents.training.callbacks import Callback

    class OurRecord(Callback):
        questions: list[str] = []

        def on_rollout(self, trainer: Trainer, trajectories: Sequence[Any]) -> None:
            self.questions = _distinct([t.question for t in trajectories])

        def on_update(self, trainer: Trainer, metrics: Mapping[str, Any]) -> None:
            side.steps.append({"step": trainer.step, "reward": metrics["reward"], "loss": metrics.get("loss/total"),
                               "grad_norm": metrics.get("grad_norm"), "seconds": metrics["time/step"], "questions": self.questions})
            side.minutes += metrics["time/step"] / 60
            print(f"ours step {trainer.step}: reward {metrics['reward']:.3f}, loss {metrics.get('loss/total', float('nan')):.4f}, "
                  f"grad norm {metrics.get('grad_norm', float('nan')):.4f}, {metrics['time/step']:.1f} s", flush=True)

        def on_evaluation(self, trainer: Trainer, stage: str | None, results: Mapping[str, EvalResult]) -> None:
            if results and (not side.curve or side.curve[-1]["step"] != trainer.step):
                side.add_point(trainer.step, results)

    return OurRecord()


def run_ours(config: TrainConfig, data: Any) -> SideRun:
    """Our trainer from the warm start (``config``: :func:`rl_config`) on the shared ``data``."""
    from agents.training.build import build_trainer

    side = SideRun("ours")
    trainer = build_trainer(config, callbacks=[_our_record(side)], data=data)
    trainer.train()  # stops its worker; the sources are the shared data's
    return side


# -- TRL --------------------------------------------------------------------------------------------------


def _trl_side(config: TrainConfig, data: Any, output_dir: Path) -> SideRun:
    """TRL's ``GRPOTrainer`` from the warm-start folder (``config.model.name``) through the adapter; a second trainer
    of ``config`` (never trained) lends its training environment to the adapter, its question order to TRL's
    dataset and its held-out evaluation to TRL's weights."""
    import torch
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from agents.training.build import build_trainer
    from search_env.integrations.trl import SearchQARollout, environment_reward

    side = SideRun("TRL")
    evaluator = build_trainer(config.updated({"run.output_dir": str(output_dir / "evaluator")}), data=data)
    per_step = config.rollout.questions_per_step
    examples = evaluator.env.envs[0].examples
    chosen = [examples[i] for i in copy.deepcopy(evaluator.order).take(per_step * config.run.steps)]
    rollout = SearchQARollout(evaluator.env, examples=chosen)

    def evaluate(model: Any, step: int) -> None:
        evaluator.policy.lm.load_state_dict(model.state_dict())
        evaluator.rollout_driver.ready_for_evaluation()
        with evaluator.rollout_driver.decoding():
            side.add_point(step, evaluator.run_evaluation(("greedy",)))

    asked: list[str] = []

    def recorded_rollout(prompts: list[str], trainer: Any) -> dict[str, list]:
        asked[:] = _distinct(prompts)
        return rollout(prompts, trainer)

    class Record(TrainerCallback):
        """Times each step, evaluates every ``eval.every`` steps and at the end, and keeps each step's log."""

        started = 0.0

        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001 - TrainerCallback's signature
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kwargs):  # noqa: ANN001
            seconds = time.perf_counter() - self.started
            side.minutes += seconds / 60
            side.steps.append({"step": state.global_step, "seconds": seconds, "questions": list(asked)})
            step = state.global_step
            if step == state.max_steps or step % config.eval.every == 0:
                evaluate(model, step)

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
            if logs and "reward" in logs and side.steps and side.steps[-1]["step"] == state.global_step:
                entry = side.steps[-1]
                entry.update(reward=logs["reward"], loss=logs.get("loss"), grad_norm=logs.get("grad_norm"))
                print(f"TRL step {entry['step']}: reward {entry['reward']:.3f}, loss {entry['loss']:.4f}, grad norm "
                      f"{entry['grad_norm']:.4f}, {entry['seconds']:.1f} s", flush=True)

    try:
        from datasets import Dataset

        trainer = GRPOTrainer(model=str(config.model.name), reward_funcs=[environment_reward],
                              args=trl_config(config, output_dir / "trainer"), processing_class=rollout.tokenizer,
                              train_dataset=Dataset.from_dict({"prompt": [ex.question for ex in chosen]}),
                              rollout_func=recorded_rollout, callbacks=[Record()])
        trainer.remove_callback(PrinterCallback)  # the benchmark prints its own lines
        evaluate(trainer.model, 0)
        torch.manual_seed(config.run.seed)
        trainer.train()
    finally:
        evaluator.close()
    return side


# -- the run ----------------------------------------------------------------------------------------------


def _seed_run(config: TrainConfig, data: Any, output_dir: Path) -> dict[str, Any]:
    """Both trainers at ``config``'s seed: ours, then TRL's, and whether their steps' questions matched."""
    sides = {"ours": run_ours(config.updated({"run.output_dir": str(output_dir / "ours")}), data)}
    sides["TRL"] = _trl_side(config, data, output_dir / "trl")
    same = [s["questions"] for s in sides["TRL"].steps] == [s["questions"] for s in sides["ours"].steps]
    return {"seed": config.run.seed, "same_questions": same, "trainers": {name: asdict(sides[name]) for name in SIDES}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The warm start (cached), then both trainers from it at each seed; returns what ``results.json`` holds."""
    import torch
    import trl

    from agents.training.data import build_data
    from benchmarks.common.warm_start_cache import cached_warm_start
    from benchmarks.learning import demo_config

    base = demo_config([*(f"{k}={v}" for k, v in QUICK.items() if args.quick), *args.set])
    out: Path = args.output_dir
    started = time.perf_counter()
    warm = cached_warm_start(base.updated({"run.seed": args.warm_start_seed}), out / "warm_start",
                             log=lambda line: print(line, flush=True))
    print(f"warm start {'reused' if warm.reused else 'made'}: {warm.policy_dir} ({warm.seconds / 60:.1f} min when made, "
          f"loss {warm.stats.get('warm_start/loss_last', float('nan')):.3f})", flush=True)
    config = rl_config(base, warm.policy_dir, out, steps=args.steps, eval_every=args.eval_every, seed=args.seeds[0])
    torch.set_num_threads(config.run.num_threads)
    data = build_data(config)  # the worlds and their indexes: the same for every seed
    try:
        runs = [_seed_run(config.updated({"run.seed": seed}), data, out / f"seed{seed}") for seed in args.seeds]
    finally:
        data.close()
    return {
        "settings": {"steps": args.steps, "eval_every": args.eval_every, "seeds": args.seeds, "warm_start_seed": args.warm_start_seed,
                     "quick": args.quick, "set": args.set, "questions_per_step": config.rollout.questions_per_step,
                     "group_size": config.algorithm.group_size, "heldout_questions_per_hop": config.eval.questions,
                     "world_seed": config.data.world_seed, "eval_world_seed": config.data.eval_world_seed,
                     "protocol": config.env.protocol, "trl": trl.__version__},
        "config": config.as_dict(),
        "warm_start": {**asdict(warm), "policy_dir": str(warm.policy_dir)},
        "same_questions": all(r["same_questions"] for r in runs),
        "wall_minutes": (time.perf_counter() - started) / 60,
        "runs": runs,
    }


def _mean(values: Sequence[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


#: The table's numeric columns, of which a run of several seeds adds each trainer's median.
COLUMNS = ("em_1hop_before", "em_2hop_before", "em_1hop_after", "em_2hop_after", "em_2hop_best", "reward_first5",
           "reward_last5", "rl_minutes", "s_per_step")


def summary_rows(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per trainer and seed: held-out greedy EM before RL and at the end (1-hop, 2-hop), the best 2-hop EM of
    the curve, the training reward of the first and last five steps, and minutes and seconds per RL step; with
    several seeds, then each trainer's median over them (``seed`` "median")."""
    settings = results["settings"]
    rows = []
    for name in SIDES:
        for seed_run in results["runs"]:
            side = seed_run["trainers"][name]
            curve, steps = side["curve"], side["steps"]
            rows.append({
                "trainer": name, "seed": seed_run["seed"], "steps": len(steps),
                "episodes_per_step": settings["questions_per_step"] * settings["group_size"],
                "em_1hop_before": curve[0]["em_1hop"], "em_2hop_before": curve[0]["em_2hop"],
                "em_1hop_after": curve[-1]["em_1hop"], "em_2hop_after": curve[-1]["em_2hop"],
                "em_2hop_best": max(p["em_2hop"] for p in curve),
                "reward_first5": _mean([s.get("reward") for s in steps[:5]]),
                "reward_last5": _mean([s.get("reward") for s in steps[-5:]]),
                "rl_minutes": side["minutes"], "s_per_step": statistics.median(s["seconds"] for s in steps) if steps else None,
            })
        if len(results["runs"]) > 1:
            own = [row for row in rows if row["trainer"] == name]
            rows.append({"trainer": name, "seed": "median", "steps": own[0]["steps"], "episodes_per_step": own[0]["episodes_per_step"],
                         **{key: statistics.median(row[key] for row in own if row[key] is not None) for key in COLUMNS}})
    return rows


def _median_curve(curves: Sequence[Sequence[Mapping[str, Any]]], key: str) -> tuple[list[int], list[float]]:
    """The steps every curve evaluated at, and the median of ``key`` over the curves there."""
    steps = sorted(set.intersection(*({p["step"] for p in curve} for curve in curves)))
    return steps, [statistics.median(next(p[key] for p in curve if p["step"] == step) for curve in curves) for step in steps]


def _plot(results: Mapping[str, Any]) -> Any:
    def draw(figure: Figure) -> None:
        figure.set_size_inches(10.5, 4.0)
        em, reward = figure.subplots(1, 2)
        colors = {"TRL": "tab:orange", "ours": "tab:blue"}
        several = len(results["runs"]) > 1
        for name in SIDES:
            sides = [seed_run["trainers"][name] for seed_run in results["runs"]]
            label = "TRL GRPOTrainer (adapter)" if name == "TRL" else "ours (agents.train)"
            label += ", median of seeds" if several else ""
            curves = [side["curve"] for side in sides]
            for curve in curves if several else ():
                em.plot([p["step"] for p in curve], [p["em_2hop"] for p in curve], "-", color=colors[name], lw=0.7, alpha=0.4)
            em.plot(*_median_curve(curves, "em_2hop"), "o-", color=colors[name], label=f"{label}: 2-hop")
            em.plot(*_median_curve(curves, "em_1hop"), "s--", color=colors[name], alpha=0.6, ms=3, label=f"{label}: 1-hop")
            by_step: dict[int, list[float]] = {}
            for side in sides:
                for step in side["steps"]:
                    if step.get("reward") is not None:
                        by_step.setdefault(step["step"], []).append(step["reward"])
            steps = sorted(by_step)
            rewards = [statistics.fmean(by_step[step]) for step in steps]
            reward.plot(steps, rewards, "-", color=colors[name], lw=0.7, alpha=0.5)
            window = [statistics.fmean(rewards[max(0, i - 4):i + 1]) for i in range(len(rewards))]
            reward.plot(steps, window, "-", color=colors[name], lw=2,
                        label=f"{label.replace('median', 'mean')}, mean of 5 steps")
        em.set_ylim(-0.02, 1.02)
        em.set_xlabel("RL step (0: the shared warm start)")
        em.set_ylabel("held-out greedy EM")
        em.set_title("held-out world (new words)" + ("; thin: each seed's 2-hop" if several else ""), fontsize=10)
        em.legend(fontsize=7)
        reward.set_xlabel("RL step")
        reward.set_ylabel("training reward (episode mean)")
        reward.set_title("training episodes", fontsize=10)
        reward.legend(fontsize=7)
        settings = results["settings"]
        seeds = " ".join(map(str, settings["seeds"]))
        figure.suptitle(f"GRPO from one warm start: TRL {settings['trl']} vs ours, {settings['questions_per_step']} questions x "
                        f"{settings['group_size']} per step, seed{'s' if several else ''} {seeds}", fontsize=10)
    return draw


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"a few minutes: {QUICK_STEPS} steps, evaluated every step, " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    parser.add_argument("--steps", type=int, help="RL steps of each trainer (default: 40; --quick: 3)")
    parser.add_argument("--eval-every", type=int, help="held-out evaluation every this many steps (default: 5; --quick: 1)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="one run of both trainers per seed (run.seed, GRPOConfig.seed: sampling and question order)")
    parser.add_argument("--warm-start-seed", type=int, default=0, help="the shared warm start's seed (its run.seed)")
    parser.add_argument("--set", nargs="*", action="extend", default=[], metavar="GROUP.FIELD=VALUE",
                        help="change the demo recipe (YAML values, after --quick's changes), e.g. --set optim.learning_rate=3e-4")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/trl_learning"),
                        help="the warm start (kept for the next run), both runs, results.json, .md, .csv and .png")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    parser = _parser()
    args = parser.parse_args(argv)
    args.steps = args.steps if args.steps is not None else (QUICK_STEPS if args.quick else 40)
    args.eval_every = args.eval_every if args.eval_every is not None else (QUICK_EVAL_EVERY if args.quick else 5)
    if args.steps < 1 or args.eval_every < 1:
        parser.error("--steps and --eval-every must be >= 1")
    try:
        import trl  # noqa: F401
    except ImportError:
        print("this benchmark needs TRL: pip install 'searchqa-gym[trl]'")
        return 2
    from transformers.utils import logging as hf_logging

    from benchmarks.common.report_files import command_line, markdown_table, write_results

    hf_logging.disable_progress_bar()  # loading and exporting the policy print bars
    results = run(args)
    rows = summary_rows(results)
    table = markdown_table(rows)
    print()
    print(table)
    print(f"same training questions at every step: {results['same_questions']}; {results['wall_minutes']:.1f} min in all")
    settings = results["settings"]
    body = (f"TRL {settings['trl']} GRPOTrainer (search_env.integrations.trl) and ours (agents.train), both from one warm start "
            f"of the demo recipe (seed {settings['warm_start_seed']}){' (--quick)' if args.quick else ''}: {settings['steps']} steps "
            f"of {settings['questions_per_step']} questions x {settings['group_size']}, seeds {' '.join(map(str, settings['seeds']))}, "
            f"each seed's trainers on the same questions in the same order: "
            f"{results['same_questions']}. Held-out greedy EM on {settings['heldout_questions_per_hop']} questions per hop "
            f"count of world {settings['eval_world_seed']} (new words), before RL and after.\n\n{table}")
    write_results(args.output_dir, "results", title="Learning through TRL's GRPOTrainer and through ours",
                  command=command_line(PROG, argv), body=body, rows=rows, data={**results, "summary": rows}, plot=_plot(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
