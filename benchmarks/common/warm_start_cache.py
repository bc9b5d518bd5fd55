"""Warm-started policies kept between benchmark runs, one model folder per set of settings, so that several
runs start from the very same weights and the warm start's minutes are paid once.

The folder is ``<cache>/<digest>/policy``, a standard transformers model folder with its tokenizer
(:meth:`~agents.policies.policy.HFPolicy.save_pretrained`), beside :data:`RECORD_FILE` (the key, the warm
start's statistics and its time). A run loads it by naming it in ``model.name`` with ``warm_start.steps: 0``
(:func:`cached_warm_start`): the built-in tokenizer travels with the weights, so the run's environment
encodes prompts and results with the same ids. A benchmark that has built its trainer already loads the
weights into that trainer's policy instead (:func:`warm_started`); both ways share the folders.

The digest is a hash of the key (:func:`cache_key`): the whole config but the settings known not to change
the warm start's weights (:data:`NOT_IN_KEY`), and the torch version. Leaving out rather than listing
means a setting added to the config later is in the key until someone shows it does not matter, so a
change can make a new folder it did not need but never reuse a stale one. A folder is written under a
temporary name and renamed when complete, so a run killed during the warm start leaves no half-written
cache behind.
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

if TYPE_CHECKING:
    from agents.training.backends.base import TrainingBackend
    from agents.training.config import TrainConfig
    from agents.training.warm_start import WarmStartResult

__all__ = ["NOT_IN_KEY", "RECORD_FILE", "WarmStart", "cache_key", "cached_warm_start", "warm_started"]

#: What a cache folder records besides its policy: the key, the warm start's statistics and its time.
RECORD_FILE = "warm_start.json"

#: Config fields (``group.field``) and whole groups that do not change a warm start's weights, left out of
#: :func:`cache_key`. Every other field is in it: the model, the world, the environment the demonstrations
#: are played in, the warm start, the algorithm and its config (the policy it builds), the optimiser fields
#: the warm start's steps use (betas, weight decay, micro-batch, ``max_grad_norm``: the backend's clipping),
#: the seed, and the backend with its options, device, precision and threads, which change floating-point
#: rounding.
NOT_IN_KEY: frozenset[str] = frozenset({
    # where and how a run writes, logs and resumes
    "run.output_dir", "run.resume", "run.overwrite", "run.save_every", "run.log_every", "run.report_to", "run.progress",
    "run.print_every", "run.sample_every", "run.warn_failed_searches", "run.log_entropy", "run.allow_changes",
    # the reinforcement learning after the warm start: its length, learning rate schedule, batching and sampling
    "run.steps", "run.stop_after", "optim.learning_rate", "optim.warmup_steps", "optim.warmup_ratio", "optim.update_epochs",
    "optim.mini_batch_size", "rollout.questions_per_step", "rollout.temperature", "rollout.top_p", "rollout.env_worker",
    "rollout.engine", "engine",  # the rollout engine and its options (group ``engine``) sample RL rollouts only
    # held-out evaluation: the warm start never sees those questions (the cache builds none)
    "eval.every", "eval.questions", "eval.by_hops", "eval.periodic_sampled",
    # warm-start checkpoints: a warm start resumed from one ends at the same weights
    "warm_start.save_every",
})


@dataclass(frozen=True)
class WarmStart:
    """A warm-started policy in the cache.

    Attributes:
        policy_dir: the model folder a run names in ``model.name``.
        digest: the hash of the settings (the cache folder's name).
        reused: whether an earlier invocation made it (no warm start ran now).
        seconds / cpu_seconds: wall and process CPU time the warm start took when it was made.
        stats: its statistics (:meth:`agents.training.warm_start.WarmStartResult.as_dict`: first and last loss ...).
    """

    policy_dir: Path
    digest: str
    reused: bool
    seconds: float
    cpu_seconds: float
    stats: dict[str, float] = field(default_factory=dict)


def cache_key(config: TrainConfig) -> dict[str, Any]:
    """Every setting the warm start of ``config`` may depend on, as plain JSON values keyed ``group.field``
    (``algo`` alone): the whole config less :data:`NOT_IN_KEY`, and ``torch`` (the version). ``run.device``
    is the device it resolves to here (``auto`` is the GPU on one machine and the CPU on another)."""
    import torch

    from agents.training.devices import resolve_device

    flat: dict[str, Any] = {}
    for group, values in config.as_dict().items():
        if isinstance(values, dict):
            flat.update({f"{group}.{name}": value for name, value in values.items()})
        else:
            flat[group] = values
    key = {name: value for name, value in flat.items() if name not in NOT_IN_KEY and name.split(".")[0] not in NOT_IN_KEY}
    key["run.device"] = resolve_device(config.run.device)
    key["torch"] = torch.__version__
    return json.loads(json.dumps(key, default=str))  # plain lists and numbers, as the record file gives them back


def cached_warm_start(config: TrainConfig, cache_dir: str | os.PathLike[str], *,
                      log: Callable[[str], Any] = print) -> WarmStart:
    """The policy ``config`` warm-starts (``warm_start.steps`` steps on scripted demonstrations, as a run
    of it would before RL), from ``cache_dir`` when an earlier call made it with the same settings
    (:func:`cache_key`), else made now in a trainer of its own and saved there.

    Raises:
        ValueError: ``config`` has no warm start (``warm_start.steps`` is 0), or the folder of its settings
            holds a warm start of other settings (renamed or edited by hand).
    """
    if config.warm_start.steps < 1:
        raise ValueError("a cached warm start needs warm_start.steps >= 1")
    key, folder = _folder(config, cache_dir)
    saved = _saved(key, folder)
    if saved is not None:
        return saved
    log(f"warm start of seed {config.run.seed}: {config.warm_start.steps} steps, cached in {folder}")
    return _store(key, folder, lambda scratch: _warm_start_apart(config, scratch))


def warm_started(backend: TrainingBackend, config: TrainConfig, env: Any, cache_dir: str | os.PathLike[str] | None) -> None:
    """Warm-start ``backend.policy`` as the trainer does (:func:`agents.training.warm_start.warm_start` in
    ``env``), or load the weights of the folder in ``cache_dir`` that :func:`cached_warm_start` or an
    earlier call made with the same settings, saving them there when it is new (no cache: ``None``);
    then the backend's reference becomes the warm-started policy.

    Raises:
        ValueError: the folder of ``config``'s settings holds a warm start of other settings.
    """
    from agents.training.warm_start import warm_start

    if cache_dir is None:
        warm_start(backend, config, env)
    else:
        key, folder = _folder(config, cache_dir)
        saved = _saved(key, folder)
        if saved is not None:
            _load_weights(backend, saved.policy_dir)
        else:
            _store(key, folder, lambda scratch: _warm_start_here(backend, config, env, scratch))
    backend.reset_reference()


def _folder(config: TrainConfig, cache_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], Path]:
    """``config``'s key and the cache folder named by its digest."""
    key = cache_key(config)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return key, Path(cache_dir) / digest


def _saved(key: dict[str, Any], folder: Path) -> WarmStart | None:
    """The warm start kept in ``folder`` (``None``: none yet), checked to be of the settings ``key``."""
    record = folder / RECORD_FILE
    if not record.is_file():
        return None
    saved = json.loads(record.read_text(encoding="utf-8"))
    if saved.get("key") != key:  # a folder renamed or edited by hand: never train from it
        raise ValueError(f"{folder} holds a warm start of other settings than its name says: remove it")
    return WarmStart(folder / "policy", folder.name, True, saved["seconds"], saved["cpu_seconds"], saved["stats"])


def _store(key: dict[str, Any], folder: Path, make: Callable[[Path], tuple[WarmStartResult, float, float]]) -> WarmStart:
    """Run ``make`` (which writes the policy into ``<scratch>/policy`` and returns the warm start's result,
    wall and CPU seconds) in a scratch folder beside ``folder``, record it, and rename it to ``folder``."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        result, wall, cpu = make(scratch)
        stats = result.as_dict()
        (scratch / RECORD_FILE).write_text(json.dumps({"key": key, "seconds": wall, "cpu_seconds": cpu, "stats": stats},
                                                      indent=2) + "\n", encoding="utf-8")
        os.replace(scratch, folder)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return WarmStart(folder / "policy", folder.name, False, wall, cpu, stats)


def _timed_warm_start(backend: TrainingBackend, config: TrainConfig, env: Any) -> tuple[WarmStartResult, float, float]:
    from agents.training.warm_start import warm_start

    wall, cpu = time.perf_counter(), time.process_time()
    result = warm_start(backend, config, env)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def _warm_start_apart(config: TrainConfig, folder: Path) -> tuple[WarmStartResult, float, float]:
    """Warm-start ``config``'s policy in a trainer of its own, built as a run of it builds one
    (:func:`agents.training.build.build_trainer`), and save it in ``folder/policy``. Held-out questions
    are not built: the warm start never sees them."""
    from agents.training.build import build_trainer

    trainer = build_trainer(config.updated({"run.output_dir": str(folder), "eval.questions": 0, "run.report_to": []}))
    try:
        made = _timed_warm_start(trainer.backend, config, trainer.env)
        trainer.export_policy(folder / "policy")
    finally:
        trainer.close_environments()
    return made


def _warm_start_here(backend: TrainingBackend, config: TrainConfig, env: Any, folder: Path) -> tuple[WarmStartResult, float, float]:
    """Warm-start ``backend.policy`` in place and save it in ``folder/policy``, as a trainer exports it."""
    made = _timed_warm_start(backend, config, env)
    with backend.generation():
        if backend.rank == 0:
            backend.policy.save_pretrained(folder / "policy")
    backend.barrier()
    return made


def _load_weights(backend: TrainingBackend, policy_dir: Path) -> None:
    """Copy the language model's weights of the model folder ``policy_dir`` into ``backend.policy`` (every
    weight, or an error: the folder was made for the same model settings)."""
    import torch
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    backend.policy.lm.load_state_dict(saved.state_dict())
