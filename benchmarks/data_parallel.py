"""Step time and memory per rank of one update: one process, then 2 ranks under DeepSpeed ZeRO-2 and ZeRO-3.

The update is one of a tiny policy (about 50M parameters): one process with the torch backend, then 2
ranks under DeepSpeed ZeRO-2 and ZeRO-3 (torchrun, gloo on a CPU), on the same global batch, side by side::

    python -m benchmarks.data_parallel [--hidden 640 --layers 10] [--output-dir DIR]

Per rank it reports the median update time (score + advantages + one optimiser step over two
micro-batches per rank), the bytes of parameters and optimiser state the rank holds (its parameter shards
or whole parameters, the AdamW moments and any master-weight partition of its own, each storage once;
all three train in fp32), its peak resident memory, and the summed loss of the update (the same for all
three: the maths do not change with the ranks). ``--output-dir DIR`` writes the table as ``data_parallel.md``,
``.csv`` and ``.json`` (with every rank's figures) there.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from benchmarks.common.report_files import command_line, markdown_table, write_results
from search_env.console import HelpFormatter

ROOT = Path(__file__).resolve().parents[1]

#: The setups compared: label, the name of the workers' files, ranks, and the worker's backend arguments.
SETUPS = (("1 process (torch)", "single", 1, ("--backend", "torch")),
          ("2 ranks ZeRO-2", "zero2", 2, ("--backend", "deepspeed", "--zero", "2")),
          ("2 ranks ZeRO-3", "zero3", 2, ("--backend", "deepspeed", "--zero", "3")))


def _held_bytes(backend) -> int:
    """Bytes of parameters and optimiser state this process holds: every storage behind the parameters
    (whole ones, a ZeRO-3 engine's shards and the whole copies it keeps of small persistent parameters),
    the optimiser's state and the engine's master-weight partitions, each storage counted once (in fp32 a
    master partition is the buffer of the parameter partition it belongs to: see share_master_weights)."""
    import torch

    seen: set[int] = set()
    total = 0

    def add(t: torch.Tensor | None) -> None:
        nonlocal total
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()

    for p in backend.policy.parameters():
        add(p.data)
        add(getattr(p, "ds_tensor", None))
    optimizer = getattr(backend, "client_optimizer", None) or backend.optimizer
    for state in optimizer.state.values():
        for value in state.values():
            add(value)
    engine_opt = getattr(getattr(backend, "engine", None), "optimizer", None)
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
        for t in getattr(engine_opt, name, None) or []:
            add(t)
    return total


def worker(args: argparse.Namespace) -> None:
    import torch

    from agents.learners.registry import lookup_algorithm
    from agents.policies.loading import load_policy
    from agents.training.backends import build_backend
    from agents.training.config import TrainConfig
    from agents.training.update import by_length, score_batch, update_batch
    from tests.agents.training.ds_equivalence import global_batch

    torch.set_num_threads(1)
    config = TrainConfig("grpo").updated({
        "run.backend": args.backend, **({"backend.zero_stage": args.zero} if args.backend == "deepspeed" else {}),
        "rollout.questions_per_step": 2,
        "algorithm.group_size": 3, "optim.micro_batch_size": 2,
        "optim.learning_rate": 1e-4, "algorithm.kl_coef": 0.0, "model.tiny_hidden": args.hidden,
        "model.tiny_layers": args.layers, "model.tiny_heads": args.hidden // 64, "env.max_new_tokens": 16})
    algorithm = lookup_algorithm("grpo")(config.algorithm, max_new_tokens=16)
    policy = load_policy(config.model, seed=0)
    n_params = sum(p.numel() for p in policy.parameters())
    backend = build_backend(config, policy, algorithm)
    full = global_batch(policy.vocab_size)
    if backend.world_size > 1:
        full = full.select([r for r in range(len(full)) if int(full.group_index[r]) == backend.rank])
    times, losses = [], []
    for _ in range(args.steps):
        batch = full.select(by_length(full, torch.arange(len(full))))
        started = time.perf_counter()
        score_batch(backend, algorithm, config.optim, batch)
        algorithm.compute_advantages(batch)
        stats, _ = update_batch(backend, algorithm, config.optim, batch, shuffle_seed=0, with_entropy=algorithm.needs_entropy)
        backend.barrier()
        times.append(time.perf_counter() - started)
        losses.append(float(backend.all_reduce_sum(torch.tensor(stats["loss/policy"], dtype=torch.float64))))
    result = {"params": n_params, "step_s": statistics.median(times[1:] or times), "held_bytes": _held_bytes(backend),
              "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "losses": losses}
    Path(f"{args.out}.rank{backend.rank}.json").write_text(json.dumps(result))


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(label: str, ranks: int, extra: Sequence[str], out: Path, common: Sequence[str]) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    me = [sys.executable, "-m", "benchmarks.data_parallel", "--worker", "--out", str(out / label), *common, *extra]
    if ranks > 1:
        me = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port", str(_port()),
              "-m", "benchmarks.data_parallel", "--worker", "--out", str(out / label), *common, *extra]
    done = subprocess.run(me, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{label} failed:\n{done.stderr[-4000:]}")
    return [json.loads((out / f"{label}.rank{r}.json").read_text()) for r in range(ranks)]


def setup_rows(results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per setup from its ranks' reports: the slowest rank's update, the most any rank holds and
    its multiple of one process's, the largest peak resident memory, and the losses (rank 0's)."""
    base = next(iter(results.values()))[0]["held_bytes"]
    rows = []
    for label, ranks in results.items():
        held = max(r["held_bytes"] for r in ranks)
        rows.append({"setup": label, "ranks": len(ranks), "step_s": max(r["step_s"] for r in ranks), "held_mib": held / 2**20,
                     "held_x_single": held / base, "peak_rss_mib": max(r["peak_rss_bytes"] for r in ranks) / 2**20,
                     "losses": ranks[0]["losses"]})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data_parallel", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="torch", help=argparse.SUPPRESS)
    parser.add_argument("--zero", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--hidden", type=int, default=640, help="the policy's width (heads of 64)")
    parser.add_argument("--layers", type=int, default=10, help="the policy's layers")
    parser.add_argument("--steps", type=int, default=3, help="updates per setup (the first is left out of the median)")
    parser.add_argument("--output-dir", type=Path, default=None, help="write data_parallel.md, .csv and .json here")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    common = ["--hidden", str(args.hidden), "--layers", str(args.layers), "--steps", str(args.steps)]
    with tempfile.TemporaryDirectory() as tmp:
        results = {label: run(tag, ranks, extra, Path(tmp), common) for label, tag, ranks, extra in SETUPS}
    rows = setup_rows(results)
    params = next(iter(results.values()))[0]["params"]
    heading = f"policy: {params / 1e6:.1f}M parameters; global batch 6 rows; medians of {args.steps - 1} updates"
    print(heading)
    print(f"{'setup':<20} {'step s':>8} {'param+optim MiB/rank':>21} {'x single':>9} {'peak RSS MiB/rank':>18}  losses")
    for row in rows:
        print(f"{row['setup']:<20} {row['step_s']:>8.2f} {row['held_mib']:>21.1f} {row['held_x_single']:>9.2f} "
              f"{row['peak_rss_mib']:>18.0f}  {' '.join(f'{x:.6f}' for x in row['losses'])}")
    if args.output_dir is not None:
        body = (f"{heading}. Per setup: the slowest rank's update (s), the parameter and optimiser bytes the fullest rank "
                f"holds (MiB) and their multiple of one process's, the largest peak resident memory (MiB).\n\n"
                f"{markdown_table(rows)}")
        write_results(args.output_dir, "data_parallel", title="One update: one process against 2-rank ZeRO-2 and ZeRO-3",
                      command=command_line(parser.prog, argv), body=body, rows=rows,
                      data={"settings": vars(args), "params": params, "setups": rows, "ranks": results})
    return 0


if __name__ == "__main__":
    from agents.training.rank_exit import run_main

    run_main(main)  # a DeepSpeed worker leaves without finalisation: see agents.training.rank_exit
