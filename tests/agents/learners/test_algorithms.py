"""The algorithms on TrainBatches built by hand: reward placement with the KL penalty, the group
baseline, GAE with KL in the reward, GRPO's DAPO options, the assembled losses, config errors, and
micro-batch invariance of the gradient on a tiny bigram policy for every aggregation mode."""
from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch")
import torch  # noqa: E402

from agents.rollout.batch import TrainBatch  # noqa: E402
from agents.learners import (  # noqa: E402
    AGG_MODES, GRPO, PPO, GRPOConfig, PPOConfig, ReinforcePP, ReinforcePPBaseline, ReinforcePPBaselineConfig,
    ReinforcePPConfig, lookup_algorithm,
)
from agents.training.config import EnvConfig, TrainConfig  # noqa: E402
from agents.learners.advantages import place_on_last_token  # noqa: E402
from agents.learners.core import entropy_from_logits  # noqa: E402
from search_env.trajectory import AGENT, ENVIRONMENT, Trajectory  # noqa: E402

NAN = float("nan")
F64 = torch.float64


@dataclass
class Out:
    """A PolicyOutput-like forward result."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None


def make_batch(rows: list[str], scores: list[float], groups: list[int], *, vocab: int = 17, seed: int = 0) -> TrainBatch:
    """A right-padded batch from token patterns: P prompt, E environment (both untrained), A trained
    agent token, U untrained agent token. The score goes on each row's last trained token."""
    gen = torch.Generator().manual_seed(seed)
    B, T = len(rows), max(len(r) for r in rows)
    ids = torch.zeros(B, T, dtype=torch.long)
    attention = torch.zeros(B, T, dtype=torch.long)
    trained = torch.zeros(B, T, dtype=F64)
    trajectories = []
    for b, row in enumerate(rows):
        n = len(row)
        ids[b, :n] = torch.randint(1, vocab, (n,), generator=gen)
        attention[b, :n] = 1
        trained[b, :n] = torch.tensor([c == "A" for c in row], dtype=F64)
        trajectories.append(Trajectory(
            question=f"q{groups[b]}", golden_answers=["x"], protocol="search-r1", example_id=f"q{groups[b]}",
            prompt_length=row.index("A") if "A" in row else n, token_ids=ids[b, :n].tolist(),
            producers=bytearray(AGENT if c in "AU" else ENVIRONMENT for c in row),
            trained=bytearray(int(c == "A") for c in row), reward=scores[b],
        ))
    score_t = torch.tensor(scores, dtype=F64)
    return TrainBatch(
        input_ids=ids, attention_mask=attention, position_ids=(attention.cumsum(1) - 1).clamp_min(0),
        trained_mask=trained, token_rewards=place_on_last_token(score_t, trained), scores=score_t,
        group_index=torch.tensor(groups), group_ids=[f"q{g}" for g in groups], trajectories=trajectories,
    )


def with_log_ratio(batch: TrainBatch, log_ratio: list[list[float]]) -> TrainBatch:
    """Sets old_logprobs - ref_logprobs = log_ratio (NaN where the pattern gives NaN: untrained junk)."""
    ratio = torch.tensor(log_ratio, dtype=F64)
    batch.ref_logprobs = torch.full_like(ratio, -2.0)
    batch.old_logprobs = batch.ref_logprobs + ratio
    return batch


# ---------------------------------------------------------------- advantages through the algorithms

