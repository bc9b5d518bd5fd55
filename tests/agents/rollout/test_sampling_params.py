"""One sampling-parameters value (:class:`~agents.rollout.agent.SamplingParams`) for the agents that decode: the
HF sampler and the vLLM agents (in-process and server) carry it and check it in one place."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from agents.rollout.agent import SamplingParams


def test_out_of_range_values_fail_in_one_line_and_the_rest_are_normalised():
    for bad, message in (({"temperature": 0.0}, "temperature must be > 0"), ({"top_p": 1.5}, r"top_p must lie in \(0, 1\]"),
                         ({"first_row": -1}, "first_row must be >= 0")):
        with pytest.raises(ValueError, match=f"^{message}"):
            SamplingParams(**bad)
    params = SamplingParams(temperature=1, top_p=1, greedy=0, seed=7.0, first_row=2)
    assert (params.temperature, params.top_p, params.greedy, params.seed) == (1.0, 1.0, False, 7)
    assert type(params.temperature) is float and type(params.seed) is int and type(params.greedy) is bool


def test_a_vllm_request_asks_greedy_decoding_as_temperature_0_and_no_nucleus():
    assert SamplingParams(0.7, 0.9).requested() == (0.7, 0.9)
    assert SamplingParams(0.7, 0.9, greedy=True).requested() == (0.0, 1.0)


def test_the_hf_sampler_and_both_vllm_agents_share_the_value():
    pytest.importorskip("transformers")
    from agents.rollout.hf_sampler import HFSampler
    from agents.rollout.vllm_engine import VLLMAgent
    from agents.rollout.vllm_server_engine import ServerAgent
    from search_env.tokenization import as_codec
    from tests.agents.rollout.test_collect import biased_policy

    expected = SamplingParams(0.5, 0.8, False, 3, 4)
    sampler = HFSampler(biased_policy(as_codec(None), "search-r1", seed=9), temperature=0.5, top_p=0.8, seed=3, first_row=4)
    engine = SimpleNamespace(codec=None, version=0)
    agents = [sampler, VLLMAgent(engine, temperature=0.5, top_p=0.8, seed=3, first_row=4),
              ServerAgent(engine, temperature=0.5, top_p=0.8, seed=3, first_row=4)]
    assert [agent.sampling for agent in agents] == [expected] * 3
    with pytest.raises(ValueError, match="^temperature must be > 0"):
        VLLMAgent(engine, temperature=0.0)
