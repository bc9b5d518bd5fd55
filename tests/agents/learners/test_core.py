"""The shared loss core against hand-worked values: KL estimators, aggregation modes, the clipped
surrogate (low/high/dual clip), the clipped value loss, entropy; masked positions never give NaN."""
import math

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch")
import torch  # noqa: E402

from agents.learners.core import (  # noqa: E402
    BatchCounts, aggregate, entropy_from_logits, kl_estimate, masked_mean, policy_loss, token_share, value_loss,
)

NAN, INF = float("nan"), float("inf")


# ---------------------------------------------------------------- KL estimators

def test_kl_estimators_by_hand():
    # token 0: p = 0.5, p_ref = 0.25 -> log r = log(0.25/0.5) = -0.693147
    #   k1 = -log r = 0.693147; k2 = 0.5 * 0.693147^2 = 0.240227; k3 = r - 1 - log r = 0.5 - 1 + 0.693147 = 0.193147
    # token 1: p = 0.2, p_ref = 0.6 -> r = 3, log r = 1.098612
    #   k1 = -1.098612; k2 = 0.5 * 1.206949 = 0.603474; k3 = 3 - 1 - 1.098612 = 0.901388
    # token 2: p = p_ref -> all 0
    logp = torch.log(torch.tensor([0.5, 0.2, 0.3]))
    ref = torch.log(torch.tensor([0.25, 0.6, 0.3]))
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), torch.tensor([0.693147, -1.098612, 0.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(kl_estimate(logp, ref, "k2"), torch.tensor([0.240227, 0.603474, 0.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"), torch.tensor([0.193147, 0.901388, 0.0]), atol=1e-5, rtol=0)


def test_clamped_kl_estimates_by_hand():
    # logp = 0, so log r = ref_logp: 5, -12, 0.5, -3 and 25 (the log-ratio guard makes that 20).
    # k3 = e^{log r} - 1 - log r:  5 -> e^5 - 6 = 142.413159 (clamped 10); -12 -> e^-12 + 11 = 11.000006 (10);
    #      0.5 -> e^0.5 - 1.5 = 0.148721; -3 -> e^-3 + 2 = 2.049787; 20 -> e^20 - 21 = 4.85165174e8 (10)
    # k1 = -log r: -5; 12 (clamped 10); -0.5; 3; -20 (clamped -10)
    # k2 = (log r)^2 / 2: 12.5 (10); 72 (10); 0.125; 4.5; 200 (10)
    logp = torch.zeros(5, dtype=torch.float64)
    ref = torch.tensor([5.0, -12.0, 0.5, -3.0, 25.0], dtype=torch.float64)
    k3 = kl_estimate(logp, ref, "k3")
    torch.testing.assert_close(k3[:4], torch.tensor([142.413159, 11.000006, 0.148721, 2.049787], dtype=torch.float64), atol=1e-6, rtol=0)
    assert k3[4].item() == pytest.approx(4.85165174e8, rel=1e-8)
    expected = {
        "k3": [10.0, 10.0, 0.148721, 2.049787, 10.0],
        "k1": [-5.0, 10.0, -0.5, 3.0, -10.0],
        "k2": [10.0, 10.0, 0.125, 4.5, 10.0],
    }
    for kind, values in expected.items():
        torch.testing.assert_close(kl_estimate(logp, ref, kind, clamp=10), torch.tensor(values, dtype=torch.float64),
                                   atol=1e-6, rtol=0, msg=kind)
    # A clamp wider than every estimate changes nothing.
    torch.testing.assert_close(kl_estimate(logp[2:4], ref[2:4], "k3", clamp=10), kl_estimate(logp[2:4], ref[2:4], "k3"))


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_unbiased_estimators_average_to_the_exact_kl(kind):
    # E_{x~p}[k1(x)] = E_{x~p}[k3(x)] = KL(p || q): check against torch.distributions' closed form.
    gen = torch.Generator().manual_seed(0)
    p_logits, q_logits = torch.randn(6, generator=gen, dtype=torch.float64), torch.randn(6, generator=gen, dtype=torch.float64)
    p, q = torch.distributions.Categorical(logits=p_logits), torch.distributions.Categorical(logits=q_logits)
    expected = torch.distributions.kl_divergence(p, q)
    estimate = (p.probs * kl_estimate(p.logits, q.logits, kind)).sum()
    torch.testing.assert_close(estimate, expected)


def test_k3_stays_finite_for_extreme_log_ratios_and_rejects_unknown_kinds():
    out = kl_estimate(torch.tensor([-1000.0, 0.0]), torch.tensor([0.0, -1000.0]), "k3")
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="unknown kl_estimator 'k4'; known: k1, k2, k3"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")


# ---------------------------------------------------------------- aggregation

def _agg_case():
    loss = torch.tensor([
        [1.0, 2.0, 3.0, 4.0],   # trained: 2, 3 -> sum 5, 2 tokens
        [5.0, 6.0, 7.0, 8.0],   # all trained -> sum 26, 4 tokens
        [NAN, INF, 9.0, 9.0],   # nothing trained (garbage must not leak in)
    ])
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)
    return loss, mask


def test_batch_counts_from_mask():
    _, mask = _agg_case()
    assert BatchCounts.from_mask(mask, 10) == BatchCounts(tokens=6.0, sequences=2.0, norm_length=10.0)
    with pytest.raises(ValueError, match="norm_length"):
        BatchCounts.from_mask(mask, 0)


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", 31 / 6),                      # (5 + 26) / 6 tokens
    ("seq-mean-token-mean", (5 / 2 + 26 / 4) / 2),  # (2.5 + 6.5) / 2 sequences = 4.5
    ("seq-mean-token-sum", (5 + 26) / 2),        # 15.5
    ("seq-mean-token-sum-norm", 31 / (2 * 10)),  # Dr. GRPO: / (2 sequences x 10) = 1.55
])
def test_aggregation_modes_by_hand(mode, expected):
    loss, mask = _agg_case()
    counts = BatchCounts(tokens=6, sequences=2, norm_length=10)
    assert aggregate(loss, mask, mode, counts).item() == pytest.approx(expected)


def test_aggregation_uses_the_given_global_counts_not_the_local_ones():
    # the same micro-batch as part of a bigger batch (12 tokens, 4 sequences) weighs half as much
    loss, mask = _agg_case()
    counts = BatchCounts(tokens=12, sequences=4, norm_length=10)
    assert aggregate(loss, mask, "token-mean", counts).item() == pytest.approx(31 / 12)
    assert aggregate(loss, mask, "seq-mean-token-mean", counts).item() == pytest.approx(9 / 4)
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'mean'; known: token-mean, seq-mean-token-mean"):
        aggregate(loss, mask, "mean", counts)


def test_masked_statistics_ignore_garbage():
    loss, mask = _agg_case()
    assert masked_mean(loss, mask).item() == pytest.approx(31 / 6)
    assert token_share(loss, mask, BatchCounts(tokens=12, sequences=4, norm_length=1)) == pytest.approx(31 / 12)
    assert masked_mean(loss, torch.zeros_like(mask)).item() == 0.0


# ---------------------------------------------------------------- clipped surrogate

def _surrogate_case():
    # column: A, ratio -> with clip_low 0.2 / clip_high 0.28:
    # 0: A=+1, r=1.5 : -1.5 vs -1.28 -> -1.28 (clipped: zero gradient)
    # 1: A=+1, r=0.5 : -0.5 vs -0.8  -> -0.5
    # 2: A=-1, r=0.5 :  0.5 vs  0.8  ->  0.8 (clipped)
    # 3: A=-1, r=1.2 :  1.2 vs  1.2  ->  1.2
    # 4: A=-1, r=5.0 :  5.0 vs  1.28 ->  5.0, dual clip c=3 caps it at 3 * |A| = 3
    # 5: A=+2, r=1.25: -2.5 vs -2.5  -> -2.5
    # 6: masked, log-prob -inf (a pad): 0, no NaN
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0, 2.0, 1.0]])
    ratio = torch.tensor([[1.5, 0.5, 0.5, 1.2, 5.0, 1.25, 1.0]])
    old = torch.tensor([[-1.0, -2.0, -0.5, -1.5, -3.0, -0.7, 0.0]])
    logp = (old + ratio.log()).clone()
    logp[0, 6] = -INF
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]], dtype=torch.float32)
    return logp, old, adv, mask