def test_reinforce_pp_places_score_and_kl_penalty_then_whitens():
    # row 0 "PPAAEEA": k1 = old - ref = 0.5, -1.0, 2.0 on its trained tokens; kl_coef 0.1 -> -0.05, +0.1, -0.2;
    #   score 1 on t=6. gamma 1: G(t=6) = 0.8, G(3) = 0.9, G(2) = 0.85 (carried over the env span)
    # row 1 "PAEA": k1 = 1.0, 0.0 -> -0.1, 0; score 0: G(3) = 0, G(1) = -0.1
    # whitened over the 5 trained tokens: mean 0.49, population std sqrt(0.982 / 5) = 0.443171
    batch = make_batch(["PPAAEEA", "PAEA"], [1.0, 0.0], [0, 1])
    with_log_ratio(batch, [[NAN, NAN, 0.5, -1.0, NAN, NAN, 2.0], [NAN, 1.0, NAN, 0.0, NAN, NAN, NAN]])
    algo = ReinforcePP(ReinforcePPConfig(kl_coef=0.1, kl_estimator="k1", gamma=1.0))
    stats = algo.compute_advantages(batch)
    torch.testing.assert_close(batch.returns, torch.tensor(
        [[0, 0, 0.85, 0.9, 0, 0, 0.8], [0, -0.1, 0, 0.0, 0, 0, 0]], dtype=F64))
    torch.testing.assert_close(batch.advantages, torch.tensor(
        [[0, 0, 0.812329, 0.925152, 0, 0, 0.699505], [0, -1.331316, 0, -1.105669, 0, 0, 0]], dtype=F64), atol=1e-5, rtol=0)
    assert stats["kl_reward"] == pytest.approx((0.5 - 1.0 + 2.0 + 1.0 + 0.0) / 5)


def test_reinforce_pp_baseline_subtracts_the_group_mean_score():
    # group 0: scores 1 and 0 -> mean 0.5 -> rewards +0.5 (row 0), -0.5 (row 1) on the last trained token;
    # group 1: a singleton is its own baseline -> 0. gamma 1 -> every trained token's return is its row's.
    # whiten [0.5, 0.5, -0.5, -0.5, -0.5, 0]: mean -1/12, std 0.448764 -> 1.299867, -0.928477, 0.185695
    batch = make_batch(["PAA", "PAEAA", "PPA"], [1.0, 0.0, 0.7], [0, 0, 1])
    algo = ReinforcePPBaseline(ReinforcePPBaselineConfig(kl_coef=0.0))
    assert not algo.uses_reference
    algo.compute_advantages(batch)
    torch.testing.assert_close(batch.returns, torch.tensor(
        [[0, 0.5, 0.5, 0, 0], [0, -0.5, 0, -0.5, -0.5], [0, 0, 0.0, 0, 0]], dtype=F64))
    torch.testing.assert_close(batch.advantages, torch.tensor(
        [[0, 1.299867, 1.299867, 0, 0], [0, -0.928477, 0, -0.928477, -0.928477], [0, 0, 0.185695, 0, 0]], dtype=F64),
        atol=1e-5, rtol=0)


def test_ppo_gae_with_kl_in_the_reward():
    # "PPAAEEA" + a pad, values 0.5, 0.6, 0.8 on the trained tokens (junk elsewhere); k1 0.5, -1, 2 x 0.1
    # token rewards: -0.05, 0.1, -0.2 + 1 = 0.8. gamma 0.9, lam 0.8:
    # a3: delta = 0.8 - 0.8 = 0                      A3 = 0
    # a2: delta = 0.1 + 0.9 * 0.8 - 0.6 = 0.22       A2 = 0.22
    # a1: delta = -0.05 + 0.9 * 0.6 - 0.5 = -0.01    A1 = -0.01 + 0.72 * 0.22 = 0.1484
    # returns 0.6484, 0.82, 0.8; whitened: 0.279413, 1.060895, -1.340308
    batch = make_batch(["PPAAEEA", "PA"], [1.0, 0.0], [0, 1])
    batch.trained_mask[1] = 0  # the second row only pads the first
    batch.token_rewards = place_on_last_token(batch.scores, batch.trained_mask)
    with_log_ratio(batch, [[NAN, NAN, 0.5, -1.0, NAN, NAN, 2.0], [NAN] * 7])
    batch.values = torch.tensor([[0.0, 9.0, 0.5, 0.6, 7.0, 7.0, 0.8], [NAN] * 7], dtype=F64)
    config = dict(kl_coef=0.1, kl_estimator="k1", kl_in_reward=True, gamma=0.9, lam=0.8)
    PPO(PPOConfig(whiten_advantages=False, **config)).compute_advantages(batch)
    torch.testing.assert_close(batch.advantages[0], torch.tensor([0, 0, 0.1484, 0.22, 0, 0, 0.0], dtype=F64))
    torch.testing.assert_close(batch.returns[0], torch.tensor([0, 0, 0.6484, 0.82, 0, 0, 0.8], dtype=F64))
    assert (batch.advantages[1] == 0).all()
    PPO(PPOConfig(whiten_advantages=True, **config)).compute_advantages(batch)
    torch.testing.assert_close(
        batch.advantages[0], torch.tensor([0, 0, 0.279413, 1.060895, 0, 0, -1.340308], dtype=F64), atol=1e-5, rtol=0
    )


