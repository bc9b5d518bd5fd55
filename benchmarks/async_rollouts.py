"""Training steps with rollouts on a vLLM server: synchronous (generate, then update) vs one step generated ahead.

For each model (the demo's tiny transformer, SmolLM2-135M-Instruct) one vLLM server is launched with one CPU
thread (its own core on a 2-core machine) and the trainer, also on one thread, trains GRPO with
``--rollout.engine vllm-server`` through it, first with ``rollout.max_staleness 0`` and then with ``1``
(:mod:`agents.training.async_rollout`), the same steps and settings side by side::

    VENV=$(bash .ci/vllm_venv.sh) && python -m benchmarks.async_rollouts --vllm-python $VENV/bin/python \\
        [--models tiny smollm2] [--steps 4] [--output-dir DIR]

Per mode it reports medians over the steps after the first (step 0 is generated on the spot in both
modes): the step's time, agent tokens per second of step time, the rollout's time (the generation, on
the background thread when ahead), the update's, how long the update waited for the rollout, how long
the engine sat idle before its next rollout (waiting for the update and the weight sync), and the sync's
time. With the rollout ahead a step should take about the longer of the two phases plus the sync, where a
synchronous step takes their sum. ``--output-dir DIR`` writes the table as ``async_rollouts.md``, ``.csv``
and ``.json`` there.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from benchmarks.common.report_files import command_line, markdown_table, write_results
from search_env.console import HelpFormatter

#: The models compared: the ``model`` group's settings of each. The tiny one has the demo's widths
#: (agents/configs/demo.yaml) without the query/key biases of its Qwen2 shape, as the recorded results were
#: measured (the speeds of the two shapes differ by those biases alone).
MODELS: dict[str, dict[str, Any]] = {
    "tiny": {"model.name": "tiny", "model.tiny_layers": 2, "model.tiny_hidden": 96, "model.tiny_heads": 4,
             "model.tiny_head_dim": 32, "model.tiny_arch": "llama"},
    "smollm2": {"model.name": "smollm2"},
}
#: What each column of the table is, from a step's metrics.
COLUMNS = {"step s": "time/step", "agent tokens/s": "tokens_per_s", "rollout s": "time/rollout",
           "update s": "time/update", "update waited s": "time/update_waited",
           "engine idle s": "time/rollout_waited", "sync s": "time/weight_sync"}


def settings(model: str, max_staleness: int, output_dir: Path, args: argparse.Namespace, url: str) -> dict[str, Any]:
    """The run's config changes: the model, the workload, one trainer thread, the server at ``url``."""
    return {
        **MODELS[model], "rollout.engine": "vllm-server", "rollout.max_staleness": max_staleness,
        "engine.urls": [url], "engine.request_timeout_s": 600.0,
        "run.steps": args.steps, "run.num_threads": 1, "run.output_dir": str(output_dir), "run.overwrite": True,
        "run.report_to": [], "run.progress": False, "eval.questions": 0,
        "rollout.questions_per_step": args.questions, "algorithm.group_size": args.group,
        "env.max_new_tokens": args.max_new_tokens, "env.max_context": 1024, "optim.learning_rate": 1e-5,
        "rollout.temperature": 1.0,
    }


