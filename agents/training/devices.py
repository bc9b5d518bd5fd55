"""Where a run computes: ``run.device`` resolved, the line that says so, and the warnings for a GPU left idle.

``run.device: auto`` (the default) is CUDA when this process can use it and the CPU otherwise; under
``torchrun`` each rank takes its own GPU (``LOCAL_RANK``). The setting is stored as given (``auto`` in the
run's ``config.json``), so a resume on the same machine compares equal; :func:`resolve_device` is what the
models are moved to. :func:`device_line` is the run's first line once its models are built (device, GPU name, precision), and
:func:`device_warnings` the lines for a run that leaves a GPU idle: CUDA available but ``run.device: cpu``
chosen, or a CPU-only build of PyTorch on a machine that has NVIDIA GPUs (``pip`` pinned the CPU wheel).
"""
from __future__ import annotations

import difflib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from agents.training.config import RunConfig

__all__ = ["AUTO", "device_line", "device_warnings", "has_nvidia_gpu", "resolve_device", "unknown_device"]

#: The ``run.device`` value that picks CUDA when available, else the CPU.
AUTO = "auto"


#: Other names people give a GPU, and the torch device type they mean.
_ALIASES = {"gpu": "cuda", "nvidia": "cuda", "cuda0": "cuda:0"}


def unknown_device(device: str) -> str:
    """The one line for a ``run.device`` torch does not know: the devices a run names, and the nearest
    one (``gpu``: ``cuda``) rather than every device type torch was built to know."""
    kind, colon, index = device.strip().partition(":")
    known = _ALIASES.get(kind.lower()) or next(iter(difflib.get_close_matches(kind.lower(), (AUTO, "cpu", "cuda", "mps"), n=1)), None)
    hint = f" (did you mean {known + colon + index!r}?)" if known else ""
    return f"run.device {device!r} is not a torch device{hint}: give {AUTO}, cpu, cuda, cuda:N or mps"


def resolve_device(setting: str) -> str:
    """The torch device ``run.device`` names: ``auto`` is ``cuda:LOCAL_RANK`` when CUDA is available (this
    rank's GPU under ``torchrun``; ``cuda:0`` when each rank sees one GPU, or without a launcher) and
    ``cpu`` otherwise; any other value is returned as it is."""
    if setting != AUTO:
        return setting
    if not torch.cuda.is_available():
        return "cpu"
    count = torch.cuda.device_count()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return f"cuda:{local_rank if count > 1 else 0}"


def has_nvidia_gpu() -> bool:
    """Whether this machine shows an NVIDIA GPU to its users (``nvidia-smi`` on the path, or ``/dev/nvidia0``),
    whatever PyTorch build is installed."""
    return shutil.which("nvidia-smi") is not None or Path("/dev/nvidia0").exists()


def device_warnings(setting: str) -> list[str]:
    """One line per way the run ``run.device`` = ``setting`` leaves a GPU idle: a CPU-only PyTorch build on a
    machine with NVIDIA GPUs, or the CPU chosen while CUDA is available."""
    lines = []
    if torch.version.cuda is None and has_nvidia_gpu():
        lines.append("warning: this machine has an NVIDIA GPU but PyTorch is a CPU-only build "
                     f"(torch {torch.__version__}): the run trains on the CPU; install a CUDA build of torch "
                     "(README, 'Installing on a GPU machine')")
    elif torch.device(resolve_device(setting)).type == "cpu" and torch.cuda.is_available():
        lines.append(f"warning: run.device {setting!r} trains on the CPU although CUDA is available "
                     "(--run.device auto uses the GPU)")
    return lines


def device_line(run: RunConfig, device: torch.device, world_size: int = 1) -> str:
    """What a run computes on, in one line: ``device`` (the backend's, and the GPU's name), the precision
    ``run.dtype`` gives there, and the backend with its ranks."""
    from agents.training.backends import training_dtype

    name = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    dtype = {torch.bfloat16: "bf16", torch.float32: "fp32"}[training_dtype(run.dtype, device)]
    setting = f"run.device {run.device}: " if run.device == AUTO else ""
    ranks = f", {world_size} ranks (each its own device)" if world_size > 1 else ""
    return f"{setting}training on {device}{name}, dtype {dtype} (run.dtype {run.dtype}), backend {run.backend}{ranks}"