def test_grpo_dynamic_sampling_and_overlong_shaping():
    # budget 10 agent tokens, buffer 4: free up to 6. Group 0: both right (1.0), but row 1 has 9 agent
    # tokens (8 trained + 1 untrained 'U': the budget counts agent tokens) -> 1 - 3/4 = 0.25, so the
    # group is informative: mean 0.625, std 0.530330 -> +/- 0.707107.
    # Group 1: two wrong answers (all equal) and group 2: a singleton -> dropped by dynamic sampling.
    rows = ["PAAEAA", "PAAAAAEEAAAU", "PAA", "PAEA", "PA"]
    batch = make_batch(rows, [1.0, 1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1, 2])
    algo = GRPO(GRPOConfig(overlong_buffer=4, dynamic_sampling=True, kl_coef=0.0), max_new_tokens=10)
    kept = algo.filter_batch(batch)
    assert kept.group_ids == ["q0", "q0"]
    stats = algo.compute_advantages(kept)
    per_row = torch.tensor([0.707107, -0.707107], dtype=F64)
    torch.testing.assert_close(kept.advantages, per_row[:, None] * kept.trained_mask, atol=1e-5, rtol=0)
    assert stats["score/overlong_penalty"] == pytest.approx(-0.375)
    # without dynamic sampling every row stays, and the dropped groups get 0
    algo = GRPO(GRPOConfig(overlong_buffer=4, kl_coef=0.0), max_new_tokens=10)
    assert algo.filter_batch(batch) is batch
    algo.compute_advantages(batch)
    assert (batch.advantages[2:] == 0).all()


def test_grpo_kl_in_reward_lowers_the_score_by_the_summed_kl():
    # kl_in_reward with k1 0.1: row 0 penalised by 0.1 * (1 + 2) = 0.3 -> scores 0.7 and 0.0 (row 1 KL 0);
    # no std: centred +/- 0.35
    batch = make_batch(["PAA", "PAA"], [1.0, 0.0], [0, 0])
    with_log_ratio(batch, [[NAN, 1.0, 2.0], [NAN, 0.0, 0.0]])
    GRPO(GRPOConfig(kl_coef=0.1, kl_estimator="k1", kl_in_reward=True, scale_rewards=False)).compute_advantages(batch)
    torch.testing.assert_close(batch.advantages, torch.tensor([[0, 0.35, 0.35], [0, -0.35, -0.35]], dtype=F64))


# ---------------------------------------------------------------- assembled losses

