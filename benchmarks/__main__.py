"""The benchmark commands, each with the first line of its module's docstring: ``python -m benchmarks``.

Every module at the top of :mod:`benchmarks` is a command, run as ``python -m benchmarks.<name>`` (``--help``
for its options); what the commands share lives in :mod:`benchmarks.common`, the evaluation harness's parts
in :mod:`benchmarks.evaluation` and the peers measured beside ours in :mod:`benchmarks.peers`. The
descriptions are read from the modules' source without importing them, so the list shows even where a
command's optional extras are not installed.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from typing import Sequence

__all__ = ["COMMANDS", "description", "main"]

#: The commands, grouped as the README describes them: learning and evaluation, then speed and memory.
COMMANDS: tuple[str, ...] = (
    "learning", "trl_learning", "algorithms", "classic_rl", "evaluate", "real_model", "retrieval_recall",
    "suite", "env_overhead", "answer_turn", "retrieval_throughput", "dag_critical_path", "dag_parse_adversarial",
    "rollout_overhead", "rollout_throughput", "async_rollouts", "grpo_step_vs_trl", "data_parallel", "layouts", "memory_soak",
    "gpu_check",
)


def description(name: str) -> str:
    """The first line of the docstring of the command ``benchmarks.<name>``, read from its source.

    Raises:
        ValueError: there is no such module, or it has no docstring.
    """
    spec = importlib.util.find_spec(f"benchmarks.{name}")
    if spec is None or spec.origin is None:
        raise ValueError(f"no module benchmarks.{name}")
    with open(spec.origin, encoding="utf-8") as handle:
        docstring = ast.get_docstring(ast.parse(handle.read()))
    if not docstring:
        raise ValueError(f"benchmarks.{name} has no docstring to describe it")
    return docstring.splitlines()[0]


def main(argv: Sequence[str] | None = None) -> int:
    """Print every command with its description."""
    argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0]).parse_args(argv)
    width = max(map(len, COMMANDS)) + len("python -m benchmarks.")
    print("Benchmark commands (python -m benchmarks.<name> --help for each one's options):\n")
    for name in COMMANDS:
        print(f"  {'python -m benchmarks.' + name:<{width}}  {description(name)}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
