"""Advantage estimators against hand-worked values and independent formulas: GAE and REINFORCE++
returns across environment spans, whitening over trained tokens, GRPO groups (singleton, all-equal),
DAPO's group filter and overlong penalty, reward placement."""
import pytest

from tests.conftest import skip_without

skip_without("agents", "torch")
import torch  # noqa: E402

from agents.learners.advantages import (  # noqa: E402
    filter_groups, gae, group_normalized_scores, grpo_advantages, overlong_penalty, place_on_last_token,
    reinforce_pp_returns, whiten,
)

NAN = float("nan")

# One row: prompt, prompt, agent a1, agent a2, env, env, agent a3, pad.
MASK = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 0]], dtype=torch.float32)
# values at untrained positions are junk (and NaN on the pad): they must not matter
VALUES = torch.tensor([[0.0, 9.0, 0.5, 0.6, 7.0, 7.0, 0.8, NAN]])
# the score 1.0 on the last trained token; a stray reward on an env token must be ignored
REWARDS = torch.tensor([[0.0, 0.0, 0.0, 0.0, 5.0, 0.0, 1.0, 0.0]])


# ---------------------------------------------------------------- GAE

def test_gae_carries_value_and_advantage_through_environment_spans():
    # gamma 0.9, lam 0.8; trained steps a1 (t=2), a2 (t=3), a3 (t=6); the next step of a2 is a3.
    # a3: delta = 1 + 0 - 0.8 = 0.2                      A3 = 0.2
    # a2: delta = 0 + 0.9 * 0.8 - 0.6 = 0.12             A2 = 0.12 + 0.9 * 0.8 * 0.2 = 0.264
    # a1: delta = 0 + 0.9 * 0.6 - 0.5 = 0.04             A1 = 0.04 + 0.72 * 0.264 = 0.23008
    # returns = A + V: 0.73008, 0.864, 1.0
    adv, ret = gae(REWARDS, VALUES, MASK, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, torch.tensor([[0, 0, 0.23008, 0.264, 0, 0, 0.2, 0]]))
    torch.testing.assert_close(ret, torch.tensor([[0, 0, 0.73008, 0.864, 0, 0, 1.0, 0]]))


def test_gae_with_gamma_lambda_one_is_return_minus_value():
    # Search-R1's gamma = lam = 1: A_t = R - V_t = 1 - V_t, and every return is the score
    adv, ret = gae(REWARDS, VALUES, MASK, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0, 0, 0.5, 0.4, 0, 0, 0.2, 0]]))
    torch.testing.assert_close(ret, torch.tensor([[0, 0, 1.0, 1.0, 0, 0, 1.0, 0]]))


def _textbook_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """GAE over a plain list of consecutive steps, terminal after the last (written independently)."""
    out, running = [0.0] * len(rewards), 0.0
    for i in reversed(range(len(rewards))):
        next_v = values[i + 1] if i + 1 < len(values) else 0.0
        running = rewards[i] + gamma * next_v - values[i] + gamma * lam * running
        out[i] = running
    return out


def test_gae_equals_textbook_gae_on_the_trained_tokens_alone():
    gen = torch.Generator().manual_seed(3)
    B, T = 5, 23
    mask = (torch.rand(B, T, generator=gen) > 0.45).float()
    mask[:, :3] = 0  # a prompt
    rewards, values = torch.randn(B, T, generator=gen, dtype=torch.float64), torch.randn(B, T, generator=gen, dtype=torch.float64)
    adv, _ = gae(rewards, values, mask, gamma=0.95, lam=0.7)
    for b in range(B):
        idx = torch.nonzero(mask[b]).squeeze(1).tolist()
        expected = _textbook_gae([rewards[b, i].item() for i in idx], [values[b, i].item() for i in idx], 0.95, 0.7)
        assert adv[b, idx].tolist() == pytest.approx(expected)
        assert (adv[b][mask[b] == 0] == 0).all()


# ---------------------------------------------------------------- REINFORCE++ returns, whitening

def test_reinforce_pp_return_is_carried_across_environment_spans():
    # token rewards: -KL penalties -0.1 (a1), -0.2 (a2), -0.05 (a3) plus the score 1.0 on a3; gamma 0.5
    # G3 = 1 - 0.05 = 0.95; G2 = -0.2 + 0.5 * 0.95 = 0.275; G1 = -0.1 + 0.5 * 0.275 = 0.0375
    # (resetting at the env span would give G2 = -0.2, G1 = -0.2)
    rewards = torch.tensor([[0.0, 0.0, -0.1, -0.2, 3.0, 0.0, 0.95, 0.0]])
    ret = reinforce_pp_returns(rewards, MASK, gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[0, 0, 0.0375, 0.275, 0, 0, 0.95, 0]]))