def test_grpo_loss_by_hand():
    # trained tokens t=1, 2. ratios: exp(log .5 - log .5) = 1, exp(log .4 - log .5) = 0.8; A = +1, -1
    # surrogate: -1 * 1 = -1 and max(0.8, 0.8) = 0.8 -> token-mean -0.1
    # k3 to the reference: t=1: log r = log(.25 / .5) -> 0.5 - 1 + log 2 = 0.193147; t=2: 0 -> mean 0.0965736
    # entropy mean (1 + 2) / 2 = 1.5
    # total = -0.1 + 0.1 * 0.0965736 - 0.01 * 1.5 = -0.1053426
    batch = make_batch(["PAA"], [1.0], [0])
    batch.old_logprobs = torch.log(torch.tensor([[1.0, 0.5, 0.5]], dtype=F64))
    batch.ref_logprobs = torch.log(torch.tensor([[1.0, 0.25, 0.4]], dtype=F64))
    batch.advantages = torch.tensor([[0.0, 1.0, -1.0]], dtype=F64)
    out = Out(torch.log(torch.tensor([[1.0, 0.5, 0.4]], dtype=F64)), entropy=torch.tensor([[9.0, 1.0, 2.0]], dtype=F64))
    algo = GRPO(GRPOConfig(kl_coef=0.1, kl_estimator="k3", entropy_coef=0.01))
    loss, stats = algo.loss(batch, out, algo.counts(batch))
    assert loss.item() == pytest.approx(-0.1053426, abs=1e-6)
    assert stats["kl"] == pytest.approx(0.0965736, abs=1e-6)
    assert stats["entropy"] == pytest.approx(1.5)
    assert stats["policy/clip_frac"] == 0.0


def test_ppo_value_head_and_separate_critic():
    # values (1, 0.2), rollout values (0, 0), returns (2, 1), clip 0.5 -> per-token 1.125 and 0.32, mean 0.7225;
    # the policy term is 0 (ratio 1, A = +1 and -1): head total = 0.5 * 0.7225 = 0.36125
    batch = make_batch(["PAA"], [1.0], [0])
    batch.old_logprobs = torch.tensor([[0.0, -1.0, -2.0]], dtype=F64)
    batch.advantages = torch.tensor([[0.0, 1.0, -1.0]], dtype=F64)
    batch.values = torch.zeros(1, 3, dtype=F64)
    batch.returns = torch.tensor([[0.0, 2.0, 1.0]], dtype=F64)
    values = torch.tensor([[5.0, 1.0, 0.2]], dtype=F64)
    out = Out(batch.old_logprobs.clone(), values=values)
    base = dict(kl_coef=0.0, entropy_coef=0.0, value_clip=0.5)
    head = PPO(PPOConfig(critic="head", vf_coef=0.5, **base))
    assert head.value_head and head.uses_critic and not head.uses_reference
    loss, stats = head.loss(batch, out, head.counts(batch))
    assert loss.item() == pytest.approx(0.36125)
    assert stats["loss/value"] == pytest.approx(0.7225) and stats["value/clip_frac"] == pytest.approx(0.5)
    separate = PPO(PPOConfig(critic="separate", **base))
    assert not separate.value_head
    assert separate.loss(batch, Out(batch.old_logprobs.clone()), separate.counts(batch))[0].item() == pytest.approx(0.0)
    assert separate.critic_loss(batch, values, separate.counts(batch))[0].item() == pytest.approx(0.7225)


def test_missing_inputs_give_one_line_errors():
    batch = make_batch(["PAA"], [1.0], [0])
    batch.old_logprobs = torch.zeros(1, 3, dtype=F64)
    algo = GRPO(GRPOConfig(kl_coef=0.0))
    with pytest.raises(ValueError, match=r"batch.advantages is None: call compute_advantages"):
        algo.loss(batch, Out(torch.zeros(1, 3, dtype=F64)), algo.counts(batch))
    with pytest.raises(ValueError, match=r"batch.values is None"):
        PPO(PPOConfig()).compute_advantages(batch)
    with pytest.raises(ValueError, match=r"batch.ref_logprobs is None"):
        ReinforcePP(ReinforcePPConfig()).compute_advantages(batch)
    batch.advantages = torch.zeros(1, 3, dtype=F64)
    with pytest.raises(ValueError, match=r"out.entropy is None"):
        GRPO(GRPOConfig(kl_coef=0.0, entropy_coef=0.01)).loss(batch, Out(torch.zeros(1, 3, dtype=F64)), algo.counts(batch))
    with pytest.raises(TypeError, match="GRPO needs a GRPOConfig, got PPOConfig"):
        GRPO(PPOConfig())


