"""Train a search agent from the command line.

    python -m agents.train --config agents/configs/demo.yaml           # the embedded demo, on a CPU
    python -m agents.train --config agents/configs/search-r1-grpo.yaml --model.name ~/models/qwen2.5-3b \\
        --data.dataset ../shared/data/hotpotqa_train_sample.jsonl --data.corpus ../shared/data/corpus.jsonl
    python -m agents.train --algo ppo --run.steps 200 --eval.every 20 --run.output_dir runs/ppo --run.resume true
    python -m agents.train --config agents/configs/search-r1-grpo.yaml --model.name smollm2 --smoke   # a trial of minutes

Flags follow the config's groups (:mod:`agents.training.config`): ``--GROUP.FIELD VALUE``. Three choices
decide a group's fields: ``--algo NAME`` the ``algorithm`` group (``--algo ppo --help`` lists PPO's),
``--rollout.engine NAME`` the ``engine`` group and ``--run.backend NAME`` the ``backend`` group.
``--config recipe.yaml`` loads a recipe first, wherever it stands; every flag overrides it. ``--import
MODULE`` imports a module before anything is read, so the algorithms, protocols and rewards it registers
can be named (rollout engines and backends too). ``--smoke`` shrinks the recipe to a trial of minutes and
keeps the rest of it (:mod:`agents.training.smoke`), saying in one line what it changed. Parsing is
jsonargparse's; ``--help`` shows the docstrings it reads without their Sphinx markup.

Bad input - an unknown algorithm or flag (with the nearest known flag), a bad value, a missing model,
dataset or corpus file, a tokenizer of another model, a device this machine lacks, an output folder that
is not writable, already holds a run (without ``--run.resume`` or ``--run.overwrite``) or is in use by a
run still going (:mod:`agents.training.run_lock`) - ends the
program with one ``error:`` line and exit status 2. ``--help``, flag, device and output-folder errors
answer before transformers (or any model) is loaded. A run that fails while it trains - diverged
(:class:`~agents.training.health.TrainingFailed`: too many updates in a row skipped for a non-finite
gradient), or a checkpoint or log it cannot write (a full disk) - ends with one ``error:`` line naming the
cause or the path, and exit status 1. At the end the program prints a before/after evaluation table, how
many steps updated the policy, and where the curve, logs, checkpoint and policy are (the policy is exported
at the last step only).

Ctrl-C stops a run cleanly: after the current step (or at once during the start's evaluations and warm
start, back to the last checkpoint), with a checkpoint that ``--run.resume true`` continues, and exit
status 3 ("stopped early"; a callback that stops the run gives it too). A Ctrl-C while the model loads
prints one line and exits with status 3 as well. ``--run.stop_after N``, a planned stop, exits 0.

Once its models are built, the run's first line (on stderr) says where it trains: ``--run.device auto`` (the default) is the GPU when
CUDA is available (each rank's own under ``torchrun``) and the CPU otherwise.

In Python, :func:`agents.training.build.build_trainer` assembles what the command runs from a
:class:`~agents.training.config.TrainConfig`.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import itertools
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from search_env.console import nearest_flags, plain_text

__all__ = ["main", "parse_changes", "parse_config", "recipes_first"]

#: A recipe's placeholder for a value the user must give (e.g. ``model: {name: ???}``).
MISSING = "???"
#: The algorithm a run without ``--algo`` (and without a recipe naming one) trains with.
DEFAULT_ALGO = "grpo"
#: The exit status of a run stopped before it was done (Ctrl-C, or a callback): ``run.resume`` continues it.
STOPPED_EARLY = 3


def parse_config(argv: Sequence[str]) -> Any:
    """The :class:`~agents.training.config.TrainConfig` that ``argv`` describes (with ``--smoke``, shrunk:
    :mod:`agents.training.smoke`).

    Raises ``ValueError`` (one line) for an unknown algorithm, flag or value, a missing recipe file, or a
    value the recipe leaves to the user (``???``) that is still unset.
    """
    return _parse(argv)[0]


def recipes_first(argv: Sequence[str]) -> list[str]:
    """``argv`` with every ``--config FILE`` (and ``--config=FILE``) moved to the front, in their order, the
    other arguments after them in theirs: the recipes are applied first and every flag then overrides them,
    wherever it stands (jsonargparse applies a recipe where it stands, over the flags before it)."""
    recipes: list[str] = []
    rest: list[str] = []
    items = iter(argv)
    for item in items:
        if item == "--config":
            recipes += [item, *itertools.islice(items, 1)]  # and its file
        elif item.startswith("--config="):
            recipes.append(item)
        else:
            rest.append(item)
    return [*recipes, *rest]


def parse_changes(changes: Sequence[str], recipe: str | Path) -> Any:
    """The :class:`~agents.training.config.TrainConfig` of ``recipe`` with ``GROUP.FIELD=VALUE`` changes (a
    benchmark's ``--set``: YAML values, typed by the field as ``--GROUP.FIELD VALUE`` types them;
    ``algo=NAME`` picks the algorithm).

    Raises:
        ValueError: a malformed item, an unknown field (with the nearest one, as ``--set`` spells it) or a
            bad value (one line).
    """
    argv = ["--config", str(recipe)]
    for item in changes:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--set takes GROUP.FIELD=VALUE, got {item!r}")
        argv += [f"--{name}", value]
    try:
        return parse_config(argv)
    except ValueError:
        parser, _ = _parser(argv)
        fields = [flag[2:] for action in parser._actions for flag in action.option_strings
                  if flag.startswith("--") and "." in flag or flag == "--algo"]
        for item in changes:
            name = item.partition("=")[0]
            if name not in fields:
                close = difflib.get_close_matches(name, fields, n=1, cutoff=0.75)
                raise ValueError(f"--set {item}: no field {name}" + (f" (did you mean {close[0]}?)" if close else "")) from None
        raise


def _parse(argv: Sequence[str]) -> tuple[Any, list[str]]:
    """:func:`parse_config`'s config, and the lines the command prints about it (what ``--smoke`` changed)."""
    argv = recipes_first(argv)
    parser, choices = _parser(argv)
    algo = choices["algo"]
    from jsonargparse import ArgumentError as JsonArgumentError

    try:
        namespace = parser.parse_args(list(argv))
    except JsonArgumentError as exc:
        message = nearest_flags(_one_line(str(exc)), [s for action in parser._actions for s in action.option_strings])
        if "'algorithm' does not accept" in message:  # a field of another algorithm's config, from a recipe
            message += f" ({algo}'s config has no such field: python -m agents.train --algo {algo} --help lists them)"
        for group, flag in (("engine", "rollout.engine"), ("backend", "run.backend")):
            if f"--{group}." in message or f"'{group}' does not accept" in message:  # a field of another choice's group
                name = choices[flag]
                message += (f" (the {group} group holds the fields of {flag} {name!r}: "
                            f"python -m agents.train --{flag} {name} --help lists them)")
        raise ValueError(message) from None
    values = namespace.clone(with_meta=False).as_dict()
    smoke = bool(values.get("smoke"))
    values = {k: v for k, v in values.items() if k not in ("config", "import_", "smoke")}
    unset = [f"{group}.{name}" for group, fields in values.items() if isinstance(fields, dict)
             for name, value in fields.items() if value == MISSING]
    if unset:
        raise ValueError("the recipe leaves " + ", ".join(unset) + " to you: pass " + " ".join(f"--{n} ..." for n in unset))
    values["algo"] = algo
    from agents.training.config import TrainConfig

    config = TrainConfig.from_dict(values)
    if not smoke:
        return config, []
    from agents.training.smoke import smoke_changes, smoke_line

    changes = smoke_changes(config)
    return config.updated(changes), [smoke_line(changes, config)]