def test_whiten_over_trained_tokens_only():
    # trained values 1, 2, 3, 5: mean 2.75, population var (3.0625 + 0.5625 + 0.0625 + 5.0625) / 4 = 2.1875,
    # std 1.4790199 -> -1.183216, -0.507093, 0.169031, 1.521278
    x = torch.tensor([[1.0, 2.0, 1e9, 3.0], [5.0, NAN, -7.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0]])
    torch.testing.assert_close(
        whiten(x, mask), torch.tensor([[-1.183216, -0.507093, 0.0, 0.169031], [1.521278, 0.0, 0.0, 0.0]]), atol=1e-5, rtol=0
    )


# ---------------------------------------------------------------- GRPO groups

# group ids are arbitrary integers, rows of a group are not adjacent
GROUPS = torch.tensor([7, 3, 7, 5, 9, 7, 3, 9])
SCORES = torch.tensor([1.0, 1.0, 0.0, 0.7, 0.2, 0.0, 1.0, 0.6])
# group 7 (rows 0, 2, 5): 1, 0, 0 -> mean 1/3, sample std sqrt((4/9 + 1/9 + 1/9) / 2) = 0.577350
#   -> (2/3) / 0.57735 = 1.154701 and -(1/3) / 0.57735 = -0.577350
# group 3 (rows 1, 6): all equal -> 0;  group 5 (row 3): singleton -> 0
# group 9 (rows 4, 7): 0.2, 0.6 -> mean 0.4, std sqrt(0.08 / 1) = 0.282843 -> -/+ 0.707107


def test_grpo_group_normalised_scores():
    out = group_normalized_scores(SCORES, GROUPS, scale=True)
    torch.testing.assert_close(out, torch.tensor([1.154701, 0, -0.577350, 0, -0.707107, -0.577350, 0, 0.707107]), atol=1e-5, rtol=0)


def test_grpo_without_std_is_centred_score():
    out = group_normalized_scores(SCORES, GROUPS, scale=False)
    torch.testing.assert_close(out, torch.tensor([2 / 3, 0, -1 / 3, 0, -0.2, -1 / 3, 0, 0.2]))


def test_grpo_all_equal_groups_are_exactly_zero():
    # 3 x 0.4900934 in float32: sum / 3 != 0.4900934, so a naive (s - mean) / (std + eps) turns the
    # rounding residue into an advantage of order residue / 1e-6
    scores = torch.tensor([0.4900934100151062] * 3 + [0.3, 0.3, 0.7, 0.7])
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    naive_mean = torch.zeros(1).index_add_(0, torch.zeros(3, dtype=torch.long), scores[:3]) / 3
    assert (scores[:3] != naive_mean).all()  # the case really has residue
    assert (group_normalized_scores(scores, groups) == 0).all()


def test_grpo_advantage_is_broadcast_over_trained_tokens():
    mask = torch.tensor([[0, 1, 1, 0, 1], [1, 1, 0, 0, 0], [0, 0, 1, 1, 1]])
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 0]), mask, scale=False)
    # mean 0.5 -> row advantages 0.5, -0.5, 0
    torch.testing.assert_close(adv, torch.tensor([[0, 0.5, 0.5, 0, 0.5], [-0.5, -0.5, 0, 0, 0], [0.0, 0, 0, 0, 0]]))


def test_filter_groups_drops_all_equal_and_singleton_groups():
    assert filter_groups(SCORES, GROUPS).tolist() == [True, False, True, False, True, True, False, True]


def test_overlong_penalty():
    # budget 100, buffer 20: free up to 80 tokens, -0.5 at 90, -1 at 100 and beyond
    lengths = torch.tensor([50, 80, 90, 100, 120])
    torch.testing.assert_close(overlong_penalty(lengths, 100, 20), torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    torch.testing.assert_close(overlong_penalty(lengths, 100, 20, factor=0.5), torch.tensor([0.0, 0.0, -0.25, -0.5, -0.5]))
    with pytest.raises(ValueError, match="overlong buffer"):
        overlong_penalty(lengths, 100, 0)


def test_place_on_last_token():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    out = place_on_last_token(torch.tensor([2.0, -1.0, 5.0]), mask)
    torch.testing.assert_close(out, torch.tensor([[0, 0, 0, 0, 2.0, 0], [0, -1.0, 0, 0, 0, 0], [0.0, 0, 0, 0, 0, 0]]))
