"""Resume is exact, or refused: what a run's checkpoint is checked against before the run goes on, and
the start of a run (its first evaluation and warm start) checkpointed like its steps.

:func:`resume_run` (what :meth:`~agents.training.trainer.Trainer.load` runs):

1. reads ``checkpoint.pt``, its length and SHA-256 checked (:mod:`agents.training.checkpoint`), and
   removes what a crash mid-save left beside it (temporary files, step folders it does not name);
2. compares the settings with those the checkpoint was written under (kept in it; ``config.json`` for
   an older one) and refuses any change but the free ones below, with a one-line list of the
   differences. A change made on purpose goes through when ``run.allow_changes`` names it (a
   ``group.field``, a whole ``group``, or ``all``); the changes of a resume are appended to
   ``resume_log.jsonl`` in the run's folder and ``config.json`` is rewritten to the settings the run now
   has. The backend takes its optimiser settings from the new config, so a changed learning rate
   takes effect;
3. checks each file of the backend's folder against the size and digest the checkpoint lists, then
   loads it;
4. drops a torn last line of ``metrics.jsonl`` (a kill mid-write), saying so in one line on stderr.

Free settings (:data:`FREE_SETTINGS`) change how a run is watched, paced and stored, never what a step
computes: ``run.steps`` (unless a warm-up is a share of it), ``run.stop_after``, ``run.save_every``,
``run.log_every``, ``run.progress``, ``run.resume``, ``run.report_to``, ``run.output_dir`` (a moved run),
``run.log_entropy``, ``run.allow_changes``, ``run.overwrite``, ``run.print_every``, ``run.sample_every``,
``run.warn_failed_searches``, ``warm_start.save_every``, ``optim.max_skipped_updates`` (when a diverged run stops), ``eval.every``,
``eval.by_hops``, ``eval.periodic_sampled``, ``rollout.env_worker`` (the worker steps the same
episodes) and ``run.gradient_checkpointing`` (a recomputation gives the same gradients). Everything else - the seed, data, protocol and reward, model, algorithm and its maths, optimiser, warm start, held-out
questions, device, backend and thread count (which change floating-point results) - is the run's meaning.

:func:`start_run` (what :meth:`~agents.training.trainer.Trainer.train` runs first) takes a fresh run
through its start - the config written and the ``"start"`` evaluation, the warm start, the ``"warm
start"`` evaluation - and a resumed one through the parts its checkpoint does not hold. With a warm start
a checkpoint is written before it (to come back to), every ``warm_start.save_every`` of its steps (a run
stopped there goes on from that step, :class:`~agents.training.warm_start.WarmStartProgress`) and after
it, so a run stopped later never redoes it. A Ctrl-C during the start stops cleanly: the run goes back to its last checkpoint (or, before any,
to its state when the start began), says in one line where it stopped, and ``train`` ends there with a
checkpoint that ``run.resume`` continues.
"""
from __future__ import annotations

import difflib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from agents.training.checkpoint import capture_rng, clean_run_folder, load_run, load_run_backend, read_run, restore_rng
from agents.training.config import GROUPS, TrainConfig

if TYPE_CHECKING:
    from agents.training.trainer import Trainer
    from agents.training.warm_start import WarmStartProgress

__all__ = [
    "CONFIG_FILE", "FREE_SETTINGS", "RESUME_LOG", "START_PARTS", "drop_torn_tail", "resume_run", "run_state",
    "settings_changes", "start_run",
]

CONFIG_FILE = "config.json"  #: the run's settings, in its output folder
RESUME_LOG = "resume_log.jsonl"  #: one line per resume that changed settings: the step and the changes
METRICS_FILE = "metrics.jsonl"  #: the run's log (:class:`agents.training.loggers.JsonLinesLogger`)

#: Settings a resume may change without being told: they do not change what a step computes.
FREE_SETTINGS = frozenset({
    "run.steps", "run.stop_after", "run.save_every", "run.log_every", "run.progress", "run.resume",
    "run.report_to", "run.output_dir", "run.log_entropy", "run.allow_changes", "run.overwrite", "run.print_every",
    "run.sample_every", "run.warn_failed_searches", "warm_start.save_every", "optim.max_skipped_updates", "eval.every", "eval.by_hops",
    "eval.periodic_sampled", "rollout.env_worker", "run.gradient_checkpointing",
})
#: The parts of a run's start, in order; a checkpoint lists those it holds (all of them past step 0).
START_PARTS = ("start", "warm start", "warm start evaluation")
_ABSENT = "<absent>"