# ---------------------------------------------------------------- configs and registry

@pytest.mark.parametrize("make, message", [
    (lambda: GRPOConfig(loss_agg_mode="sum"), "unknown loss_agg_mode 'sum'"),
    (lambda: GRPOConfig(group_size=1), "group_size must be >= 2"),
    (lambda: GRPO(GRPOConfig(overlong_buffer=200), max_new_tokens=100), r"^overlong_buffer must be in \[0, max_new_tokens=100\], got 200$"),
    (lambda: TrainConfig("grpo", env=EnvConfig(max_new_tokens=100), algorithm=GRPOConfig(overlong_buffer=200)),
     r"^algorithm.overlong_buffer must be in \[0, env.max_new_tokens=100\], got 200$"),
    (lambda: GRPO(GRPOConfig(), max_new_tokens=0), "max_new_tokens must be >= 1"),
    (lambda: PPOConfig(critic="shared"), "unknown critic 'shared'; known: head, separate"),
    (lambda: PPOConfig(dual_clip=0.5), "dual_clip must be > 1"),
    (lambda: PPOConfig(clip_low=1.0), "clip range"),
    (lambda: PPOConfig(lam=1.5), "gamma and lam"),
    (lambda: ReinforcePPConfig(kl_estimator="k4"), "unknown kl_estimator 'k4'"),
    (lambda: ReinforcePPConfig(kl_coef=-1.0), "kl_coef must be >= 0"),
    (lambda: TrainConfig("reinforce++-baseline", algorithm=ReinforcePPConfig()),
     r"^algo 'reinforce\+\+-baseline' takes a ReinforcePPBaselineConfig, got a ReinforcePPConfig$"),
    (lambda: ReinforcePPBaselineConfig(group_size=1), "group-mean baseline needs group_size >= 2"),
])
def test_bad_settings_fail_at_load_time(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_registry_lookup_and_build():
    assert lookup_algorithm("reinforce++-baseline") is ReinforcePPBaseline
    assert lookup_algorithm("reinforce++-baseline").config_class is ReinforcePPBaselineConfig
    # (other tests' modules may register algorithms of their own after the built-in ones)
    known = r"gigpo, grpo, gspo, ppo, reinforce\+\+, reinforce\+\+-baseline, rloo(, [^;]+)?"
    with pytest.raises(ValueError, match=rf"^unknown algorithm 'dpo'; known: {known}; did you mean 'ppo'\?$"):
        lookup_algorithm("dpo")
    algo = lookup_algorithm("grpo")(GRPOConfig(clip_high=0.28))
    assert isinstance(algo, GRPO) and algo.uses_reference and not algo.uses_critic
    assert algo.max_new_tokens == 256
    assert not lookup_algorithm("grpo")(GRPOConfig(kl_coef=0.0)).uses_reference


# ---------------------------------------------------------------- micro-batch invariance

class BigramPolicy(torch.nn.Module):
    """A tiny policy whose next-token distribution depends on the previous token only, with a value head:
    it runs on any subset of rows and any trimmed width, like the real policy."""

    def __init__(self, vocab: int = 17, dim: int = 6) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim, dtype=F64)
        self.head = torch.nn.Linear(dim, vocab, dtype=F64)
        self.value = torch.nn.Linear(dim, 1, dtype=F64)

    def forward(self, input_ids: torch.Tensor) -> Out:
        hidden = self.embed(input_ids[:, :-1])
        logits = self.head(hidden)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        first = torch.zeros(input_ids.shape[0], 1, dtype=F64)
        return Out(
            logprobs=torch.cat([first, logp], dim=1),
            entropy=torch.cat([first, entropy_from_logits(logits)], dim=1),
            values=torch.cat([first, self.value(hidden).squeeze(-1)], dim=1),
        )


