"""Memory over a long run: does a training run with the environment worker leak, or only warm up?

Trains ``--steps`` tiny GRPO steps (the tiny policy, 2 questions x 2 samples of at most 16 tokens, no
held-out evaluation unless ``--eval-every``; metrics to ``metrics.jsonl``, plus ``--report-to``) with
``rollout.env_worker: true``, the way :func:`agents.training.build.build_trainer`
builds a run, and every ``--every`` steps samples:

* the resident set (RSS) and the unique set (USS: pages no other process shares) of the trainer and of
  the environment worker. The worker is forked from the trainer, so its RSS counts pages it shares with
  the trainer copy-on-write; its USS is what it really costs;
* the trainer's Python objects tracked by the garbage collector (after a collection), by type.

Growth that levels off (caches filling, the allocator's arenas, copy-on-write pages touched once in the
worker) and steady growth (a leak) look alike over a few hundred steps, so the run is cut into quarters
and the growth per 100 steps of each quarter is reported: a leak grows as fast in the last quarter as
in the second. With ``--tracemalloc`` the trainer's Python allocations still alive at the end that were
made after the first quarter are listed by source line (a slower run: every allocation is traced).

    python -m benchmarks.memory_soak --steps 1500 --every 50 --output-dir runs/memory_soak

``--output-dir DIR`` writes the growth table as ``memory_soak.md``, every sample as ``memory_soak.csv``, both
with the settings as ``memory_soak.json``, and memory against the step as ``memory_soak.png`` there.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from agents.training.build import build_trainer
from agents.training.callbacks import Callback
from agents.training.config import TrainConfig
from benchmarks.common.report_files import command_line, markdown_table, write_results

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: The tiny run: the tests' tiny GRPO config (it trains in a fraction of a second per step).
TINY = {
    "rollout.questions_per_step": 2, "algorithm.group_size": 2, "env.max_new_tokens": 16, "data.world_size": 30,
    "eval.questions": 0, "eval.every": 0, "optim.micro_batch_size": 3, "optim.mini_batch_size": 2,
    "optim.update_epochs": 2, "optim.learning_rate": 1e-3, "algorithm.kl_coef": 0.01, "algorithm.entropy_coef": 0.01,
    "run.report_to": [], "run.progress": False, "run.print_every": 0, "run.num_threads": 1,
    "rollout.env_worker": True,
}

_MB = 1024 * 1024


def memory_of(pid: int) -> tuple[float, float]:
    """RSS and USS of process ``pid`` in MB (psutil when installed, else ``/proc/<pid>/smaps_rollup``)."""
    try:
        import psutil
    except ImportError:
        fields = {}
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
        return fields["Rss"] / _MB, (fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)) / _MB
    info = psutil.Process(pid).memory_full_info()
    return info.rss / _MB, info.uss / _MB


def object_counts(own: list[Any]) -> Counter:
    """The trainer's objects tracked by the garbage collector, by type name (after a full collection),
    leaving out the objects in ``own`` (the sampler's own records, which grow with every sample)."""
    gc.collect()
    skip = {id(o) for o in own}
    return Counter(type(o).__name__ for o in gc.get_objects() if id(o) not in skip)


class Sampler(Callback):
    """Samples memory every ``every`` steps (and at step 0, when the worker first runs)."""

    def __init__(self, every: int, steps: int, trace: bool) -> None:
        self.every, self.steps, self.trace = every, steps, trace
        self.samples: list[dict[str, Any]] = []
        self.counts: dict[int, Counter] = {}
        self.snapshots: dict[int, tracemalloc.Snapshot] = {}
        self.started = time.monotonic()

    def on_update(self, trainer, metrics) -> None:
        step = trainer.step
        if step != 1 and step % self.every and step != self.steps:
            return
        worker = trainer.rollout_driver.worker
        trainer_rss, trainer_uss = memory_of(os.getpid())
        worker_rss, worker_uss = memory_of(worker.pid) if worker is not None else (float("nan"),) * 2
        counts = object_counts([*self.counts.values(), *self.samples, self.counts, self.samples])
        self.counts[step] = counts
        self.samples.append({"step": step, "elapsed_s": round(time.monotonic() - self.started, 1),
                             "trainer_rss_mb": round(trainer_rss, 1), "trainer_uss_mb": round(trainer_uss, 1),
                             "worker_rss_mb": round(worker_rss, 1), "worker_uss_mb": round(worker_uss, 1),
                             "objects": sum(counts.values())})
        print("  ".join(f"{k} {v}" for k, v in self.samples[-1].items()), flush=True)
        if self.trace and step >= self.steps // 4 and not tracemalloc.is_tracing():
            tracemalloc.start(8)
            self.snapshots[step] = tracemalloc.take_snapshot()
        elif self.trace and step == self.steps and tracemalloc.is_tracing():
            self.snapshots[step] = tracemalloc.take_snapshot()


def growth_per_100(samples: list[dict[str, Any]], key: str, first: int, last: int) -> float:
    """Growth of ``key`` per 100 steps between the samples nearest steps ``first`` and ``last``."""
    a = min(samples, key=lambda s: abs(s["step"] - first))
    b = min(samples, key=lambda s: abs(s["step"] - last))
    return (b[key] - a[key]) * 100 / max(b["step"] - a["step"], 1)


def plot(samples: Sequence[dict[str, Any]], figure: Figure) -> None:
    """Both processes' resident and unique memory against the training step."""
    ax = figure.subplots()
    steps = [sample["step"] for sample in samples]
    for key, label, style in (("trainer_rss_mb", "trainer RSS", "-"), ("trainer_uss_mb", "trainer USS", "--"),
                              ("worker_rss_mb", "worker RSS", "-"), ("worker_uss_mb", "worker USS", "--")):
        ax.plot(steps, [sample[key] for sample in samples], style, marker="o", markersize=3, label=label,
                color="C0" if key.startswith("trainer") else "C1")
    ax.set(xlabel="training step", ylabel="MB", title="Memory over a long run (environment worker on)")
    ax.legend(fontsize=8)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_soak", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500, help="training steps")
    parser.add_argument("--every", type=int, default=50, help="sample memory every this many steps")
    parser.add_argument("--algo", default="grpo", help="training algorithm")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="list the trainer's Python allocations made after the first quarter and alive at the end")
    parser.add_argument("--top", type=int, default=12, help="rows of the object-count and tracemalloc diffs")
    parser.add_argument("--report-to", nargs="*", default=[], choices=["tensorboard", "wandb"],
                        help="loggers besides metrics.jsonl (a default run writes tensorboard)")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="evaluate 2 held-out questions (greedy and sampled) every this many steps (0: never)")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed")
    parser.add_argument("--json", help="also write the samples and the verdict figures to this file")
    parser.add_argument("--output-dir", type=Path, help="write memory_soak.md, .csv, .json and .png here")
    args = parser.parse_args(argv)
    if args.steps < 4 or args.every < 1:
        parser.error("--steps must be >= 4 and --every >= 1")
    sampler = Sampler(args.every, args.steps, args.tracemalloc)
    with tempfile.TemporaryDirectory(prefix="memory_soak_") as output_dir:
        evaluation = {"eval.questions": 2, "eval.every": args.eval_every} if args.eval_every > 0 else {}
        config = TrainConfig(args.algo).updated({**TINY, **evaluation, "run.steps": args.steps, "run.seed": args.seed,
                                                 "run.report_to": args.report_to, "run.output_dir": output_dir})
        trainer = build_trainer(config, callbacks=[sampler])
        try:
            trainer.train()
        finally:
            trainer.close_environments()
    samples = sampler.samples
    quarters = [args.steps * q // 4 for q in range(5)]
    quarters[0] = 1
    keys = ("trainer_rss_mb", "trainer_uss_mb", "worker_rss_mb", "worker_uss_mb", "objects")
    growth = {key: [round(growth_per_100(samples, key, a, b), 2) for a, b in zip(quarters, quarters[1:])] for key in keys}
    # Objects made after warming up (the first quarter) and still alive at the end, by type.
    warm = min(sampler.counts, key=lambda step: abs(step - quarters[1]))
    grown = (sampler.counts[samples[-1]["step"]] - sampler.counts[warm]).most_common(args.top)
    print(f"\ngrowth per 100 steps, by quarter of the run (steps {quarters}):")
    for key, values in growth.items():
        print(f"  {key:16s} " + "  ".join(f"{v:8.2f}" for v in values))
    print(f"objects that grew between step {warm} and step {samples[-1]['step']}: {grown or 'none'}")
    traced: list[str] = []
    if len(sampler.snapshots) == 2:
        before, after = (sampler.snapshots[k] for k in sorted(sampler.snapshots))
        ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
        diff = after.filter_traces(ignore).compare_to(before.filter_traces(ignore), "lineno")
        traced = [str(stat) for stat in diff[: args.top]]
        print(f"tracemalloc, steps {sorted(sampler.snapshots)}, top allocations by growth:")
        for line in traced:
            print("  " + line)
        tracemalloc.stop()
    result = {"steps": args.steps, "every": args.every, "algo": args.algo, "report_to": args.report_to,
              "eval_every": args.eval_every, "samples": samples, "quarters": quarters,
              "growth_per_100_steps": growth, "objects_grown_since_step": warm, "objects_grown": grown, "tracemalloc": traced,
              "machine": f"{platform.machine()} {platform.system()} {platform.release()}, {os.cpu_count()} CPUs",
              "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d")}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
    if args.output_dir is not None:
        table = [{"figure": key, **{f"steps {a}-{b}": v for (a, b), v in zip(zip(quarters, quarters[1:]), values)}}
                 for key, values in growth.items()]
        body = (f"{args.steps} tiny {args.algo} steps with the environment worker, memory sampled every {args.every} steps. "
                f"Growth per 100 steps, by quarter of the run (MB, or objects):\n\n{markdown_table(table)}\n\n"
                f"Objects that grew between step {warm} and step {samples[-1]['step']}: "
                + (", ".join(f"{name} +{count}" for name, count in grown) or "none") + ".")
        write_results(args.output_dir, "memory_soak", title="Memory over a long run", command=command_line(parser.prog, argv),
                      body=body, rows=samples, data=result, plot=lambda figure: plot(samples, figure))
    return result


if __name__ == "__main__":
    main()
