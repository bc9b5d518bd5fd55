"""Resume is exact, or refused: the guard that compares a resumed run's settings with those its
checkpoint was written under.

What :meth:`~agents.training.trainer.Trainer.load` runs, between reading the checkpoint and loading the
backend's folder (:mod:`agents.training.checkpoint` checks every file's length and SHA-256):

1. :func:`check_settings` compares the settings with those the checkpoint holds and refuses any change
   but the free ones below, with a one-line list of the differences. A change made on purpose goes
   through when ``run.allow_changes`` names it (a ``group.field``, a whole ``group``, or ``all``). The
   backend takes its optimiser settings from the new config, so a changed learning rate takes effect;
2. :func:`record_resume` appends the changes to ``resume_log.jsonl`` in the run's folder, rewrites
   ``config.json`` to the settings the run now has, and drops a torn last line of ``metrics.jsonl`` and
   ``samples.jsonl`` (a kill mid-write, :func:`drop_torn_tail`), saying so in one line on stderr. The
   loggers then cut both back to the checkpoint's step, replacing each file atomically.

Free settings change how a run is watched, paced and stored, never what a step computes; each is
declared at its field with ``metadata=RESUME_FREE`` (``{"resume_free": True}``) in its group's class, an
algorithm's or a rollout engine's or backend's options too. No list of them is kept by hand:
:func:`free_settings` collects them for a config, and ``python -m agents.train --help`` ends the help of
each with :data:`FREE_NOTE` (:func:`declared_free`). ``run.steps`` is free unless a warm-up is a share of
it. Everything else - the seed, data, protocol and reward, model, algorithm and its maths, optimiser, the
warm start's training, held-out questions, device, backend and thread count (which change floating-point
results) - is the run's meaning.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from agents.training.config import CHOSEN_GROUPS, GROUPS, TrainConfig
from agents.training.run_files import RunFiles
from search_env.files import write_atomically

__all__ = ["FREE_NOTE", "check_settings", "declared_free", "drop_torn_tail", "free_settings", "record_resume",
           "settings_changes"]

_ABSENT = "<absent>"
_FREE = "resume_free"  #: the key of :data:`agents.training.config.RESUME_FREE`

FREE_NOTE = "(a resume may change it)"
"""What ``python -m agents.train --help`` adds to the help of each setting declared free, so that a reader
learns which settings a resume takes without being told from the fields themselves."""


def declared_free(group_class: type, field_name: str) -> bool:
    """Whether the group class ``group_class`` declares its field ``field_name`` with
    ``metadata=RESUME_FREE``: the fields :func:`free_settings` collects and ``--help`` marks."""
    fields = {f.name: f for f in dataclasses.fields(group_class)} if dataclasses.is_dataclass(group_class) else {}
    return field_name in fields and bool(fields[field_name].metadata.get(_FREE))


def free_settings(config: TrainConfig) -> frozenset[str]:
    """The ``group.field`` names a resume of ``config`` may change without being told: the fields of
    every group declared with ``metadata=RESUME_FREE``, less ``run.steps`` when a warm-up is a share of
    the steps (their number then changes the learning-rate schedule)."""
    free: set[str] = set()
    for group in dataclasses.fields(config):
        options = getattr(config, group.name)
        if dataclasses.is_dataclass(options):
            free.update(f"{group.name}.{f.name}" for f in dataclasses.fields(options) if declared_free(type(options), f.name))
    if config.optim.warmup_ratio > 0 or getattr(config.algorithm, "critic_warmup_ratio", 0) > 0:
        free.discard("run.steps")
    return frozenset(free)


def settings_changes(saved: Mapping[str, Any], config: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """``{"group.field": (saved value, value now)}`` for each setting of ``config`` that differs from
    ``saved`` (a :meth:`TrainConfig.as_dict` mapping, as ``config.json`` holds it); ``"algo"`` too."""
    try:  # the saved settings with the fields added since filled in with their defaults
        saved = TrainConfig.from_dict(saved).as_dict()
    except Exception:  # noqa: BLE001 (a field since removed, an algorithm not imported: compare as written)
        saved = dict(saved)
    before, after = _flat(_as_json(saved)), _flat(_as_json(config.as_dict()))
    return {key: (before.get(key, _ABSENT), after.get(key, _ABSENT))
            for key in sorted(before.keys() | after.keys()) if before.get(key, _ABSENT) != after.get(key, _ABSENT)}


def check_settings(config: TrainConfig, saved: Mapping[str, Any], source: str) -> dict[str, tuple[Any, Any]]:
    """The differences between ``config`` and the run's ``saved`` settings (written in ``source``, named in
    messages); ``ValueError`` (one line) when one is neither free nor allowed by ``run.allow_changes``."""
    allowed = config.run.allow_changes
    _check_allowed_names(config, allowed)
    changes = settings_changes(saved, config)
    free = free_settings(config)
    refused = [key for key in changes if key not in free and not _named(key, allowed)]
    if refused:
        listed = ", ".join(f"{key} {_show(changes[key][0])} -> {_show(changes[key][1])}" for key in refused)
        raise ValueError(f"the resumed run's settings differ from its own ({source}): {listed}; a resume keeps "
                         f"them, or pass run.allow_changes: [{', '.join(refused)}] to change them on purpose")
    return changes


def record_resume(files: RunFiles, step: int, config: TrainConfig, changes: Mapping[str, tuple[Any, Any]]) -> None:
    """What a resume at ``step`` leaves in the run's folder: its ``changes`` (those of
    :func:`check_settings`, if any) appended to ``resume_log.jsonl`` with ``config.json`` rewritten to the
    settings the run goes on with, and ``metrics.jsonl`` and ``samples.jsonl`` without a torn last line."""
    if changes:
        free, allowed = free_settings(config), config.run.allow_changes
        record = {"step": step, "changes": {key: [old, new] for key, (old, new) in changes.items()},
                  "allowed": sorted(key for key in changes if key not in free and _named(key, allowed))}
        files.root.mkdir(parents=True, exist_ok=True)
        with open(files.resume_log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        write_atomically(files.config, json.dumps(config.as_dict(), indent=2) + "\n")
    for log in (files.metrics, files.samples):
        drop_torn_tail(log)


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


def _check_allowed_names(config: TrainConfig, names: list[str]) -> None:
    known = {"all", "algo", *GROUPS, *CHOSEN_GROUPS}
    fields = set(_flat(_as_json(config.as_dict())))
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


def _as_json(value: Any) -> Any:
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
