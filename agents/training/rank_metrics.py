"""A training step's metrics over every data-parallel rank, as the trainer logs them from rank 0."""
from __future__ import annotations

from typing import Mapping

import torch

from agents.training.backends import TrainingBackend

__all__ = ["all_rank_metrics"]

#: Figures every rank holds alike: the optimiser's (gradient norm, updates, learning rate) and the rounds.
SAME_ON_EVERY_RANK = frozenset({"lr", "grad_norm", "updates/applied", "updates/skipped", "rollout_rounds"})
#: Counts that add up over ranks besides the update's statistics: the step's episodes are every rank's.
SUMMED = frozenset({"rows", "tokens_per_s", "episodes"})


def all_rank_metrics(backend: TrainingBackend, metrics: Mapping[str, float], update_keys: set[str]) -> dict[str, float]:
    """This rank's step ``metrics`` (with ``update_keys``, the names of the update's statistics) made the
    whole run's; a collective every rank enters.

    Every rank's numeric names count, not only this rank's: a rank that held no rows after dynamic sampling
    has no loss of its own, and the others' must still be logged. The update's statistics are additive
    shares of the global batch's and are summed, as are the counts (rows, episodes, tokens/s), a rank without the
    name adding nothing; figures alike on every rank (:data:`SAME_ON_EVERY_RANK`) keep this rank's value
    where it has one; the rest are means over the ranks that have them, exact for the episode means (every
    rank plays as many episodes)."""
    numeric = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)))
    gathered = backend.all_gather_object((numeric, sorted(update_keys)))
    keys = sorted({key for names, _ in gathered for key in names})
    summed = ({key for _, names in gathered for key in names} - SAME_ON_EVERY_RANK) | SUMMED
    shares = torch.tensor([[float(metrics.get(key, 0.0)), float(key in metrics)] for key in keys], dtype=torch.float64)
    total = backend.all_reduce_sum(shares.reshape(-1)).reshape(-1, 2)
    out = dict(metrics)
    for key, (value, ranks) in zip(keys, total.tolist()):
        if key in SAME_ON_EVERY_RANK:
            out.setdefault(key, value / ranks)
        else:
            out[key] = value if key in summed else value / ranks
    return out
