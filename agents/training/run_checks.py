"""Checks a run passes before it trains, each failing with one line that names what to change.

* :func:`check_device`: ``run.device`` exists on this machine (a well-formed ``cuda`` on a machine
  without one would otherwise fail deep inside model loading);
* :func:`check_output_dir`: ``run.output_dir`` is a writable folder, and holds no earlier run unless
  ``run.resume`` continues it or ``run.overwrite`` replaces it (:func:`clear_previous_run`);
* :func:`check_prompt_room`: ``env.max_context`` leaves room after the longest prompt (measured with the
  tokenizer alone, before the model is loaded);
* :func:`recipe_warnings`: settings that train, but not as the recipe's author probably meant.

``python -m agents.train`` runs :func:`check_device` and :func:`check_output_dir` before any model is
loaded; the trainer runs :func:`prepare_output` when it starts (the output checks again, for runs built
in Python, and the warnings).
"""
from __future__ import annotations

import errno
import heapq
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from agents.training.run_files import REPLACED_BY_NEW_RUN, RUN_MARKERS

if TYPE_CHECKING:
    from agents.training.config import RunConfig, TrainConfig

__all__ = ["check_device", "check_output_dir", "check_prompt_room", "check_writable", "clear_previous_run", "prepare_output",
           "previous_run", "recipe_warnings"]

#: How many of the longest questions (by characters) :func:`check_prompt_room` encodes: a prompt's token
#: count follows its text's length closely, and encoding every question of a large dataset would cost seconds.
PROMPTS_MEASURED = 64


def check_prompt_room(config: TrainConfig, codec: Any, examples: Iterable[Any], sources: Mapping[str, Any] | None = None) -> None:
    """Raise ``ValueError`` (one line) when a prompt of ``examples`` (the longest :data:`PROMPTS_MEASURED`
    questions) leaves no room under ``env.max_context`` for the agent to answer, naming the prompt's length,
    so that the run fails before its model is loaded instead of at its first episode. A tool-calls
    protocol's prompt lists every source as a tool, so it is measured with ``sources`` (the run's)."""
    from search_env.env import prompt_text
    from search_env.protocols import get_protocol

    protocol = get_protocol(config.env.protocol)
    if protocol.tool_calling is not None and sources:
        from search_env.resolve import resolve_source_names
        from search_env.tool_calls import fit_protocol

        _, default = resolve_source_names(sources, None, None)
        protocol = fit_protocol(protocol, sources, default, codec, bool(codec.chat_template))
    longest = heapq.nlargest(PROMPTS_MEASURED, {example.question for example in examples}, key=len)
    tokens = max((len(codec.encode(prompt_text(protocol, codec, question))) for question in longest), default=0)
    if tokens >= config.env.max_context:
        raise ValueError(f"env.max_context {config.env.max_context} leaves no room for an answer: the longest prompt takes "
                         f"{tokens} tokens; raise --env.max_context above {tokens}")


def check_device(device: str) -> None:
    """Raise ``ValueError`` (one line) when ``device`` is not a torch device available here (``auto``: the
    one :func:`~agents.training.devices.resolve_device` picks, always available)."""
    import torch

    from agents.training.devices import resolve_device, unknown_device

    try:
        parsed = torch.device(resolve_device(device))
    except RuntimeError:
        raise ValueError(unknown_device(device)) from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"run.device {device!r}: no CUDA device is available here (use --run.device cpu)")
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(f"run.device {device!r}: this machine has {count} CUDA device(s): cuda:0 to cuda:{count - 1}")
    elif parsed.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ValueError(f"run.device {device!r}: MPS is not available here (use --run.device cpu)")


def check_writable(directory: str | os.PathLike[str]) -> Path:
    """Create ``directory`` if needed and write (then remove) a file in it; raise ``OSError`` with one
    line naming the folder when that fails (read-only, full, not a folder, no permission)."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise OSError(exc.errno or errno.EIO, f"run.output_dir {str(path)!r} is not writable: {reason}") from None
    return path


def previous_run(directory: str | os.PathLike[str]) -> Path | None:
    """The file that shows ``directory`` holds a run (:data:`~agents.training.run_files.RUN_MARKERS`), or ``None``."""
    for name in RUN_MARKERS:
        if (Path(directory) / name).exists():
            return Path(directory) / name
    return None


def check_output_dir(run: RunConfig) -> Path:
    """``run.output_dir`` is writable (:func:`check_writable`) and, unless ``run.resume`` or
    ``run.overwrite``, holds no earlier run (``ValueError``, one line)."""
    path = check_writable(run.output_dir)
    found = None if run.resume or run.overwrite else previous_run(path)
    if found is not None:
        raise ValueError(f"run.output_dir {str(path)!r} already holds a run ({found.name}): pass --run.resume true "
                         "to continue it, --run.overwrite true to replace it, or another --run.output_dir")
    return path


def clear_previous_run(directory: str | os.PathLike[str]) -> None:
    """Remove what a new run replaces of an earlier one in ``directory`` (``run.overwrite``,
    :data:`~agents.training.run_files.REPLACED_BY_NEW_RUN`)."""
    for name in REPLACED_BY_NEW_RUN:
        target = Path(directory) / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()


def prepare_output(config: TrainConfig, fresh: bool) -> None:
    """What a trainer checks as it starts: ``run.output_dir`` writable and, for a ``fresh`` run, holding
    no earlier run unless ``run.overwrite`` (whose files are then removed); then the
    :func:`recipe_warnings`, one line each on stderr."""
    from agents.training.console_log import say

    if fresh:
        check_output_dir(config.run)
        if config.run.overwrite:
            clear_previous_run(config.run.output_dir)
    else:
        check_writable(config.run.output_dir)
    for line in recipe_warnings(config):
        say(line)


def recipe_warnings(config: TrainConfig) -> list[str]:
    """One line per setting that trains, but less than it seems (documented at each field): a
    learning-rate warm-up longer than the run, a mini-batch larger than a step's rows."""
    from agents.learners.config import warmup_steps

    run, optim = config.run, config.optim
    lines = []
    warmup = warmup_steps(optim.warmup_steps, optim.warmup_ratio, run.steps)
    if warmup > run.steps:
        lines.append(f"warning: optim.warmup_steps ({warmup}) is longer than run.steps ({run.steps}): the learning rate "
                     f"only reaches {run.steps / warmup:.0%} of optim.learning_rate")
    algorithm = config.algorithm
    critic = getattr(algorithm, "critic_warmup_steps", 0)
    if critic > run.steps:
        lines.append(f"warning: algorithm.critic_warmup_steps ({critic}) is longer than run.steps ({run.steps}): the "
                     f"critic's learning rate only reaches {run.steps / critic:.0%} of its peak")
    rows = config.rollout.questions_per_step * algorithm.group_size
    if optim.mini_batch_size > rows:
        lines.append(f"warning: optim.mini_batch_size ({optim.mini_batch_size}) is larger than a step's rows "
                     f"(rollout.questions_per_step {config.rollout.questions_per_step} x algorithm.group_size "
                     f"{algorithm.group_size} = {rows}): each update pass is one optimiser step over the whole rollout")
    return lines