def summarize(label: str, model: str, steps: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """One row of the table: the medians of each column over ``steps`` after the first (a missing metric,
    as the synchronous mode's waits, is left out), and the steps they are over."""
    measured = list(steps[1:])
    row: dict[str, Any] = {"model": model, "mode": label, "steps": len(measured)}
    for column, key in COLUMNS.items():
        values = [step[key] for step in measured if key in step]
        row[column] = statistics.median(values) if values else None
    return row


def overlap_note(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per model: the speed-up of the step, and the synchronous step's phases (the bound an overlap nears)."""
    notes = []
    for model in dict.fromkeys(row["model"] for row in rows):
        by_mode = {row["mode"]: row for row in rows if row["model"] == model}
        sync, ahead = by_mode.get("synchronous"), by_mode.get("max_staleness 1")
        if sync is None or ahead is None or not ahead["step s"]:
            continue
        longer = max(sync["rollout s"] or 0.0, sync["update s"] or 0.0)
        notes.append(f"- {model}: {sync['step s']:.2f} s -> {ahead['step s']:.2f} s per step "
                     f"({sync['step s'] / ahead['step s']:.2f}x); the longer phase of a synchronous step takes {longer:.2f} s")
    return notes


def launch_server(model: str, args: argparse.Namespace, folder: Path) -> Any:
    """A vLLM server on one thread over ``model``'s starting weights (each run's first sync replaces them)."""
    from agents.policies.loading import load_policy
    from agents.rollout.vllm_server_engine import VLLMServerEngine, VLLMServerEngineOptions
    from agents.training.config import TrainConfig

    config = TrainConfig("grpo").updated(settings(model, 0, folder, args, "http://127.0.0.1:1"))
    options = VLLMServerEngineOptions(python=args.vllm_python, threads=1, startup_timeout_s=900, request_timeout_s=600)
    return VLLMServerEngine(load_policy(config.model, seed=config.run.seed), options, max_model_len=config.env.max_context,
                            seed=config.run.seed)


def run_mode(model: str, max_staleness: int, url: str, args: argparse.Namespace, folder: Path) -> list[dict[str, float]]:
    """Train ``args.steps`` steps in ``max_staleness`` mode through the server at ``url``; each step's metrics."""
    from agents.training.build import build_trainer
    from agents.training.callbacks import Callback
    from agents.training.config import TrainConfig

    steps: list[dict[str, float]] = []

    class Keep(Callback):
        def on_update(self, trainer: Any, metrics: Mapping[str, Any]) -> None:
            steps.append({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})

    trainer = build_trainer(TrainConfig("grpo").updated(settings(model, max_staleness, folder / f"{model}-{max_staleness}",
                                                                 args, url)), callbacks=[Keep()])
    try:
        trainer.train()
    finally:
        trainer.close_environments()
    return steps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.async_rollouts", description=__doc__.splitlines()[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["tiny", "smollm2"])
    parser.add_argument("--steps", type=int, default=4, help="training steps per mode (the first is not counted)")
    parser.add_argument("--questions", type=int, default=4, help="questions per step")
    parser.add_argument("--group", type=int, default=4, help="samples per question")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="agent tokens per turn at most")
    parser.add_argument("--vllm-python", default=os.environ.get("SEARCHQA_VLLM_PYTHON", ""),
                        help="the Python of a virtualenv with vLLM (bash .ci/vllm_venv.sh); default $SEARCHQA_VLLM_PYTHON")
    parser.add_argument("--output-dir", type=Path, help="write async_rollouts.md, .csv and .json here")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error(f"--steps must be >= 2 (the first step is not counted), got {args.steps}")
    if not args.vllm_python:
        parser.error("--vllm-python is needed (or $SEARCHQA_VLLM_PYTHON): VENV=$(bash .ci/vllm_venv.sh); --vllm-python $VENV/bin/python")
    import torch

    torch.set_num_threads(1)  # the trainer's core; the server has the other
    rows, raw = [], {}
    with tempfile.TemporaryDirectory(prefix="async-rollouts-") as scratch:
        for model in args.models:
            started = time.perf_counter()
            server = launch_server(model, args, Path(scratch) / "probe")
            print(f"{model}: server up in {time.perf_counter() - started:.0f} s at {server.urls[0]}", flush=True)
            try:
                for max_staleness, label in ((0, "synchronous"), (1, "max_staleness 1")):
                    steps = run_mode(model, max_staleness, server.urls[0], args, Path(scratch))
                    raw[f"{model} {label}"] = steps
                    rows.append(summarize(label, model, steps))
                    print(markdown_table(rows[-1:]), flush=True)
            finally:
                server.close()
    table = markdown_table(rows)
    body = "\n".join([table, "", *overlap_note(rows)])
    print(body)
    if args.output_dir is not None:
        write_results(args.output_dir, "async_rollouts", title="Rollouts on a vLLM server: synchronous vs one step ahead",
                      command=command_line(), body=body, data={"settings": vars(args), "rows": rows, "steps": raw}, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