def _parser(argv: Sequence[str]) -> tuple[Any, dict[str, str]]:
    """The argument parser for the choices ``argv`` makes (algorithm, rollout engine, backend), and those
    choices by flag (``algo``, ``rollout.engine``, ``run.backend``)."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    from agents.learners.registry import ALGORITHMS
    from agents.training.config import GROUPS, TrainConfig

    choices = _choices(argv)
    algo = choices["algo"]
    chosen = TrainConfig(algo).updated({key: value for key, value in choices.items() if key != "algo"}).chosen_groups()
    parser = ArgumentParser(
        prog="python -m agents.train", exit_on_error=False, allow_abbrev=False,
        usage="python -m agents.train [--config RECIPE.yaml] [--algo NAME] [--GROUP.FIELD VALUE ...]",
        description=(f"Train a search agent. Algorithms: {', '.join(ALGORITHMS)}. The 'algorithm' group below "
                     f"lists {algo}'s fields and defaults; --algo NAME --help lists another's."),
    )
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML recipe of config groups (agents/configs/*.yaml)")
    parser.add_argument("--algo", default=algo, help=f"the algorithm (default: %(default)s: the recipe's, else {DEFAULT_ALGO})")
    parser.add_argument("--import", dest="import_", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (its registered algorithms, rollout engines, backends, protocols and rewards can then be named)")
    parser.add_argument("--smoke", action="store_true",
                        help="a smoke run of the recipe: its steps, questions, samples, tokens, mini-batch, warm start "
                             "and evaluation capped to a few (agents.training.smoke), everything else kept")
    for name, group_class in GROUPS.items():
        parser.add_class_arguments(group_class, nested_key=name, as_positional=False)
    for name, (_, group_class) in chosen.items():
        parser.add_class_arguments(group_class, nested_key=name, as_positional=False)
    _plain_help(parser, {**GROUPS, **{name: group_class for name, (_, group_class) in chosen.items()}})
    return parser, choices


def _plain_help(parser: Any, classes: dict[str, type]) -> None:
    """``--help`` as a terminal shows it: each group titled with the whole first paragraph of its class's
    docstring (jsonargparse takes its first line, which may stop mid-sentence), and the titles and the
    options' help without Sphinx markup (:func:`plain_text`). The docstrings themselves keep it, for the
    API documentation. A setting a resume may change ends with its note, read from its field's metadata
    (:func:`agents.training.resume.declared_free`)."""
    import inspect

    from agents.training.resume import FREE_NOTE, declared_free

    for group in parser._action_groups:
        group_class = classes.get(getattr(group, "dest", None))
        if group_class is not None and inspect.getdoc(group_class):
            group.title = " ".join(inspect.getdoc(group_class).split("\n\n")[0].split()).rstrip(".:")
        if group.title:
            group.title = plain_text(group.title)
    for action in parser._actions:
        group_name, _, field_name = action.dest.partition(".")
        if group_name in classes and declared_free(classes[group_name], field_name):
            action.help = f"{action.help or ''} {FREE_NOTE}".lstrip()
        if isinstance(action.help, str):
            action.help = plain_text(action.help)


#: The choices that decide a group's fields: flag -> (the recipe's group, its field) and the default.
_CHOICES = {"algo": ((None, "algo"), DEFAULT_ALGO), "rollout.engine": (("rollout", "engine"), "hf"),
            "run.backend": (("run", "backend"), "torch")}


def _choices(argv: Sequence[str]) -> dict[str, str]:
    """``--algo``, ``--rollout.engine`` and ``--run.backend`` from the command line, else the last recipe's,
    else the default; modules named by ``--import`` are imported first. Checked against their registries
    (one line with the known names)."""
    import yaml

    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in _CHOICES:
        pre.add_argument(f"--{flag}", dest=flag)
    pre.add_argument("--config", action="append", default=[])
    pre.add_argument("--import", dest="imports", action="append", default=[])
    known, _ = pre.parse_known_args(list(argv))
    for module in known.imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"--import {module}: {_one_line(str(exc))}") from None
    choices = {flag: getattr(known, flag) for flag in _CHOICES}
    for path in known.config:
        if not Path(path).is_file():
            raise ValueError(f"recipe file not found: {path}")
        try:
            recipe = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ValueError(f"recipe {path} is not valid YAML: {_one_line(str(exc))}") from None
        if not isinstance(recipe, dict):
            continue
        for flag, ((group, name), _) in _CHOICES.items():
            section = recipe if group is None else recipe.get(group)
            if getattr(known, flag) is None and isinstance(section, dict) and name in section:
                choices[flag] = section[name]
    return {flag: default if choices[flag] is None else choices[flag] for flag, (_, default) in _CHOICES.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line (see the module docstring); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    lock = None
    try:
        config, notes = _parse(argv)
        if os.environ.get("RANK", "0") == "0":
            for line in notes:
                print(line, file=sys.stderr)
        from agents.training.run_checks import check_device, check_output_dir
        from agents.training.run_lock import lock_run_folder

        check_device(config.run.device)
        check_output_dir(config.run)
        _check_reach(config)
        if os.environ.get("RANK", "0") == "0":  # one run in the folder at a time (a launcher's rank 0 holds it)
            lock = lock_run_folder(config.run.output_dir)
        from search_env.console import progress_enabled

        if not progress_enabled(config.run.progress):
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # loading bars would bury the one-line errors and the report
        from agents.training.build import build_trainer

        trainer = build_trainer(config)
        _say_where(config, trainer)
    except (ValueError, KeyError, OSError, ImportError) as exc:  # bad input; anything else is a bug: traceback
        if os.environ.get("RANK", "0") == "0" or not getattr(exc, "every_rank", False):  # said once per run
            print(f"error: {_error_text(exc)}", file=sys.stderr)
        if lock is not None:
            lock.release()
        return 2
    except KeyboardInterrupt:  # Ctrl-C before the first step: nothing was trained
        print("stopped while the run was being set up: nothing trained", file=sys.stderr)
        if lock is not None:
            lock.release()
        return STOPPED_EARLY
    from agents.training.health import TrainingFailed
    from search_env.worker import WorkerDied

    try:
        result = trainer.train()
    except (TrainingFailed, OSError, WorkerDied) as exc:  # diverged, a file it cannot write (a full disk), a dead env worker
        print(f"error: {_error_text(exc)}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # a collective that timed out: one line naming the rank that stopped answering
        from agents.training.backends.distributed import as_rank_stopped

        stopped = as_rank_stopped(exc)
        if stopped is None:
            raise
        print(f"error: {stopped}", file=sys.stderr)
        return 1
    finally:
        trainer.close_environments()
        if lock is not None:
            lock.release()
    if trainer.backend.rank == 0:  # with several data-parallel ranks, one report
        print(result.report())
    return STOPPED_EARLY if result.stopped else 0


def _check_reach(config: Any) -> None:
    """Before the model loads: a retrieval server the run cannot reach ends it (one line). DeepSpeed's CPU
    notice, which a plain run would print as it exports the policy, is kept off from here on."""
    from agents.training.library_noise import hide_deepspeed_cpu_notice
    from agents.training.run_reach import check_retrieval_servers

    hide_deepspeed_cpu_notice()
    if config.data.retrieval_url is not None:
        check_retrieval_servers(config.data.retrieval_url)


def _say_where(config: Any, trainer: Any) -> None:
    """The run's first line once it is built (rank 0): the device and precision it trains in, and the
    warnings for a GPU it leaves idle (:mod:`agents.training.devices`)."""
    from agents.training.devices import device_line, device_warnings

    backend = trainer.backend
    if backend.rank == 0:
        for line in [device_line(config.run, backend.device, backend.world_size), *device_warnings(config.run.device)]:
            print(line, file=sys.stderr)


def _error_text(exc: BaseException) -> str:
    """One line for ``exc``: a ``KeyError``'s message (not its repr); an ``OSError`` built with its own
    message (the run's, naming the path) without the ``[Errno N]`` prefix."""
    if isinstance(exc, KeyError) and exc.args:
        return _one_line(str(exc.args[0]))
    if isinstance(exc, OSError) and exc.strerror and not exc.filename:
        return _one_line(exc.strerror)
    return _one_line(str(exc))


def _one_line(message: str) -> str:
    return " ".join(message.split())


if __name__ == "__main__":
    from agents.training.rank_exit import run_main

    run_main(main)  # under torchrun, a rank leaves without finalisation: see agents.training.rank_exit
