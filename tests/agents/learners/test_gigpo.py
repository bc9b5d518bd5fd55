"""GiGPO against hand-worked values on episodes with several search turns: turns cut at the environment's
tokens, step groups of equal anchors inside a question group (observations or exact context), discounted
step returns, the combined advantage; config errors and a two-step run of the tiny model."""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch")
import torch  # noqa: E402

from agents.learners import GRPO, GRPOConfig, GiGPO, GiGPOConfig, lookup_advantage, lookup_algorithm  # noqa: E402
from agents.learners.advantages import place_on_last_token  # noqa: E402
from agents.learners.gigpo import gigpo_advantages, turn_spans, turns  # noqa: E402
from agents.rollout.batch import TrainBatch  # noqa: E402
from search_env.trajectory import AGENT, ENVIRONMENT, Trajectory  # noqa: E402

F64 = torch.float64

# Three episodes of one question (ids chosen so that anchors can be equal):
#   row 0: P[1 2] A[10 11] E[50] A[12]               2 turns; the first search returned [50]
#   row 1: P[1 2] A[13]    E[50] A[14 15]            2 turns; the same observation [50] after other words
#   row 2: P[1 2] A[10]    E[60] A[16] E[70] A[17] U[18]   3 turns; U: an agent token not trained on
ROWS = [
    [("P", [1, 2]), ("A", [10, 11]), ("E", [50]), ("A", [12])],
    [("P", [1, 2]), ("A", [13]), ("E", [50]), ("A", [14, 15])],
    [("P", [1, 2]), ("A", [10]), ("E", [60]), ("A", [16]), ("E", [70]), ("A", [17]), ("U", [18])],
]


def episode_batch(rows=ROWS, scores=(1.0, 0.0, 1.0), groups=(0, 0, 0)) -> TrainBatch:
    """A right-padded batch of explicitly spelt episodes (segments of prompt, trained agent, untrained agent
    and environment tokens)."""
    width = max(sum(len(ids) for _, ids in row) for row in rows)
    B = len(rows)
    ids_t = torch.zeros(B, width, dtype=torch.long)
    attention = torch.zeros(B, width, dtype=torch.long)
    trained = torch.zeros(B, width, dtype=F64)
    trajectories = []
    for b, row in enumerate(rows):
        ids = [i for _, seg in row for i in seg]
        kinds = [kind for kind, seg in row for _ in seg]
        n = len(ids)
        ids_t[b, :n] = torch.tensor(ids)
        attention[b, :n] = 1
        trained[b, :n] = torch.tensor([k == "A" for k in kinds], dtype=F64)
        trajectories.append(Trajectory(
            question=f"q{groups[b]}", golden_answers=["x"], protocol="search-r1", example_id=f"q{groups[b]}",
            prompt_length=kinds.index("A"), token_ids=ids, producers=bytearray(AGENT if k in "AU" else ENVIRONMENT for k in kinds),
            trained=bytearray(int(k == "A") for k in kinds), reward=scores[b],
        ))
    score_t = torch.tensor(scores, dtype=F64)
    return TrainBatch(
        input_ids=ids_t, attention_mask=attention, position_ids=(attention.cumsum(1) - 1).clamp_min(0), trained_mask=trained,
        token_rewards=place_on_last_token(score_t, trained), scores=score_t, group_index=torch.tensor(groups),
        group_ids=[f"q{g}" for g in groups], trajectories=trajectories,
    )


def test_turns_are_runs_of_agent_tokens_after_the_prompt():
    batch = episode_batch()
    assert [turn_spans(t) for t in batch.trajectories] == [[(2, 4), (5, 6)], [(2, 3), (4, 6)], [(2, 3), (4, 5), (6, 8)]]
    by_obs = turns(batch, "observations")
    # the second turns of rows 0 and 1 share an anchor (the same observation [50]); row 2's does not
    assert by_obs[1].anchor == by_obs[3].anchor != by_obs[5].anchor
    assert by_obs[0].anchor == by_obs[2].anchor == by_obs[4].anchor  # every first turn starts from the prompt
    by_context = turns(batch, "context")
    assert by_context[1].anchor != by_context[3].anchor  # their contexts differ in the agent's words
    assert by_context[0].anchor == by_context[2].anchor == by_context[4].anchor