def _random_batch(seed: int) -> tuple[TrainBatch, BigramPolicy]:
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(9):
        pattern = "P" * int(torch.randint(1, 4, (1,), generator=gen))
        for _ in range(int(torch.randint(1, 4, (1,), generator=gen))):
            pattern += "A" * int(torch.randint(1, 5, (1,), generator=gen)) + "E" * int(torch.randint(0, 4, (1,), generator=gen))
        rows.append(pattern)
    scores = torch.rand(9, generator=gen).tolist()
    batch = make_batch(rows, scores, [0, 0, 0, 1, 1, 1, 2, 2, 2], seed=seed)
    torch.manual_seed(seed)
    policy = BigramPolicy()
    with torch.no_grad():
        for noise in ("old", "ref"):
            other = copy.deepcopy(policy)
            for p in other.parameters():
                p.add_(0.5 * torch.randn_like(p))
            out = other(batch.input_ids)
            if noise == "old":
                batch.old_logprobs, batch.values = out.logprobs, out.values
            else:
                batch.ref_logprobs = out.logprobs
    batch.advantages = torch.randn(batch.trained_mask.shape, generator=gen, dtype=F64) * batch.trained_mask
    batch.returns = torch.randn(batch.trained_mask.shape, generator=gen, dtype=F64) * batch.trained_mask
    return batch, policy


def _grad(policy: BigramPolicy, algo, parts: list[TrainBatch], counts_of) -> tuple[torch.Tensor, dict[str, float]]:
    policy.zero_grad()
    totals: dict[str, float] = {}
    for part in parts:
        loss, stats = algo.loss(part, policy(part.input_ids), counts_of(part))
        loss.backward()
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in policy.parameters()]
    return torch.cat([g.flatten() for g in grads]), totals


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("algo_name", ["grpo", "ppo"])
def test_summed_micro_batch_gradients_equal_the_full_batch_gradient(mode, algo_name):
    batch, policy = _random_batch(seed=len(mode))
    common = dict(loss_agg_mode=mode, clip_low=0.2, clip_high=0.28, dual_clip=3.0, entropy_coef=0.01)
    if algo_name == "grpo":
        algo = GRPO(GRPOConfig(kl_coef=0.05, kl_estimator="k3", **common), max_new_tokens=40)
    else:
        algo = PPO(PPOConfig(critic="head", vf_coef=0.5, kl_coef=0.0, **common), max_new_tokens=40)
    counts = algo.counts(batch)
    full_grad, full_stats = _grad(policy, algo, [batch], lambda _: counts)
    assert full_stats["policy/clip_frac"] > 0  # the clip is really exercised

    gen = torch.Generator().manual_seed(7)
    order = torch.randperm(len(batch), generator=gen)
    cuts = sorted(torch.randperm(len(batch) - 1, generator=gen)[:3].add(1).tolist())
    parts = [batch.select(chunk).trimmed() for chunk in torch.tensor_split(order, cuts)]
    assert any(p.input_ids.shape[1] < batch.input_ids.shape[1] for p in parts)  # trimming is exercised
    split_grad, split_stats = _grad(policy, algo, parts, lambda _: counts)
    torch.testing.assert_close(split_grad, full_grad, rtol=1e-9, atol=1e-12)
    assert split_stats == pytest.approx(full_stats, rel=1e-9, abs=1e-12)

    fixed_grad, _ = _grad(policy, algo, batch.select(order).micro_batches(2), lambda _: counts)
    torch.testing.assert_close(fixed_grad, full_grad, rtol=1e-9, atol=1e-12)

    # the check has teeth: per-micro-batch denominators give another gradient
    local_grad, _ = _grad(policy, algo, parts, algo.counts)
    assert not torch.allclose(local_grad, full_grad, rtol=1e-4, atol=1e-8)
