"""A warm-started policy kept as a model folder, one per set of settings, so that several training runs
start from the very same weights and the warm start is paid once.

The folder is ``<cache>/<digest>/policy``, a standard transformers model folder with its tokenizer
(:meth:`~agents.policies.policy.HFPolicy.save_pretrained`), which a run loads by naming it in
``model.name`` with ``warm_start.steps: 0``: the built-in tokenizer travels with the weights, so the
run's environment encodes prompts and results with the same ids. The digest is a hash of every setting
the warm start's weights depend on (:func:`benchmarks.warm_cache.warm_start_key`: the warm start, the
model, the world, the environment, the seed and the optimiser's batching), of the gradient clipping the
backend applies to it, and of what changes their floating-point rounding (backend, device, precision,
torch threads, torch version), so a change of any of them makes a new folder instead of reusing a stale one. The folder is written under a temporary name and
renamed when complete, so a run killed during the warm start leaves no half-written cache behind.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from benchmarks.warm_cache import warm_start_key

if TYPE_CHECKING:
    from agents.training.config import TrainConfig

__all__ = ["RECORD_FILE", "WarmStart", "cached_warm_start", "cache_key"]

#: What a cache folder records besides its policy: the key, the warm start's statistics and its time.
RECORD_FILE = "warm_start.json"


@dataclass(frozen=True)
class WarmStart:
    """A warm-started policy in the cache.

    Attributes:
        policy_dir: the model folder a run names in ``model.name``.
        digest: the hash of the settings (the cache folder's name).
        reused: whether an earlier invocation made it (no warm start ran now).
        seconds / cpu_seconds: wall and process CPU time the warm start took when it was made.
        stats: its statistics (:meth:`agents.training.warm_start.SFTResult.as_dict`: first and last loss ...).
    """

    policy_dir: Path
    digest: str
    reused: bool
    seconds: float
    cpu_seconds: float
    stats: dict[str, float] = field(default_factory=dict)


def cache_key(config: TrainConfig) -> dict[str, Any]:
    """Every setting the warm start of ``config`` depends on, as plain JSON values."""
    import torch

    return {**warm_start_key(config), "max_grad_norm": config.optim.max_grad_norm, "backend": config.run.backend,
            "device": config.run.device, "dtype": config.run.dtype, "num_threads": config.run.num_threads,
            "torch": torch.__version__}


def cached_warm_start(config: TrainConfig, cache_dir: str | os.PathLike[str], *,
                      log: Callable[[str], Any] = print) -> WarmStart:
    """The policy ``config`` warm-starts (``warm_start.steps`` steps on scripted demonstrations, as a run
    of it would before RL), from ``cache_dir`` when an earlier call made it with the same settings
    (:func:`cache_key`), else made now and saved there.

    Raises:
        ValueError: ``config`` has no warm start (``warm_start.steps`` is 0).
    """
    if config.warm_start.steps < 1:
        raise ValueError("a cached warm start needs warm_start.steps >= 1")
    key = cache_key(config)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    cache = Path(cache_dir)
    folder = cache / digest
    record = folder / RECORD_FILE
    if record.is_file():
        saved = json.loads(record.read_text(encoding="utf-8"))
        if saved.get("key") != key:  # a folder renamed or edited by hand: never train from it
            raise ValueError(f"{folder} holds a warm start of other settings than its name says: remove it")
        return WarmStart(folder / "policy", digest, True, saved["seconds"], saved["cpu_seconds"], saved["stats"])
    log(f"warm start of seed {config.run.seed}: {config.warm_start.steps} steps, cached in {folder}")
    cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=cache))
    try:
        made = _warm_start(config, scratch)
        (scratch / RECORD_FILE).write_text(json.dumps({"key": key, "seconds": made.seconds, "cpu_seconds": made.cpu_seconds,
                                                       "stats": made.stats}, indent=2) + "\n", encoding="utf-8")
        os.replace(scratch, folder)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return WarmStart(folder / "policy", digest, False, made.seconds, made.cpu_seconds, made.stats)


def _warm_start(config: TrainConfig, folder: Path) -> WarmStart:
    """Warm-start ``config``'s policy as its trainer would (:func:`agents.training.build.build_trainer`,
    then :func:`agents.training.warm_start.warm_start`) and save it in ``folder/policy``. Held-out
    questions are not built: the warm start never sees them."""
    from agents.training.build import build_trainer
    from agents.training.warm_start import warm_start

    trainer = build_trainer(config.updated({"run.output_dir": str(folder), "eval.questions": 0, "run.report_to": []}))
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        result = warm_start(trainer.backend, config, trainer.env)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        trainer.export_policy(folder / "policy")
    finally:
        trainer.close_environments()
    return WarmStart(folder / "policy", "", False, wall, cpu, result.as_dict())
