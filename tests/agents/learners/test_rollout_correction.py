"""The rollout-engine correction (truncated importance sampling and the sequence mask) against values
worked out by hand, and through an algorithm's loss."""
from __future__ import annotations

import math

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch")
import torch  # noqa: E402

from agents.learners import GRPO, GRPOConfig  # noqa: E402
from agents.learners.core import BatchCounts, rollout_correction  # noqa: E402
from tests.agents.learners.test_algorithms import Out, make_batch  # noqa: E402

F64 = torch.float64


def test_truncated_importance_weights_by_hand():
    # log(old / engine) per token: 0.5, -1.0, 0.2, and a masked position whose junk must not leak.
    old = torch.tensor([[-1.0, -2.0, -0.3, 5.0]], dtype=F64)
    engine = torch.tensor([[-1.5, -1.0, -0.5, float("nan")]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=F64)
    fix = rollout_correction(old, engine, mask, tis_cap=1.5)
    # exp(0.5) = 1.6487 -> capped at 1.5; exp(-1) = 0.36788; exp(0.2) = 1.22140; masked -> 0
    assert fix.weights.tolist()[0] == pytest.approx([1.5, math.exp(-1.0), math.exp(0.2), 0.0])
    assert fix.capped.tolist() == [[True, False, False, False]]
    assert fix.masked_rows.tolist() == [False]
    assert not fix.weights.requires_grad


def test_sequence_mask_by_hand():
    # row 0: log-ratios 0.05, -0.05 -> geometric mean exp(0) = 1, kept (weights 1: TIS off)
    # row 1: log-ratios 0.2, 0.2, 0.2 -> exp(0.2) = 1.2214 > 1 + 0.1, dropped
    # row 2: log-ratios -0.05, -0.15 -> exp(-0.1) = 0.9048 >= 1 - 0.1, kept
    # row 3: no trained token: never dropped, weights 0 (nothing to weight)
    old = torch.tensor([[0.05, -0.05, 0.0], [0.2, 0.2, 0.2], [-0.05, -0.15, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    engine = torch.zeros_like(old)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0], [0, 0, 0]], dtype=F64)
    fix = rollout_correction(old, engine, mask, seq_mask_delta=0.1)
    assert fix.masked_rows.tolist() == [False, True, False, False]
    assert fix.weights.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]


def test_both_corrections_together_and_off():
    old = torch.tensor([[0.3, -0.3], [1.0, 1.0]], dtype=F64)
    engine = torch.zeros_like(old)
    mask = torch.ones_like(old)
    fix = rollout_correction(old, engine, mask, tis_cap=1.2, seq_mask_delta=0.5)
    # row 0: geometric mean 1, kept; weights min(exp(0.3), 1.2) = 1.2, exp(-0.3) = 0.7408
    # row 1: geometric mean e = 2.718 > 1.5, dropped
    assert fix.weights.tolist()[0] == pytest.approx([1.2, math.exp(-0.3)])
    assert fix.weights.tolist()[1] == [0.0, 0.0]
    off = rollout_correction(old, engine, mask, tis_cap=None, seq_mask_delta=0)
    assert off.weights.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_grpo_loss_weights_each_token_by_the_truncated_ratio():
    # Two rows "PAAA" of one group (scores 1 and 0; GRPO gives their advantages, KL off);
    # the policy equals the trainer's old log-probs (ratio 1, no clipping), so the token loss is -A and
    # the corrected loss is -A * w_t with w = min(exp(old - engine), cap).
    batch = make_batch(["PAAA", "PAAA"], [1.0, 0.0], [0, 0])
    batch.old_logprobs = torch.tensor([[0.0, -1.0, -1.0, -1.0], [0.0, -1.0, -1.0, -1.0]], dtype=F64)
    batch.rollout_logprobs = torch.tensor([[0.0, -1.0, -2.0, -0.5], [0.0, -1.0, -1.0, -1.0]], dtype=F64)
    plain = GRPO(GRPOConfig(group_size=2, kl_coef=0.0, entropy_coef=0.0))
    fixed = GRPO(GRPOConfig(group_size=2, kl_coef=0.0, entropy_coef=0.0, tis_cap=2.0))
    plain.compute_advantages(batch)
    adv = batch.advantages[:, 1:].clone()
    out = Out(batch.old_logprobs.clone())
    counts = BatchCounts.from_mask(batch.trained_mask, 4)
    loss_plain, _ = plain.loss(batch, out, counts)
    loss_fixed, stats = fixed.loss(batch, out, counts)
    weights = torch.tensor([[1.0, min(math.exp(1.0), 2.0), math.exp(-0.5)], [1.0, 1.0, 1.0]], dtype=F64)
    assert float(loss_plain) == pytest.approx(float((-adv).sum() / 6))
    assert float(loss_fixed) == pytest.approx(float((-adv * weights).sum() / 6))
    assert stats["rollout_correction/weight"] == pytest.approx(float(weights.sum() / 6))
    assert stats["rollout_correction/capped_frac"] == pytest.approx(1 / 6)


def test_no_engine_logprobs_means_no_correction():
    batch = make_batch(["PAA", "PAA"], [1.0, 0.0], [0, 0])
    batch.old_logprobs = torch.full((2, 3), -1.0, dtype=F64)
    algo = GRPO(GRPOConfig(group_size=2, kl_coef=0.0, entropy_coef=0.0, tis_cap=2.0, seq_mask_delta=0.01))
    algo.compute_advantages(batch)
    counts = BatchCounts.from_mask(batch.trained_mask, 4)
    loss, stats = algo.loss(batch, Out(batch.old_logprobs.clone()), counts)
    reference, _ = GRPO(GRPOConfig(group_size=2, kl_coef=0.0, entropy_coef=0.0)).loss(batch, Out(batch.old_logprobs.clone()), counts)
    assert float(loss) == float(reference)
    assert not any(key.startswith("rollout_correction/") for key in stats)


@pytest.mark.parametrize("field", ["tis_cap", "seq_mask_delta"])
@pytest.mark.parametrize("value", [-1.0, float("inf"), float("nan")])
def test_bad_correction_settings_are_one_line_errors(field, value):
    with pytest.raises(ValueError, match=field):
        GRPOConfig(**{field: value})