def test_surrogate_with_separate_low_and_high_clip():
    logp, old, adv, mask = _surrogate_case()
    logp.requires_grad_(True)
    terms = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(terms.loss, torch.tensor([[-1.28, -0.5, 0.8, 1.2, 5.0, -2.5, 0.0]]))
    assert terms.clipped.tolist() == [[True, False, True, False, False, False, False]]
    assert not terms.dual_clipped.any()
    terms.loss.sum().backward()
    # d/dlogp of -A*r = -A*r where unclipped, 0 where clipped or masked (not NaN)
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5, 0.0, 1.2, 5.0, -2.5, 0.0]]))


def test_surrogate_symmetric_clip_and_dual_clip():
    logp, old, adv, mask = _surrogate_case()
    sym = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    # column 0 now clips at 1.2 -> -1.2; column 5 (A=+2, r=1.25) too: max(-2.5, -2 * 1.2) = -2.4;
    # column 3 (r = 1.2) sits on the bound: 1.2 either way
    torch.testing.assert_close(sym.loss, torch.tensor([[-1.2, -0.5, 0.8, 1.2, 5.0, -2.4, 0.0]]))
    logp.requires_grad_(True)
    dual = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    torch.testing.assert_close(dual.loss, torch.tensor([[-1.28, -0.5, 0.8, 1.2, 3.0, -2.5, 0.0]]))
    assert dual.dual_clipped.tolist() == [[False, False, False, False, True, False, False]]
    dual.loss.sum().backward()
    assert logp.grad[0, 4].item() == 0.0 and torch.isfinite(logp.grad).all()


