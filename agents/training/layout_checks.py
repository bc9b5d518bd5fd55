"""Which layouts a run can take - backend, number of ranks, rollout engine and its options together - checked
when the run's config is, so that a combination that cannot run ends in one line before any model loads.

Run (tested on CPU ranks over gloo): one process with any engine; data-parallel ranks (``run.backend`` fsdp,
deepspeed at ZeRO-2 or ZeRO-3, under ``torchrun``) with the HF sampler or the in-process vLLM engine colocated on
every rank (each rank its own engine, synced from the gathered weights one tensor at a time), LoRA adapters
included (the engines serve them on their frozen base).

Refused: the vLLM server engine on several ranks (its servers take one trainer's rows and weights: each rank
would start servers of its own and open the same weight group); an engine that holds no weights of its own
with ``rollout.max_staleness`` (nothing to keep a rollout ahead on), and ``rollout.max_staleness`` on several
ranks (their rollouts and updates take collectives in step, which a rollout ahead on a thread of its own would
interleave).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from agents.training.async_rollout import check_staleness_engine
from agents.training.backends.distributed import launcher_world_size

if TYPE_CHECKING:
    from agents.training.config import TrainConfig

__all__ = ["check_layout"]


def check_layout(config: TrainConfig) -> None:
    """Raise ``ValueError`` (one line) when ``config``, launched as this process was (``WORLD_SIZE`` ranks),
    asks for a layout that cannot run (module docstring)."""
    ranks = launcher_world_size()
    if ranks > 1 and config.rollout.engine == "vllm-server":
        raise ValueError(f"rollout.engine vllm-server serves one trainer process; this launch has {ranks} ranks: use "
                         "rollout.engine vllm (an engine on every rank) or run one process")
    staleness = config.rollout.max_staleness
    if not staleness:
        return
    check_staleness_engine(staleness, config.rollout.engine)
    if ranks > 1:
        raise ValueError(f"rollout.max_staleness {staleness} runs on one process; this launch has {ranks} ranks "
                         "(their rollouts and updates take collectives in step): drop it, or run one process")
