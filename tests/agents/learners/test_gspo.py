"""GSPO against hand-worked values: one importance ratio per sequence (the geometric mean of its trained
tokens' ratios), clipped per sequence with the paper's small range; its gradient equals the sequence-level
objective's; GRPO's advantages; config errors, micro-batch invariance and a two-step run of the tiny model."""
from __future__ import annotations

import math

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch")
import torch  # noqa: E402

from agents.learners import GRPO, GSPO, GSPOConfig, lookup_algorithm, lookup_policy_loss  # noqa: E402
from agents.learners.gspo import gspo_policy_loss  # noqa: E402
from tests.agents.learners.test_algorithms import F64, Out, _grad, _random_batch, make_batch  # noqa: E402


def test_gspo_loss_by_hand():
    # both rows "PAAE": trained t=1, 2; old probs 0.5, 0.5; new 0.5, 0.4 -> token ratios 1 and 0.8, sequence
    # ratio s = exp((0 + log 0.8) / 2) = sqrt(0.8) = 0.894427 (below the range [1 - 3e-4, 1 + 4e-4]).
    # row 0, A = +1: max(-s, -(1 - 3e-4)) = -0.894427 (not clipped: only a ratio above the range is for A > 0)
    # row 1, A = -1: max(s, 0.9997) = 0.9997 (clipped: no gradient)
    # seq-mean-token-mean: (-0.894427 + 0.9997) / 2 = 0.0526365
    # gradient wrt row 0's new log-probs: -A x s / (2 tokens) / (2 rows) = -0.2236068 on each trained token
    batch = make_batch(["PAAE", "PAAE"], [1.0, 0.0], [0, 0])
    batch.old_logprobs = torch.log(torch.tensor([[1.0, 0.5, 0.5, 1.0]] * 2, dtype=F64))
    batch.advantages = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, -1.0, -1.0, 0.0]], dtype=F64)
    new = torch.log(torch.tensor([[1.0, 0.5, 0.4, 0.3]] * 2, dtype=F64)).requires_grad_()
    new_junk = torch.where(batch.trained_mask.bool(), new, torch.full_like(new, float("nan")))  # junk off the mask
    algo = GSPO(GSPOConfig())
    loss, stats = algo.loss(batch, Out(new_junk), algo.counts(batch))
    assert loss.item() == pytest.approx((-math.sqrt(0.8) + 0.9997) / 2, abs=1e-9)
    loss.backward()
    s = math.sqrt(0.8)
    torch.testing.assert_close(new.grad, torch.tensor([[0, -s / 4, -s / 4, 0], [0, 0, 0, 0]], dtype=F64))
    assert stats["policy/clip_frac"] == pytest.approx(0.5)
    assert stats["policy/ratio"] == pytest.approx(s)


def test_gspo_gradient_is_the_sequence_level_objective_s():
    # -1/G sum_i min(s_i A_i, clip(s_i) A_i), s_i = exp(mean of row i's trained log-ratios), by autograd
    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 0, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    old = torch.randn(3, 5, generator=gen, dtype=F64) - 2
    new = (old + 0.001 * torch.randn(3, 5, generator=gen, dtype=F64)).requires_grad_()
    adv_row = torch.tensor([1.5, -0.5, -1.0], dtype=F64)
    config = GSPOConfig()
    terms = gspo_policy_loss(new, old, adv_row[:, None].expand(3, 5), mask, config)
    per_row = torch.where(mask, terms.loss, torch.zeros((), dtype=F64)).sum(1) / mask.sum(1)
    (per_row.mean()).backward()
    token_grad = new.grad.clone()
    new.grad = None
    s = torch.exp(torch.where(mask, new - old, torch.zeros((), dtype=F64)).sum(1) / mask.sum(1))
    objective = torch.minimum(s * adv_row, s.clamp(1 - config.clip_low, 1 + config.clip_high) * adv_row)
    (-objective.mean()).backward()
    torch.testing.assert_close(token_grad, new.grad)
    torch.testing.assert_close(per_row.detach(), -objective.detach())
    assert terms.clipped.any() and not terms.clipped.all()  # both sides of the clip are exercised


def test_gspo_is_grpo_with_the_sequence_loss():
    assert lookup_algorithm("gspo") is GSPO and issubclass(GSPO, GRPO)
    assert lookup_policy_loss("gspo") is gspo_policy_loss and GSPO.policy_loss_name == "gspo"
    config = GSPOConfig()
    assert (config.clip_low, config.clip_high, config.loss_agg_mode) == (3e-4, 4e-4, "seq-mean-token-mean")
    # GRPO's group-normalised advantages: scores 1, 0 -> +/- 0.707107
    batch = make_batch(["PAA", "PA"], [1.0, 0.0], [0, 0])
    GSPO(GSPOConfig()).compute_advantages(batch)
    torch.testing.assert_close(batch.advantages, torch.tensor([[0, 0.707107, 0.707107], [0, -0.707107, 0]], dtype=F64),
                               atol=1e-5, rtol=0)


def test_gspo_bad_settings():
    with pytest.raises(ValueError, match=r"^GSPO clips the sequence ratio; dual_clip is a token-level PPO option: leave it None$"):
        GSPOConfig(dual_clip=3.0)
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        GSPOConfig(group_size=1)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
def test_gspo_micro_batch_gradients_add_up_to_the_full_batch_gradient(mode):
    batch, policy = _random_batch(seed=5)
    algo = GSPO(GSPOConfig(loss_agg_mode=mode, clip_low=0.05, clip_high=0.05, kl_coef=0.05, entropy_coef=0.01), max_new_tokens=40)
    counts = algo.counts(batch)
    full, stats = _grad(policy, algo, [batch], lambda _: counts)
    assert 0 < stats["policy/clip_frac"] < 1
    split, _ = _grad(policy, algo, batch.micro_batches(2), lambda _: counts)
    torch.testing.assert_close(split, full, rtol=1e-9, atol=1e-12)


def test_gspo_trains_the_tiny_model(tmp_path):
    skip_without("transformers", "yaml")
    from tests.agents.training.tiny import records, run, small_config

    trainer, result = run(small_config("gspo", tmp_path, {"eval.questions": 0}))
    assert result.step == 2
    steps = [r for r in records(result.metrics_path) if "stage" not in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["grad_norm"] > 0 for r in steps)
