"""What the DeepSpeed backend (:mod:`agents.training.backends.deepspeed`) asks of DeepSpeed before it trains:
the package, imported quietly and without the CPU op it would compile (and lock) at every start; the
engine's config, derived from the run's; master weights that share the parameter partition's memory where
nothing is converted; and the number of ranks that wrote an engine checkpoint, read before it is loaded."""
from __future__ import annotations

import json
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import torch

from agents.training.backends.settings import BackendSettings
from agents.training.library_noise import hide_deepspeed_cpu_notice, ignore_deprecated_collective_warnings

__all__ = ["deepspeed_config", "import_deepspeed", "saved_ranks", "share_master_weights", "skip_shared_memory_op"]


def import_deepspeed() -> Any:
    """The ``deepspeed`` module, or one ``ImportError`` line naming the extra that installs it.

    DeepSpeed's logger writes to the ``sys.stdout`` of the moment it is made, at import: it is imported
    with stdout pointing at stderr, so that its lines (the accelerator it picked, its warnings) stay off
    the training command's stdout, which holds the run's own results; its CPU notice and the deprecation
    warnings its collectives raise are filtered (:mod:`agents.training.library_noise`).
    """
    hide_deepspeed_cpu_notice()
    ignore_deprecated_collective_warnings()
    try:
        with redirect_stdout(sys.stderr):
            import deepspeed
    except ImportError:
        raise ImportError("run.backend deepspeed needs the deepspeed package: pip install 'searchqa-gym[deepspeed]'") from None
    skip_shared_memory_op(deepspeed)
    return deepspeed


def skip_shared_memory_op(deepspeed: Any) -> None:
    """Keep DeepSpeed from compiling its CPU shared-memory communication op when it starts its process group.

    Why: DeepSpeed compiles that op (through torch's extension builder) in every process that joins a
    group on a CPU, each time under a lock file in torch's extensions folder, even when it is built
    already; a process killed during the build leaves the lock, and every later DeepSpeed run then waits
    on it for ever, saying nothing. The op serves DeepSpeed's inference all-reduce only - training's
    collectives are torch's own - so marking it unavailable (DeepSpeed's table of the ops this machine
    can build, which its group start reads) changes nothing a run computes, and no lock is taken.
    """
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


def deepspeed_config(settings: BackendSettings, world_size: int, *, on_gpu: bool, bf16_ok: bool,
                     hidden_size: int | None = None) -> dict[str, Any]:
    """The engine's config for a run: derived from the backend's ``settings`` (micro batch, clipping, ZeRO
    stage, precision), then overridden by the keys of the JSON file ``backend.config`` names.

    Raises:
        ValueError: the file cannot be read, or a value is left ``"auto"`` (this backend resolves none).
    """
    optim, options = settings.optim, settings.options
    micro = optim.micro_batch_size if optim.micro_batch_size > 0 else 1
    zero: dict[str, Any] = {"stage": options.zero_stage, "overlap_comm": False, "contiguous_gradients": True}
    if options.zero_stage == 3 and hidden_size:
        h = hidden_size
        zero.update({"reduce_bucket_size": h * h, "stage3_prefetch_bucket_size": int(0.9 * h * h),
                     "stage3_param_persistence_threshold": 10 * h})
    derived: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro * world_size,
        # step() is the accumulation boundary: the trainer decides how many micro-batches an update has.
        "managed_gradient_accumulation": False,
        "gradient_clipping": optim.max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": bool(on_gpu and bf16_ok and settings.dtype != "fp32")},
        "fp16": {"enabled": False},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }
    if options.config:
        path = Path(options.config)
        try:
            overrides = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"backend.config {path}: {' '.join(str(exc).split())}") from None
        if not isinstance(overrides, dict):
            raise ValueError(f"backend.config {path} must hold a JSON object")
        derived = _merged(derived, overrides)
    left = _auto_keys(derived)
    if left:
        raise ValueError(f"the DeepSpeed config leaves {', '.join(left)} as \"auto\"; give a value "
                         "(this backend derives micro batch, clipping and precision from the run's config)")
    return derived


def _merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _auto_keys(values: dict[str, Any], prefix: str = "") -> list[str]:
    found = []
    for key, value in values.items():
        if isinstance(value, dict):
            found += _auto_keys(value, f"{prefix}{key}.")
        elif value == "auto":
            found.append(prefix + key)
    return found


def share_master_weights(optimizer: Any) -> None:
    """Make a ZeRO optimiser's master partitions the very buffers of this rank's parameter partition
    where the two have the same dtype and device (training without mixed precision, as in fp32 on a CPU),
    instead of a copy of them.

    Why: with nothing to convert, the copy is a second fp32 image of the partition (4 bytes per parameter
    over the ranks) that only ever holds the same values: the step writes the master and then copies it
    into the parameters. DeepSpeed's ZeRO-3 means to share them in that case but compares a
    ``torch.device`` with a device name (never equal), and ZeRO-2 always clones. Sharing leaves every
    value, and the engine's own copies between the two (now from a buffer onto itself), as they were.
    """
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    if hasattr(optimizer, "fp32_partitioned_groups_flat"):  # ZeRO-3
        pairs = list(zip(getattr(optimizer, "fp16_partitioned_groups_flat", []), optimizer.fp32_partitioned_groups_flat))
    elif hasattr(optimizer, "single_partition_of_fp32_groups"):  # ZeRO-1/2
        import torch.distributed as dist

        pairs = [(partitions[dist.get_rank(group=group)], master) for partitions, master, group in
                 zip(optimizer.parallel_partitioned_bit16_groups, optimizer.single_partition_of_fp32_groups,
                     optimizer.real_dp_process_group)]
    for partition, master in pairs:
        same_kind = partition is not None and (partition.dtype, partition.device, partition.shape) == \
            (master.dtype, master.device, master.shape)
        if same_kind and master.numel() and master.untyped_storage().data_ptr() != partition.untyped_storage().data_ptr():
            master.data = partition.data


#: A ZeRO engine's optimiser shard, one per data-parallel rank: ``[bf16_]zero_pp_rank_R_mp_rank_MM_optim_states.pt``.
_OPTIM_SHARD = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


def saved_ranks(tag_folder: Path) -> int:
    """How many data-parallel ranks wrote the engine checkpoint in ``tag_folder`` (one optimiser shard each);
    0 when it holds no shard to tell by. Read from the file names, before DeepSpeed opens any file."""
    ranks = {int(m.group(1)) for p in Path(tag_folder).iterdir() if (m := _OPTIM_SHARD.match(p.name))}
    return len(ranks)
