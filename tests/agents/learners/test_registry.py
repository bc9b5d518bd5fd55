"""The registries of advantage estimators and policy losses: a user's function is found by name and used by
an algorithm that names it, a taken name is refused unless replaced on purpose, unknown names fail in one
line listing the known ones."""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch")
import torch  # noqa: E402

from agents.learners import (  # noqa: E402
    ADVANTAGES, ALGORITHMS, GRPO, POLICY_LOSSES, GRPOConfig, lookup_advantage, lookup_algorithm, lookup_policy_loss,
    register_advantage, register_algorithm, register_policy_loss,
)
from agents.learners.base import clipped_surrogate  # noqa: E402
from agents.learners.core import PolicyLossTerms  # noqa: E402
from tests.agents.learners.test_algorithms import F64, Out, make_batch  # noqa: E402


@pytest.fixture
def clean_registries():
    """The registries as they are, restored after the test (a test's registrations do not leak)."""
    saved = [(table, dict(table)) for table in (ADVANTAGES, POLICY_LOSSES, ALGORITHMS)]
    yield
    for table, items in saved:
        table.clear()
        table.update(items)


def test_a_user_estimator_and_loss_are_found_and_used(clean_registries):
    @register_advantage("row-score")
    def row_score(batch, scores, config):  # the raw score on every trained token
        return torch.where(batch.trained_mask.bool(), scores[:, None], torch.zeros((), dtype=scores.dtype))

    @register_policy_loss("plain-pg")
    def plain_pg(logprobs, old_logprobs, advantages, mask, config):  # -A·log pi, no ratio, no clip
        keep = mask.bool()
        zero = torch.zeros((), dtype=logprobs.dtype)
        loss = torch.where(keep, -advantages * logprobs, zero)
        return PolicyLossTerms(loss, torch.ones_like(logprobs), torch.zeros_like(keep), torch.zeros_like(keep))

    @register_algorithm
    class RowScorePG(GRPO):
        name = "row-score-pg"
        advantage_estimator = "row-score"
        policy_loss_name = "plain-pg"

    assert lookup_advantage("row-score") is row_score and lookup_policy_loss("plain-pg") is plain_pg
    algo = lookup_algorithm("row-score-pg")(GRPOConfig(kl_coef=0.0, entropy_coef=0.0))
    batch = make_batch(["PAA"], [0.5], [0])
    algo.compute_advantages(batch)
    torch.testing.assert_close(batch.advantages, torch.tensor([[0, 0.5, 0.5]], dtype=F64))
    # loss = token mean of -A·log pi = -0.5 x (log 0.5 + log 0.25) / 2 = 0.519860
    batch.old_logprobs = torch.zeros(1, 3, dtype=F64)
    loss, _ = algo.loss(batch, Out(torch.log(torch.tensor([[1.0, 0.5, 0.25]], dtype=F64))), algo.counts(batch))
    assert loss.item() == pytest.approx(-0.5 * (torch.log(torch.tensor(0.125)).item()) / 2)


def test_built_in_names():
    assert {"grpo", "rloo", "gigpo"} <= set(ADVANTAGES)
    assert {"vanilla", "gspo"} <= set(POLICY_LOSSES)
    assert lookup_policy_loss("vanilla") is clipped_surrogate


def test_unknown_names_fail_in_one_line():
    with pytest.raises(ValueError, match=r"^unknown advantage estimator 'rlo'; known: [^\n]*rloo[^\n]*; did you mean 'rloo'\?$"):
        lookup_advantage("rlo")
    with pytest.raises(LookupError, match=r"^unknown policy loss 'clip'; known: [^\n]*gspo, vanilla[^\n]*$"):
        lookup_policy_loss("clip")


def test_an_algorithm_naming_an_unknown_function_fails_when_built(clean_registries):
    class Broken(GRPO):
        name = "broken"
        policy_loss_name = "nope"

    with pytest.raises(ValueError, match=r"^unknown policy loss 'nope'; known: "):
        Broken(GRPOConfig())

    class AlsoBroken(GRPO):
        name = "also-broken"
        advantage_estimator = "nope"

    with pytest.raises(ValueError, match=r"^unknown advantage estimator 'nope'; known: "):
        AlsoBroken(GRPOConfig())


def test_a_taken_name_is_refused_unless_replaced(clean_registries):
    def other(batch, scores, config):
        return scores

    taken = r"^advantage estimator 'grpo' is already registered \(agents.learners.grpo.group_relative_advantages\); "
    with pytest.raises(ValueError, match=taken + "pass replace=True to replace it$"):
        register_advantage("grpo")(other)
    register_advantage("grpo", replace=True)(other)
    assert lookup_advantage("grpo") is other
    with pytest.raises(ValueError, match=r"^policy loss 'gspo' is already registered"):
        register_policy_loss("gspo")(other)
    with pytest.raises(ValueError, match="needs a non-empty name"):
        register_policy_loss("")
