"""What a benchmark ran on, recorded beside its figures: a number means little without the machine, its
load at the time and the versions of what it ran.

Everything here is read without side effects and without optional packages being required: a field that
cannot be read on this machine is ``None`` rather than an error.
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["machine_info", "machine_line"]

_REPO = Path(__file__).resolve().parents[1]


def _cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what the platform reports)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_bytes() -> int | None:
    """Total physical memory (``/proc/meminfo`` on Linux, else ``os.sysconf``)."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _usable_cores() -> int | None:
    """Cores this process may run on (its affinity mask: fewer than the machine's in a container)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _gpus() -> list[dict[str, Any]]:
    """Each visible CUDA device's name and memory (empty without torch or a GPU)."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [{"name": torch.cuda.get_device_name(i), "memory_bytes": torch.cuda.get_device_properties(i).total_memory}
            for i in range(torch.cuda.device_count())]


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except (ImportError, AttributeError):
        return None


def _git_commit() -> str | None:
    """The checkout's commit, with ``+changes`` when the working tree differs from it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_REPO, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_REPO, capture_output=True,
                               text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+changes" if dirty else "")


def machine_info() -> dict[str, Any]:
    """The machine and software a benchmark runs on: CPU model and cores (the machine's and those this
    process may use), load average at the time of the call, memory, GPUs, OS, Python and the versions
    of torch, transformers and numpy, and the git commit of the checkout."""
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {
        "cpu": _cpu_model(), "cores": os.cpu_count(), "usable_cores": _usable_cores(), "load_average": load,
        "memory_bytes": _memory_bytes(), "gpus": _gpus(), "os": platform.platform(), "python": sys.version.split()[0],
        "torch": _version("torch"), "transformers": _version("transformers"), "numpy": _version("numpy"),
        "commit": _git_commit(),
    }


def machine_line(info: dict[str, Any]) -> str:
    """``info`` (from :func:`machine_info`) in one line for a report's heading."""
    memory = f"{info['memory_bytes'] / 2**30:.0f} GiB" if info.get("memory_bytes") else "memory unknown"
    load = " ".join(f"{x:.2f}" for x in info["load_average"]) if info.get("load_average") else "unknown"
    gpus = ", ".join(g["name"] for g in info.get("gpus") or []) or "no GPU"
    return (f"{info.get('cpu') or 'unknown CPU'}, {info.get('usable_cores')} of {info.get('cores')} cores usable, {memory}, "
            f"{gpus}; load average {load}; Python {info.get('python')}, torch {info.get('torch') or '-'}, "
            f"commit {info.get('commit') or 'unknown'}")