# -- resuming ---------------------------------------------------------------------------------------
def resume_run(trainer: Trainer, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check and load the run checkpoint at ``path`` into ``trainer``'s backend (see the module
    docstring); returns the trainer's state for :meth:`~agents.training.trainer.Trainer.load_state_dict`
    and sets ``trainer.start_done``, the parts of the start the checkpoint holds.

    Raises:
        FileNotFoundError: no checkpoint, or a file of it is missing.
        ValueError: one line: a damaged file, a changed setting, a checkpoint of another model.
    """
    path = Path(path)
    state = read_run(path)
    main = trainer.backend.rank == 0  # with several ranks, rank 0 alone changes the run's files
    if main:
        clean_run_folder(path, keep=path.parent / state["backend_dir"])
    trainer.backend.barrier()
    step = int(state.get("step", 0))
    saved, source = _saved_settings(state, path)
    changes = _check_settings(trainer.config, saved, source)
    state = load_run_backend(path, state, trainer.backend)
    if changes and main:
        _record_changes(trainer, path.parent, step, changes)
    if main:
        drop_torn_tail(Path(trainer.output_dir) / METRICS_FILE)
    done = state.pop("start_done", START_PARTS)
    trainer.start_done = set(START_PARTS if step > 0 else done)
    trainer.warm_start_progress = _progress(state.pop("warm_start_progress", None))
    trainer.warm_start_stats = state.pop("warm_start_stats", None)
    state.pop("config_json", None)
    return state


def run_state(trainer: Trainer) -> dict[str, Any]:
    """What a run's checkpoint holds besides the trainer's own state: its settings (as JSON text) and the
    parts of the start done."""
    done = getattr(trainer, "start_done", None)
    if done is None:
        done = START_PARTS if trainer.step > 0 else ()
    state: dict[str, Any] = {"config_json": json.dumps(trainer.config.as_dict(), sort_keys=True),
                             "start_done": [part for part in START_PARTS if part in done]}
    progress = getattr(trainer, "warm_start_progress", None)
    if progress is not None and "warm start" not in done:
        state["warm_start_progress"] = progress.as_dict()
    stats = getattr(trainer, "warm_start_stats", None)
    if stats is not None and "warm start evaluation" not in done:  # logged with that evaluation
        state["warm_start_stats"] = dict(stats)
    return state


def _progress(state: dict[str, Any] | None) -> WarmStartProgress | None:
    from agents.training.warm_start import WarmStartProgress

    return None if state is None else WarmStartProgress.from_dict(state)


def settings_changes(saved: Mapping[str, Any], config: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """``{"group.field": (saved value, value now)}`` for each setting of ``config`` that differs from
    ``saved`` (a :meth:`TrainConfig.as_dict` mapping, as ``config.json`` holds it); ``"algo"`` too."""
    try:  # the saved settings with the fields added since filled in with their defaults
        saved = TrainConfig.from_dict(saved).as_dict()
    except Exception:  # noqa: BLE001 (a field since removed, an algorithm not imported: compare as written)
        saved = dict(saved)
    before, after = _flat(_plain(saved)), _flat(_plain(config.as_dict()))
    return {key: (before.get(key, _ABSENT), after.get(key, _ABSENT))
            for key in sorted(before.keys() | after.keys()) if before.get(key, _ABSENT) != after.get(key, _ABSENT)}


def _saved_settings(state: Mapping[str, Any], path: Path) -> tuple[dict[str, Any] | None, str]:
    """The settings the checkpoint was written under, and where they come from."""
    if "config_json" in state:
        return json.loads(state["config_json"]), f"checkpoint {path}"
    written = path.parent / CONFIG_FILE
    if written.is_file():
        try:
            return json.loads(written.read_text(encoding="utf-8")), str(written)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{written} is not JSON ({exc.msg}, line {exc.lineno}): the run's settings are unknown") from None
    return None, str(path.parent)


def _check_settings(config: TrainConfig, saved: Mapping[str, Any] | None, source: str) -> dict[str, tuple[Any, Any]]:
    """The differences between ``config`` and the run's ``saved`` settings; ``ValueError`` (one line) when
    one is neither free nor allowed by ``run.allow_changes``."""
    allowed = config.run.allow_changes
    _check_allowed_names(config, allowed)
    if saved is None:
        if "all" in allowed:
            return {}
        raise ValueError(f"no record of the settings of the run in {source} (no {CONFIG_FILE}): cannot check that "
                         "the resume keeps them; pass run.allow_changes: [all] to resume it anyway")
    changes = settings_changes(saved, config)
    free = set(FREE_SETTINGS)
    if config.optim.warmup_ratio > 0 or getattr(config.algorithm, "critic_warmup_ratio", 0) > 0:
        free.discard("run.steps")  # the warm-up is a share of the steps: their number changes the schedule
    refused = [key for key in changes if key not in free and not _named(key, allowed)]
    if refused:
        listed = ", ".join(f"{key} {_show(changes[key][0])} -> {_show(changes[key][1])}" for key in refused)
        raise ValueError(f"the resumed run's settings differ from its own ({source}): {listed}; a resume keeps "
                         f"them, or pass run.allow_changes: [{', '.join(refused)}] to change them on purpose")
    return changes


def _check_allowed_names(config: TrainConfig, names: list[str]) -> None:
    known = {"all", "algo", "algorithm", *GROUPS}
    fields = set(_flat(_plain(config.as_dict())))
    for name in names:
        if name in known or name in fields:
            continue
        group = name.partition(".")[0]
        close = (difflib.get_close_matches(name, sorted(f for f in fields if f.startswith(group + ".")), n=1, cutoff=0.5)
                 or difflib.get_close_matches(name, sorted(fields | known), n=1, cutoff=0.6))
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"run.allow_changes names no setting: {name!r}{hint}; give group.field, a group, or all")


def _named(key: str, allowed: list[str]) -> bool:
    return "all" in allowed or key in allowed or key.partition(".")[0] in allowed


def _record_changes(trainer: Trainer, folder: Path, step: int, changes: Mapping[str, tuple[Any, Any]]) -> None:
    """Append the resume's changes to ``resume_log.jsonl`` and rewrite ``config.json`` to the settings
    the run goes on with."""
    allowed = trainer.config.run.allow_changes
    record = {"step": step, "changes": {key: [old, new] for key, (old, new) in changes.items()},
              "allowed": sorted(key for key in changes if key not in FREE_SETTINGS and _named(key, allowed))}
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / RESUME_LOG, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    _write_atomically(folder / CONFIG_FILE, json.dumps(trainer.config.as_dict(), indent=2) + "\n")


def drop_torn_tail(path: str | os.PathLike[str]) -> int:
    """Cut a torn last line (a write cut short by a kill) off the JSON-lines file at ``path`` and say so in
    one line on stderr; returns the bytes dropped (0: the file is whole, or absent). A damaged line
    before the last is not a torn write: ``ValueError`` naming the file and the line."""
    target = Path(path)
    if not target.is_file():
        return 0
    data = target.read_bytes()
    lines = data.split(b"\n")
    offset, last = 0, max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for number, line in enumerate(lines):
        if line.strip():
            try:
                json.loads(line)
            except ValueError:
                if number != last:
                    raise ValueError(f"{target} line {number + 1} is not a JSON record: the log is damaged") from None
                with open(target, "r+b") as handle:
                    handle.truncate(offset)
                dropped = len(data) - offset
                print(f"{target}: dropped a torn last line ({dropped} bytes, a write cut short)", file=sys.stderr)
                return dropped
        offset += len(line) + 1
    return 0


# -- the start of a run -----------------------------------------------------------------------------
def start_run(trainer: Trainer) -> None:
    """Take ``trainer`` through the parts of its start (:data:`START_PARTS`) that are not done: a fresh run
    through all of them, a resumed one through those its checkpoint does not hold. A Ctrl-C stops it
    cleanly (see the module docstring) and sets ``trainer.stop_requested``."""
    done = set(getattr(trainer, "start_done", None) or ()) if trainer.resumed else set()
    trainer.start_done = done
    if not trainer.resumed and trainer.backend.rank == 0:
        clean_run_folder(trainer.checkpoint_path)
    if done.issuperset(START_PARTS):
        return
    warm = trainer.config.warm_start.steps > 0
    rng, saved, part = capture_rng(), False, ""
    try:
        if "start" not in done:
            part = "the start evaluation"
            trainer._write_config()
            trainer._evaluate_stage("start")
            done.add("start")
        stats = getattr(trainer, "warm_start_stats", None)
        if not warm:
            done.update(START_PARTS)
            return
        if "warm start" not in done:
            part = "the warm start"
            if trainer.warm_start_progress is None:
                trainer.save(trainer.checkpoint_path)  # what a Ctrl-C or a kill during the warm start goes back to
            saved = True
            stats = trainer.warm_start_stats = trainer._warm_start()
            done.add("warm start")
            trainer.save(trainer.checkpoint_path)  # a run stopped after this point never redoes the warm start
        part = "the evaluation after the warm start"
        trainer._evaluate_stage("warm start", stats)
        done.update(START_PARTS)
    except KeyboardInterrupt:
        trainer.stop_requested = True
        if saved:  # back to the last checkpoint: the weights of a cut-short update are not kept
            state = load_run(trainer.checkpoint_path, trainer.backend)
            trainer.start_done = set(state.pop("start_done", ()))
            trainer.warm_start_progress = _progress(state.pop("warm_start_progress", None))
            trainer.warm_start_stats = state.pop("warm_start_stats", None)
            state.pop("config_json", None)
            trainer.load_state_dict(state)
        else:  # nothing moved the weights; a draw of the interrupted evaluation is undone
            restore_rng(rng)
        if "warm start" in trainer.start_done:
            then = "goes on from the warm-started policy"
        elif part == "the warm start" and trainer.warm_start_progress is not None:
            then = f"goes on from warm-start step {trainer.warm_start_progress.step}"
        elif part == "the warm start":
            then = "starts the warm start again"
        else:
            then = "runs it again"
        print(f"stopped during {part}; --run.resume true {then}", file=sys.stderr)


# -- helpers ----------------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """JSON's view of a value (tuples become lists), as ``config.json`` holds it."""
    return json.loads(json.dumps(value))


def _flat(values: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for group, fields in values.items():
        if isinstance(fields, Mapping):
            out.update({f"{group}.{name}": value for name, value in fields.items()})
        else:
            out[group] = fields
    return out


def _show(value: Any) -> str:
    return value if value == _ABSENT else json.dumps(value)


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
