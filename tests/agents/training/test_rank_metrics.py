"""A step's metrics over two real data-parallel ranks (gloo): a rank that held no rows after dynamic
sampling has no loss of its own, and the run still logs the other rank's."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agents.training.rank_metrics import all_rank_metrics

# Each rank's step metrics and update-statistic names. Rank 0 kept no rows: it ran only idle passes, so it
# has the optimiser's figures and no loss.
STEPS: dict[int, tuple[dict[str, float], set[str]]] = {
    0: ({"reward": 0.5, "lr": 1e-4, "grad_norm": 2.0, "rows": 0.0, "episodes": 4.0, "tokens_per_s": 10.0}, {"grad_norm"}),
    1: ({"reward": 0.7, "lr": 1e-4, "grad_norm": 2.0, "rows": 8.0, "episodes": 4.0, "tokens_per_s": 12.0, "loss/policy": 0.3,
         "clip_frac": 0.1, "advantage/mean": 0.4}, {"grad_norm", "loss/policy", "clip_frac"}),
}


class _GlooRanks:
    """The collectives ``all_rank_metrics`` uses, over ``torch.distributed``."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world_size = rank, world

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.clone()
        dist.all_reduce(out)
        return out

    def all_gather_object(self, obj: Any) -> list[Any]:
        box: list[Any] = [None] * self.world_size
        dist.all_gather_object(box, obj)
        return box


def _rank(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        metrics, update_keys = STEPS[rank]
        merged = all_rank_metrics(_GlooRanks(rank, 2), metrics, update_keys)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(merged), encoding="utf-8")
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_every_rank_logs_the_whole_runs_metrics_even_one_without_rows(tmp_path: Path) -> None:
    mp.start_processes(_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, start_method="spawn")
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text(encoding="utf-8")) for r in (0, 1))
    assert rank0 == rank1
    assert rank0["loss/policy"] == pytest.approx(0.3) and rank0["clip_frac"] == pytest.approx(0.1)  # rank 1's shares
    assert rank0["rows"] == 8.0 and rank0["episodes"] == 8.0 and rank0["tokens_per_s"] == pytest.approx(22.0)  # counts add up
    assert rank0["reward"] == pytest.approx(0.6)  # a mean of the ranks' means
    assert rank0["advantage/mean"] == pytest.approx(0.4)  # a mean over the one rank that has it
    assert rank0["grad_norm"] == 2.0 and rank0["lr"] == 1e-4  # alike on every rank
