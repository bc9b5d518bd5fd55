"""One rank of :func:`agents.training.run_reach.check_shared_output` under ``torchrun`` (gloo):
``python -m tests.agents.training.shared_folder_rank FOLDER shared|apart REPORTS`` checks FOLDER on every rank, or
FOLDER followed by the rank's number (a folder per rank), and writes ``ok`` or the error line to REPORTS/rank<N>.txt
(a file per rank: two ranks printing to the launcher's one pipe can interleave their lines)."""
from __future__ import annotations

import os
import sys

from agents.training.backends.distributed import DataParallelBackend, init_process_group
from agents.training.rank_exit import run_main
from agents.training.run_reach import check_shared_output


class _Ranks:
    """The rank, world size and collectives a data-parallel backend gives :func:`check_shared_output`,
    over the launcher's gloo group (as :class:`DataParallelBackend` runs them), with no model."""

    def __init__(self) -> None:
        import torch.distributed as dist

        init_process_group(False)
        self._dist = dist
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    broadcast_object = DataParallelBackend.broadcast_object
    all_gather_object = DataParallelBackend.all_gather_object
    barrier = DataParallelBackend.barrier

    @property
    def _world(self) -> int:  # what DataParallelBackend's all_gather_object sizes its list by
        return self.world_size


def main() -> int:
    folder, mode, reports = sys.argv[1], sys.argv[2], sys.argv[3]
    ranks = _Ranks()
    if mode == "apart":
        folder += str(ranks.rank)
    os.makedirs(folder, exist_ok=True)
    try:
        check_shared_output(folder, ranks)
        outcome = "ok"
    except ValueError as exc:
        outcome = f"error: {exc}"
    os.makedirs(reports, exist_ok=True)
    with open(os.path.join(reports, f"rank{ranks.rank}.txt"), "w", encoding="utf-8") as report:
        report.write(outcome)
    return 0


if __name__ == "__main__":
    run_main(main)
