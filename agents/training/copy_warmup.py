"""Copy warm-up: teach a model trained from scratch to copy before it clones demonstrations.

A search agent answers by copying: the question's entity into its query, a name from a result into its
query or answer. A small transformer can copy only once its attention has formed copying ("induction")
heads, and on the demonstrations alone whether that happens in the warm start's budget depends on the
seed. A few hundred steps on strings of random tokens that repeat, with the loss on the repeats only
(nothing there can be predicted but by copying), form those heads first. What was measured with and
without it is in ``benchmarks/RESULTS.md``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch import nn

if TYPE_CHECKING:
    from agents.training.backends import TrainingBackend

__all__ = ["copy_batch", "copy_warmup"]


def copy_batch(token_pool: torch.Tensor, batch_size: int, length: int, repeats: int,
               generator: torch.Generator) -> torch.Tensor:
    """``batch_size`` rows, each a string of ``length`` ids drawn uniformly from ``token_pool`` and written
    ``repeats`` times in a row."""
    picks = torch.randint(len(token_pool), (batch_size, length), generator=generator)
    return token_pool[picks].repeat(1, repeats)


def copy_warmup(
    backend: TrainingBackend,
    token_pool: Sequence[int],
    steps: int,
    *,
    lr: float,
    seed: int,
    length: int = 16,
    repeats: int = 3,
    batch_size: int = 32,
) -> list[float]:
    """Train the backend's policy (a causal LM returning ``.logits``) for ``steps`` steps of the backend
    (:meth:`~agents.training.backends.base.TrainingBackend.supervised`: AdamW's defaults at a constant ``lr``) to
    continue :func:`copy_batch` strings: the loss is the mean cross-entropy of every token after the first
    ``length`` (the repeats). Returns each step's loss.

    ``token_pool`` holds the ids to draw from; the tokens the model will later copy (names, numbers) are
    the ones worth drawing, e.g. the ids of the demonstrations.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if length < 1 or repeats < 2:
        raise ValueError(f"a copy string needs length >= 1 and repeats >= 2, got {length} and {repeats}")
    pool = torch.as_tensor(sorted(set(token_pool)), dtype=torch.long)
    if len(pool) < 2:
        raise ValueError("token_pool must hold at least two distinct ids")
    model = backend.policy.model
    device = backend.device
    generator = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.train()
    losses = []
    try:
        with backend.supervised(lr):
            for _ in range(steps):
                ids = copy_batch(pool, batch_size, length, repeats, generator).to(device)
                logits = model(input_ids=ids).logits[:, length - 1 : -1]  # the predictions of the repeats
                loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, length:].reshape(-1))
                backend.backward(loss)
                backend.step()
                losses.append(loss.item())
    finally:
        model.train(was_training)
    return losses
