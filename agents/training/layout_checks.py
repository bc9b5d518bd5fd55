"""Which layouts a run can take - backend, number of ranks, rollout engine and its options together - checked
when the run's config is, so that a combination that cannot run ends in one line before any model loads.

Run (tested on CPU ranks over gloo): one process with any engine; data-parallel ranks (``run.backend`` fsdp,
deepspeed at ZeRO-2 or ZeRO-3, under ``torchrun``) with the HF sampler, the in-process vLLM engine colocated on
every rank (each rank its own engine, synced from the gathered weights one tensor at a time), or vLLM servers
(``rollout.engine vllm-server``: rank 0 launches or reaches them and sends them the weights, every rank sends
its own rows' requests), LoRA adapters included (the engines serve them on their frozen base); and on ranks
with ``rollout.max_staleness`` K >= 1 on vLLM servers (the rollouts' collectives on a group of their own).

Refused: an engine that holds no weights of its own with ``rollout.max_staleness`` (nothing to keep a
rollout ahead on); ``rollout.max_staleness`` on several ranks with an engine other than vllm-server (the
colocated engine's rollouts share the trainer's group and device with the update); servers the engine launches itself (no
``engine.urls``) when the ranks span machines (they listen on rank 0's loopback address).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from agents.rollout.engines import lookup_engine
from agents.training.async_rollout import check_staleness_engine, ranks_refusal
from agents.training.backends.distributed import launcher_world_size

if TYPE_CHECKING:
    from agents.training.config import TrainConfig

__all__ = ["check_layout"]


def check_layout(config: TrainConfig) -> None:
    """Raise ``ValueError`` (one line) when ``config``, launched as this process was (``WORLD_SIZE`` ranks),
    asks for a layout that cannot run (module docstring)."""
    ranks, here = launcher_world_size(), int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    if config.rollout.engine == "vllm-server" and not getattr(config.engine, "urls", None) and 0 < here < ranks:
        raise ValueError(f"rollout.engine vllm-server launches its servers on rank 0's machine (127.0.0.1), which "
                         f"the ranks of the other machines cannot reach ({ranks} ranks, {here} here): start them with "
                         "python -m agents.rollout.vllm_server_process and give engine.urls and engine.group_host")
    staleness = config.rollout.max_staleness
    if not staleness:
        return
    check_staleness_engine(staleness, config.rollout.engine)
    refusal = ranks_refusal(staleness, lookup_engine(config.rollout.engine).engine, ranks, config.rollout.engine)
    if refusal:
        raise ValueError(refusal)
