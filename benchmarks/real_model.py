"""A pretrained model (SmolLM2-135M) learns to search real questions, against its untrained baselines.

Cold start and RL, then every row of the table on the held-out side of the fixed split of the seven QA sets.

    python -m benchmarks.real_model                      # the whole pipeline (hours on a 2-core CPU); resumes
    python -m benchmarks.real_model --quick              # every stage at a few steps and questions (minutes)
    python -m benchmarks.real_model --record benchmarks/results/real_model   # also keep the small text record
    python -m benchmarks.real_model --reproduces RUN_DIR  # RUN_DIR's steps are the record's, exactly?

The recipe is ``agents/configs/real-smollm2.yaml`` (``--config``; ``--set GROUP.FIELD=VALUE`` changes it). The
questions come from :mod:`search_env.data.splits`: training on ``real-qa@train``, periodic evaluation during
training on the first held-out questions, and every row of the table on the first ``--episodes`` held-out
questions of each of the seven sets (``nq@held-out`` ...): never trained on, and nothing is tuned on them.

Stages, in order; each is skipped when the same command finished before (``done/<stage>.json`` holds it) and
resumed where it stopped otherwise (run the same command again after a stop):

``train``
    The recipe's run, cold start then RL, in ``run/``: the command in ``command.json`` (``python -m
    agents.train ...``, resumed with ``--run.resume true``). The cold-start policy is exported to
    ``run/warm_start_policy/`` (``warm_start.export``), the trained one to ``run/policy/``.
``baselines``
    The untrained model under the recipe's protocol (role ``untrained``) and its direct, CoT, naive-RAG and
    IRCoT baselines (role ``baseline``: :mod:`agents.baselines`), played by the evaluation harness
    (``python -m benchmarks.evaluate``) into ``eval/baselines/``.
``trained``
    The cold-start and the trained policy on the held-out questions (roles ``cold-start`` and ``trained``), and
    the trained policy again with a source that returns nothing (``--probe empty``; role
    ``trained-empty-source``): its drop says how much of the gain comes from searching.
``report``
    ``summary.json`` (the command and one row per system: seven-set EM with a 95% bootstrap interval over
    questions, F1, cover-EM, searches per episode, where the episodes ended, per-set numbers; and the paired
    differences of :data:`DIFFERENCES`, RL's gain over the cold start first), ``table.md``
    and ``training.png`` (held-out EM by step beside the training reward); with ``--record DIR``,
    ``summary.json`` and the run's ``metrics.jsonl`` are copied to ``DIR``.

The harness runs are subprocesses, so each stage's output is what its command line says and can be rerun
alone; progress lines come from the harness and the trainer.

``--reproduces RUN_DIR`` checks a reproduction: the record's command (``summary.json``) run again, for example
with ``--run.stop_after 3 --run.output_dir RUN_DIR``, must log every step it ran exactly as the record's
``metrics.jsonl`` has it, the keys that measure the machine (times, rates, threads) aside. It prints each difference and exits 1 if
there is one.
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from benchmarks.common.real_model_report import (
    format_outcomes, format_table, paired_difference, plot_training, read_jsonl, read_rows, step_differences,
)
from search_env.console import HelpFormatter
from search_env.data.splits import HELD_OUT_SETS

__all__ = ["BASELINES", "DIFFERENCES", "QUICK", "RECORD", "STAGES", "main", "train_command"]

RECIPE = "agents/configs/real-smollm2.yaml"
#: Where the committed record lives.
RECORD = Path("benchmarks/results/real_model")
#: The stages, in the order they run.
STAGES = ("train", "baselines", "trained", "report")
#: The untrained model's rows: (name, role, harness agent over the recipe's model).
BASELINES = (("untrained (protocol)", "untrained", "hf:{model}"), ("direct", "baseline", "direct:{model}"),
             ("CoT", "baseline", "cot:{model}"), ("naive RAG", "baseline", "naive-rag:{model}"),
             ("IRCoT", "baseline", "ircot:{model}"))
#: What ``--quick`` changes in the recipe: every stage runs, on a few steps and questions.
QUICK = {"warm_start.steps": 2, "warm_start.examples": 32, "warm_start.batch_size": 2, "warm_start.save_every": 1,
         "run.steps": 1, "rollout.questions_per_step": 2, "algorithm.group_size": 2, "env.max_new_tokens": 16,
         "eval.questions": 0}
#: Held-out questions per set of the table with ``--quick``.
QUICK_EPISODES = 1
#: The baselines ``--quick`` plays (one of each role; the harness's own tests cover the others).
QUICK_BASELINES = ("untrained (protocol)", "direct")


def train_command(config: str, changes: Sequence[str], run_dir: Path) -> list[str]:
    """The ``python -m agents.train`` arguments of the run (without the resume flag)."""
    return ["python", "-m", "agents.train", "--config", config, *changes, "--run.output_dir", str(run_dir)]


def _changes(args: argparse.Namespace) -> list[str]:
    """The recipe changes as flags: ``--quick``'s, then ``--set``'s, always exporting the cold-start policy."""
    values = dict(QUICK) if args.quick else {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise SystemExit(f"error: --set takes GROUP.FIELD=VALUE, got {item!r}")
        values[key] = value
    values["warm_start.export"] = "true"
    return [token for key, value in values.items() for token in (f"--{key}", str(value))]


def _recipe(config: str, changes: Sequence[str]) -> Any:
    from agents.train import parse_config

    return parse_config(["--config", config, *changes])


def _run(command: Sequence[str], what: str, done: Path, resume: Sequence[str] = ()) -> None:
    """Run a stage's command (with ``resume``'s flags), unless ``done`` says this very command finished; mark it
    done when it ends well."""
    if done.is_file() and json.loads(done.read_text(encoding="utf-8")) == list(command):
        print(f"[real_model] {what}: done already ({done})", file=sys.stderr, flush=True)
        return
    print(f"[real_model] {what}: {shlex.join([*command, *resume])}", file=sys.stderr, flush=True)
    status = subprocess.call([sys.executable, *command[1:], *resume])
    if status != 0:
        raise SystemExit(f"error: {what} ended with status {status}; run the same command again to resume")
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps(list(command)) + "\n", encoding="utf-8")


def _evaluate(out: Path, agents: Sequence[str], config: Any, episodes: int, *, probe: str | None = None) -> list[str]:
    env, data = config.env, config.data
    command = ["python", "-m", "benchmarks.evaluate", "--dataset", *[f"{s}@held-out" for s in HELD_OUT_SETS],
               "--episodes", str(episodes), "--protocols", env.protocol, "--corpus", str(data.corpus),
               "--retriever", data.retriever, "--max-new-tokens", str(env.max_new_tokens),
               "--max-context", str(env.max_context), "--batch-size", "8", "--agents", *agents,
               "--output-dir", str(out)]
    if env.top_k is not None:
        command += ["--top-k", str(env.top_k)]
    if env.max_turns is not None:
        command += ["--max-turns", str(env.max_turns)]
    if probe is not None:
        command += ["--probe", probe]
    return command


def _systems(config: Any, run_dir: Path, quick: bool) -> dict[str, list[tuple[str, str, str]]]:
    model = config.model.name
    baselines = [row for row in BASELINES if not quick or row[0] in QUICK_BASELINES]
    return {"baselines": [(name, role, agent.format(model=model)) for name, role, agent in baselines],
            "trained": [("cold start", "cold-start", f"hf:{run_dir / 'warm_start_policy'}"),
                        ("trained", "trained", f"hf:{run_dir / 'policy'}")],
            "empty": [("trained, empty source", "trained-empty-source", f"hf:{run_dir / 'policy'}")]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_model", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=None,
                        help="where every stage writes (default runs/real_model, with --quick runs/real_model-quick)")
    parser.add_argument("--config", default=RECIPE, help="the training recipe")
    parser.add_argument("--set", action="append", default=[], metavar="GROUP.FIELD=VALUE", help="change the recipe")
    parser.add_argument("--quick", action="store_true",
                        help="every stage on a few steps and questions, two baselines: checks the machinery, measures nothing")
    parser.add_argument("--episodes", type=int, default=None, help="held-out questions per set in the table (default 100)")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES), help="run only these stages")
    parser.add_argument("--record", type=Path, default=None, metavar="DIR", help="copy summary.json and metrics.jsonl here")
    parser.add_argument("--reproduces", type=Path, default=None, metavar="RUN_DIR",
                        help="only compare RUN_DIR/metrics.jsonl with the record's (--record, default "
                             f"{RECORD}), the keys that measure the machine aside; exit 1 on a difference")
    args = parser.parse_args(argv)
    if args.reproduces is not None:
        raise SystemExit(_check_reproduction(args.reproduces, args.record or RECORD))
    episodes = args.episodes or (QUICK_EPISODES if args.quick else 100)
    out = args.output_dir or Path("runs/real_model-quick" if args.quick else "runs/real_model")
    changes = _changes(args)
    run_dir = out / "run"
    try:
        config = _recipe(args.config, changes)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    out.mkdir(parents=True, exist_ok=True)
    systems = _systems(config, run_dir, args.quick)
    command = train_command(args.config, changes, run_dir)
    (out / "command.json").write_text(json.dumps(command) + "\n", encoding="utf-8")
    done = out / "done"
    if "train" in args.stages:
        resume = ["--run.resume", "true"] if (run_dir / "checkpoint.pt").is_file() else []
        _run(command, "train", done / "train.json", resume)
    if "baselines" in args.stages:
        _run(_evaluate(out / "eval" / "baselines", [a for _, _, a in systems["baselines"]], config, episodes), "baselines",
             done / "baselines.json")
    if "trained" in args.stages:
        _run(_evaluate(out / "eval" / "trained", [a for _, _, a in systems["trained"]], config, episodes), "trained",
             done / "trained.json")
        _run(_evaluate(out / "eval" / "empty", [a for _, _, a in systems["empty"]], config, episodes, probe="empty"),
             "trained, empty source", done / "empty.json")
    if "report" in args.stages:
        _report(out, command, systems, args.record)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise SystemExit(f"error: {path} does not exist")
    return read_jsonl(path)


def _check_reproduction(run_dir: Path, record: Path) -> int:
    """Print how ``run_dir``'s steps differ from the record's (nothing but a verdict when they do not); 1 if
    they do."""
    run = _read_jsonl(run_dir / "metrics.jsonl")
    differences = step_differences(_read_jsonl(record / "metrics.jsonl"), run)
    for line in differences:
        print(line)
    steps = sorted({entry.get("step", 0) for entry in run})
    span = f"steps {steps[0]}-{steps[-1]}" if steps else "no steps"
    print(f"{span} of {run_dir}: {len(differences)} difference(s) from {record / 'metrics.jsonl'}, machine keys aside")
    return 1 if differences or not run else 0


#: The paired differences the report measures: (what it says, the system, the one it is compared with), by role
#: or, for a baseline, by name.
DIFFERENCES = (("RL over the cold start", "trained", "cold-start"), ("trained over direct", "trained", "direct"),
               ("trained over its empty source", "trained", "trained-empty-source"),
               ("cold start over direct", "cold-start", "direct"))


def _differences(episodes: dict[str, list[dict[str, Any]]], systems: dict[str, list[tuple[str, str, str]]],
                 sets: list[str]) -> list[dict[str, Any]]:
    """:data:`DIFFERENCES` whose two systems have finished playing every set (``episodes``: each part's)."""
    played = {name if role == "baseline" else role: (episodes[part], agent)
              for part, part_systems in systems.items() if part in episodes for name, role, agent in part_systems}
    measured = []
    for name, a, b in DIFFERENCES:
        if a in played and b in played:
            try:
                gain = paired_difference(*played[a], *played[b], sets)
            except ValueError:  # one of them has not played every set yet
                continue
            measured.append({"name": name, "system": a, "against": b, "avg_em": gain["mean"],
                             "ci_low": gain["ci_low"], "ci_high": gain["ci_high"]})
    return measured


def _format_differences(differences: list[dict[str, Any]]) -> str:
    lines = ["| difference | avg EM [95% CI] |", "|---|---|"]
    lines += [f"| {d['name']} | {d['avg_em']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] |" for d in differences]
    return "\n".join(lines)


def _report(out: Path, command: list[str], systems: dict[str, list[tuple[str, str, str]]], record: Path | None) -> None:
    sets = [f"{s}@held-out" for s in HELD_OUT_SETS]
    files = {part: out / "eval" / part / "episodes.jsonl" for part in ("baselines", "trained", "empty")}
    episodes = {part: read_jsonl(path) for part, path in files.items() if path.is_file()}
    rows = [row for part, played in episodes.items() for row in read_rows(played, systems[part], sets)]
    differences = _differences(episodes, systems, sets)
    summary = {"command": command, "sets": sets, "rows": [row.as_record() for row in rows], "differences": differences}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    parts = [("EM", format_table(rows, sets, "em", intervals=True)), ("F1", format_table(rows, sets, "f1", intervals=True)),
             ("cover-EM", format_table(rows, sets, "cover_em", intervals=True)),
             ("Where the episodes ended (shares of each system's episodes)", format_outcomes(rows)),
             ("Paired differences (the same questions; seven-set average EM)", _format_differences(differences))]
    table = "\n\n".join(f"{title}:\n\n{part}" for title, part in parts) if rows else "(no finished evaluation yet)"
    (out / "table.md").write_text(table + "\n", encoding="utf-8")
    metrics = out / "run" / "metrics.jsonl"
    if metrics.is_file():
        plot_training(metrics, out / "training.png", title="SmolLM2-135M, held-out EM and training reward", rows=rows)
    print(table)
    if record is not None:
        record.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "summary.json", record / "summary.json")
        if metrics.is_file():
            shutil.copyfile(metrics, record / "metrics.jsonl")


if __name__ == "__main__":
    main()
