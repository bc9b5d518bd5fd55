"""RLOO against hand-worked values: the leave-one-out advantage (and its k / (k - 1) relation to the group-
centred score), the KL in the reward, the loss, config errors, micro-batch invariance of its gradient, and a
two-step run of the tiny model."""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch")
import torch  # noqa: E402

from agents.learners import RLOO, RLOOConfig, lookup_advantage, lookup_algorithm  # noqa: E402
from agents.learners.advantages import group_normalized_scores  # noqa: E402
from agents.learners.rloo import leave_one_out_scores  # noqa: E402
from tests.agents.learners.test_algorithms import F64, NAN, Out, _grad, _random_batch, make_batch, with_log_ratio  # noqa: E402


def test_leave_one_out_scores_by_hand():
    # group 0 (k = 4): scores 1, 0, 0, 1, sum 2 -> 1 - 1/3 = 2/3, 0 - 2/3, 0 - 2/3, 1 - 1/3
    # group 1 (k = 2): 0.5 - 0.2 = 0.3 and 0.2 - 0.5 = -0.3; group 2, a singleton: 0
    scores = torch.tensor([1.0, 0.5, 0.0, 0.0, 0.2, 1.0, 0.7], dtype=F64)
    groups = torch.tensor([0, 1, 0, 0, 1, 0, 2])
    expected = torch.tensor([2 / 3, 0.3, -2 / 3, -2 / 3, -0.3, 2 / 3, 0.0], dtype=F64)
    torch.testing.assert_close(leave_one_out_scores(scores, groups), expected)
    # no extra k / (k - 1) factor: the leave-one-out advantage *is* k / (k - 1) x the group-centred score
    centred = group_normalized_scores(scores, groups, scale=False)
    torch.testing.assert_close(leave_one_out_scores(scores, groups)[[0, 2, 3, 5]], centred[[0, 2, 3, 5]] * 4 / 3)
    torch.testing.assert_close(leave_one_out_scores(scores, groups)[[1, 4]], centred[[1, 4]] * 2)


def test_rloo_puts_the_advantage_on_trained_tokens_only():
    # group 0: 1 and 0 -> +1 and -1 (k = 2); group 1: 0.4, 0.4, 0.1 -> 0.4 - 0.25 = 0.15, 0.15, 0.1 - 0.4 = -0.3
    batch = make_batch(["PAAE", "PAEA", "PPA", "PAU", "PAA"], [1.0, 0.0, 0.4, 0.4, 0.1], [0, 0, 1, 1, 1])
    algo = RLOO(RLOOConfig(kl_coef=0.0, group_size=2))
    assert not algo.uses_reference and not algo.uses_critic
    stats = algo.compute_advantages(batch)
    torch.testing.assert_close(batch.advantages, torch.tensor([
        [0, 1, 1, 0], [0, -1, 0, -1], [0, 0, 0.15, 0], [0, 0.15, 0, 0], [0, -0.3, -0.3, 0]], dtype=F64))
    assert stats["groups/informative_frac"] == 1.0
    assert lookup_advantage("rloo") is not None


def test_rloo_kl_in_the_reward_lowers_the_score_by_the_summed_kl():
    # k1 x 0.1: row 0 loses 0.1 x (1 + 2) = 0.3 -> 0.7; row 1 loses 0 -> 0.0; leave-one-out: +0.7, -0.7
    batch = make_batch(["PAA", "PAA"], [1.0, 0.0], [0, 0])
    with_log_ratio(batch, [[NAN, 1.0, 2.0], [NAN, 0.0, 0.0]])
    algo = RLOO(RLOOConfig(kl_coef=0.1, group_size=2))  # TRL's way (the default): k1 in the reward
    assert algo.uses_reference
    stats = algo.compute_advantages(batch)
    torch.testing.assert_close(batch.advantages, torch.tensor([[0, 0.7, 0.7], [0, -0.7, -0.7]], dtype=F64))
    assert stats["kl_reward"] == pytest.approx((1.0 + 2.0 + 0.0 + 0.0) / 4)


def test_rloo_loss_is_the_clipped_surrogate():
    # ratios 1 and 0.8 (inside [0.8, 1.2]); A = +1, -1: -1 x 1 and +0.8 -> token-mean (-1 + 0.8) / 2 = -0.1
    batch = make_batch(["PAA"], [1.0], [0])
    batch.old_logprobs = torch.log(torch.tensor([[1.0, 0.5, 0.5]], dtype=F64))
    batch.advantages = torch.tensor([[0.0, 1.0, -1.0]], dtype=F64)
    algo = RLOO(RLOOConfig(kl_coef=0.0))
    loss, stats = algo.loss(batch, Out(torch.log(torch.tensor([[1.0, 0.5, 0.4]], dtype=F64))), algo.counts(batch))
    assert loss.item() == pytest.approx(-0.1)
    assert stats["policy/ratio"] == pytest.approx(0.9)


@pytest.mark.parametrize("make, message", [
    (lambda: RLOOConfig(group_size=1), r"^RLOO's leave-one-out baseline needs another sample: group_size must be >= 2, got 1$"),
    (lambda: RLOO(RLOOConfig(), max_new_tokens=0), "max_new_tokens must be >= 1"),
])
def test_rloo_bad_settings(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_rloo_is_registered_with_its_config():
    assert lookup_algorithm("rloo") is RLOO and RLOO.config_class is RLOOConfig
    assert RLOOConfig().group_size >= 2 and RLOOConfig().kl_in_reward


def test_rloo_micro_batch_gradients_add_up_to_the_full_batch_gradient():
    batch, policy = _random_batch(seed=3)
    algo = RLOO(RLOOConfig(kl_coef=0.05, kl_in_reward=False, loss_agg_mode="seq-mean-token-mean"), max_new_tokens=40)
    algo.compute_advantages(batch)
    counts = algo.counts(batch)
    full, _ = _grad(policy, algo, [batch], lambda _: counts)
    split, _ = _grad(policy, algo, batch.micro_batches(2), lambda _: counts)
    torch.testing.assert_close(split, full, rtol=1e-9, atol=1e-12)
    assert full.abs().sum() > 0


def test_rloo_trains_the_tiny_model(tmp_path):
    skip_without("transformers", "yaml")
    from tests.agents.training.tiny import records, run, small_config

    trainer, result = run(small_config("rloo", tmp_path, {"eval.questions": 0}))
    assert result.step == 2
    steps = [r for r in records(result.metrics_path) if "stage" not in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["grad_norm"] > 0 for r in steps)