# ---------------------------------------------------------------- value loss, entropy

def test_clipped_value_loss_by_hand():
    # clip 0.5; loss = 0.5 * max((v - R)^2, (v_clip - R)^2), v_clip = old + clamp(v - old, -0.5, 0.5)
    # 0: v=1,  old=0, R=2   : v_clip=0.5 ; (1)^2=1 vs (1.5)^2=2.25  -> 1.125 (clipped)
    # 1: v=.2, old=0, R=1   : v_clip=0.2 ; 0.64 vs 0.64            -> 0.32
    # 2: v=3,  old=2, R=0   : v_clip=2.5 ; 9 vs 6.25               -> 4.5
    # 3: v=-1, old=0, R=-.2 : v_clip=-0.5; 0.64 vs 0.09            -> 0.32
    # 4: masked garbage                                            -> 0
    v = torch.tensor([[1.0, 0.2, 3.0, -1.0, NAN]])
    old = torch.tensor([[0.0, 0.0, 2.0, 0.0, INF]])
    ret = torch.tensor([[2.0, 1.0, 0.0, -0.2, NAN]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    terms = value_loss(v, old, ret, mask, clip=0.5)
    torch.testing.assert_close(terms.loss, torch.tensor([[1.125, 0.32, 4.5, 0.32, 0.0]]))
    assert terms.clipped.tolist() == [[True, False, False, False, False]]
    plain = value_loss(v, old, ret, mask, clip=None)
    torch.testing.assert_close(plain.loss, torch.tensor([[0.5, 0.32, 4.5, 0.32, 0.0]]))


def test_entropy_from_logits_matches_categorical_and_survives_masked_vocab():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 11, generator=gen)
    torch.testing.assert_close(entropy_from_logits(logits), torch.distributions.Categorical(logits=logits).entropy())
    # two equally likely tokens and the rest masked with a large finite negative: H = log 2
    masked = torch.full((7,), torch.finfo(torch.float32).min / 2)
    masked[:2] = 0.3
    assert entropy_from_logits(masked).item() == pytest.approx(math.log(2))

