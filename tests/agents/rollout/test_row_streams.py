"""Every episode the HF sampler plays draws from a random stream of its own, keyed by the rollout's seed and
the episode's index in the rollout's whole batch: rows sampled as one batch of 8, as two batches of 4
(the second starting at ``first_row=4``, as a second data-parallel rank does) or in waves of 3 get the
same token ids, so one process and N ranks roll out the same episodes. The streams are SplitMix64's,
checked against its published first outputs."""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
import torch  # noqa: E402

from agents.rollout.collect import collect_rollouts  # noqa: E402
from agents.rollout.hf_sampler import HFSampler, row_keys, uniforms  # noqa: E402
from search_env import BatchSearchQAEnv  # noqa: E402
from search_env.tokenization import as_codec  # noqa: E402
from tests.agents.rollout.test_collect import biased_policy  # noqa: E402

QUESTIONS, GROUP = [0, 1, 2, 3], 2


def test_a_rows_uniforms_are_splitmix64s_stream_of_its_key():
    # SplitMix64 seeded with 0 starts 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f: the top 24 bits.
    drawn = uniforms(torch.zeros(3, dtype=torch.long), torch.arange(3))
    assert drawn.dtype == torch.float32
    assert [int(u * 2**24) for u in drawn] == [0xE220A8, 0x6E789E, 0x06C45D]
    # Each row's numbers depend on its own key and count alone, keys past 2**63 included (held as negatives).
    keys = torch.tensor(row_keys(5, 0, 4))
    assert len(set(keys.tolist())) == 4 and (keys < 0).any()
    together = uniforms(keys, torch.tensor([0, 7, 3, 1]))
    alone = torch.cat([uniforms(keys[i : i + 1], torch.tensor([d])) for i, d in enumerate([0, 7, 3, 1])])
    assert torch.equal(together, alone)
    assert row_keys(5, 2, 2) == keys[2:].tolist() and row_keys(6, 0, 4) != keys.tolist()
    many = uniforms(keys[:1].repeat(20000), torch.arange(20000))
    assert 0 <= float(many.min()) and float(many.max()) < 1 and abs(float(many.mean()) - 0.5) < 0.01


@pytest.fixture(scope="module")
def policy():
    return biased_policy(as_codec(None), "search-r1", seed=9)


def _ids(policy, envs: int, questions, *, first_row: int = 0, seed: int = 5, **options) -> list[list[int]]:
    env = BatchSearchQAEnv(envs, tokenizer=policy.codec, max_new_tokens=48)
    sampler = HFSampler(policy, temperature=1.0, seed=seed, first_row=first_row, **options)
    try:
        return [t.token_ids for t in collect_rollouts(sampler, env, questions, group_size=GROUP).trajectories]
    finally:
        env.close()


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_rows_sampled_in_one_batch_of_8_equal_two_batches_of_4_with_their_offsets(policy, top_p):
    whole = _ids(policy, 8, QUESTIONS, top_p=top_p)
    halves = _ids(policy, 4, QUESTIONS[:2], top_p=top_p) + _ids(policy, 4, QUESTIONS[2:], first_row=4, top_p=top_p)
    assert halves == whole
    assert len({tuple(ids) for ids in whole}) == len(whole)  # every row its own sample, a group's too
    # Waves of 3 (8 episodes: rows 0-2, 3-5, 6-7 of one sampler) count rows across waves.
    assert _ids(policy, 3, QUESTIONS, top_p=top_p) == whole
    # The offset matters: the second half started at row 0 samples other episodes.
    assert _ids(policy, 4, QUESTIONS[2:], top_p=top_p) != whole[4:]


def test_a_negative_first_row_is_one_line(policy):
    with pytest.raises(ValueError, match="first_row must be >= 0"):
        HFSampler(policy, first_row=-1)


def test_vllm_requests_are_seeded_by_the_rows_index_in_the_rollout_and_its_turn():
    """The vLLM agent's request seeds (vLLM itself is not needed to compute them): row 4 of a rollout of 8
    is row 0 of an agent that starts at ``first_row=4``, and of a second wave of 4."""
    from types import SimpleNamespace

    from agents.rollout.vllm_engine import VLLMAgent
    from search_env import get_protocol

    codec = as_codec(None)
    engine = SimpleNamespace(codec=codec)

    def seeds(agent: VLLMAgent, rows: int, first_wave: int = 0) -> list[int]:
        if first_wave:
            agent.begin([[5]] * first_wave, examples=[None] * first_wave, protocol=get_protocol("search-r1"), codec=codec)
        agent.begin([[5]] * rows, examples=[None] * rows, protocol=get_protocol("search-r1"), codec=codec)
        return [agent.request_seed(row) for row in range(rows)]

    whole = seeds(VLLMAgent(engine, seed=5), 8)
    assert len(set(whole)) == 8 and all(0 <= s < 2**31 for s in whole)
    assert seeds(VLLMAgent(engine, seed=5, first_row=4), 4) == whole[4:]
    assert seeds(VLLMAgent(engine, seed=5), 4, first_wave=4) == whole[4:]
    assert seeds(VLLMAgent(engine, seed=6), 8) != whole
    agent = VLLMAgent(engine, seed=5)
    seeds(agent, 8)
    agent._turn += 1  # as generate() does after each turn
    assert [agent.request_seed(row) for row in range(8)] != whole
    with pytest.raises(ValueError, match="first_row must be >= 0"):
        VLLMAgent(engine, first_row=-1)