def test_gigpo_advantages_by_hand_centred():
    # scale_rewards False (GiGPO's mean_norm); step_gamma 0.5, step_weight 1.
    # episode: scores 1, 0, 1, mean 2/3 -> +1/3, -2/3, +1/3
    # step returns gamma^(K-1-k) x score: row 0: 0.5, 1; row 1: 0, 0; row 2: 0.25, 0.5, 1
    # step groups: first turns {0.5, 0, 0.25}, mean 0.25 -> +0.25, -0.25, 0
    #              second turns after [50] {row 0: 1, row 1: 0} -> +0.5, -0.5; row 2's later turns alone -> 0
    # tokens: row 0 turn 1 (cols 2, 3): 1/3 + 0.25; turn 2 (col 5): 1/3 + 0.5
    #         row 1 turn 1 (col 2): -2/3 - 0.25; turn 2 (cols 4, 5): -2/3 - 0.5
    #         row 2: 1/3 on its trained tokens (cols 2, 4, 6), 0 on the untrained agent token (col 7)
    batch = episode_batch()
    config = GiGPOConfig(scale_rewards=False, step_gamma=0.5, step_weight=1.0, kl_coef=0.0)
    stats = GiGPO(config).compute_advantages(batch)
    a, b = 1 / 3, -2 / 3
    expected = torch.tensor([
        [0, 0, a + 0.25, a + 0.25, 0, a + 0.5, 0, 0],
        [0, 0, b - 0.25, 0, b - 0.5, b - 0.5, 0, 0],
        [0, 0, a, 0, a, 0, a, 0],
    ], dtype=F64)
    torch.testing.assert_close(batch.advantages, expected)
    assert stats["gigpo/shared_turn_frac"] == pytest.approx(2 / 4)  # later turns: rows 0 and 1 share, row 2's two don't
    # with the exact context as anchor the second turns of rows 0 and 1 differ: no step credit there
    GiGPO(GiGPOConfig(scale_rewards=False, step_gamma=0.5, anchor="context", kl_coef=0.0)).compute_advantages(batch)
    torch.testing.assert_close(batch.advantages[0], torch.tensor([0, 0, a + 0.25, a + 0.25, 0, a, 0, 0], dtype=F64))
    torch.testing.assert_close(batch.advantages[1], torch.tensor([0, 0, b - 0.25, 0, b, b, 0, 0], dtype=F64))


def test_gigpo_advantages_by_hand_with_std():
    # episode: deviations 1/3, -2/3, 1/3, sample std sqrt((1 + 4 + 1) / 9 / 2) = 0.57735 -> 0.57735, -1.1547, 0.57735
    # first turns: 0.25, -0.25, 0 / std 0.25 -> 1, -1, 0; second turns after [50]: +/-0.5 / 0.707107 -> +/-0.707107
    batch = episode_batch()
    GiGPO(GiGPOConfig(step_gamma=0.5, kl_coef=0.0)).compute_advantages(batch)
    e0, e1, s = 0.577350, -1.154701, 0.707107
    expected = torch.tensor([
        [0, 0, e0 + 1, e0 + 1, 0, e0 + s, 0, 0],
        [0, 0, e1 - 1, 0, e1 - s, e1 - s, 0, 0],
        [0, 0, e0, 0, e0, 0, e0, 0],
    ], dtype=F64)
    torch.testing.assert_close(batch.advantages, expected, atol=1e-5, rtol=0)


def test_step_groups_never_cross_questions_and_weight_zero_is_grpo():
    # rows 0 and 1 are now different questions, each alone: every advantage is 0 (nothing to compare)
    batch = episode_batch(groups=(0, 1, 2))
    GiGPO(GiGPOConfig(kl_coef=0.0, step_gamma=0.5)).compute_advantages(batch)
    assert (batch.advantages == 0).all()
    batch = episode_batch()
    GiGPO(GiGPOConfig(kl_coef=0.0, step_weight=0.0)).compute_advantages(batch)
    grpo = episode_batch()
    GRPO(GRPOConfig(kl_coef=0.0)).compute_advantages(grpo)
    torch.testing.assert_close(batch.advantages, grpo.advantages)


def test_gigpo_is_registered():
    assert lookup_algorithm("gigpo") is GiGPO and GiGPO.config_class is GiGPOConfig
    assert lookup_advantage("gigpo") is gigpo_advantages and GiGPO.advantage_estimator == "gigpo"


@pytest.mark.parametrize("make, message", [
    (lambda: GiGPOConfig(anchor="query"), r"^unknown anchor 'query'; known: observations, context$"),
    (lambda: GiGPOConfig(step_gamma=1.5), r"^step_gamma must be in \[0, 1\], got 1.5$"),
    (lambda: GiGPOConfig(step_weight=-1.0), r"^step_weight must be >= 0, got -1.0$"),
    (lambda: GiGPOConfig(group_size=1), "group_size must be >= 2"),
])
def test_gigpo_bad_settings(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_gigpo_needs_the_trajectories():
    batch = episode_batch()
    batch.trajectories = []
    with pytest.raises(ValueError, match=r"^GiGPO reads turns from the trajectories: 3 rows but 0 trajectories$"):
        GiGPO(GiGPOConfig(kl_coef=0.0)).compute_advantages(batch)


def test_gigpo_trains_the_tiny_model(tmp_path):
    skip_without("transformers", "yaml")
    from tests.agents.training.tiny import records, run, small_config

    trainer, result = run(small_config("gigpo", tmp_path, {"eval.questions": 0}))
    assert result.step == 2
    steps = [r for r in records(result.metrics_path) if "stage" not in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["grad_norm"] > 0 for r in steps)
