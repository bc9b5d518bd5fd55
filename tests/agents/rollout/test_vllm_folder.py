"""The config vLLM reads from an engine's model folder (the served log-probs are checked in the vLLM venv:
test_vllm_engine.py)."""
from __future__ import annotations

import json

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")

from agents.policies.config import ModelConfig  # noqa: E402
from agents.policies.loading import load_policy  # noqa: E402
from agents.rollout.vllm_folder import QWEN2_ONLY_FIELDS, vllm_config, write_model_folder  # noqa: E402


def test_a_qwen2_with_wide_heads_is_written_as_the_llama_with_query_key_value_biases(tmp_path):
    policy = load_policy(ModelConfig(name="tiny", tiny_layers=1, tiny_hidden=48, tiny_heads=2, tiny_head_dim=32, tiny_arch="qwen2"))
    written = json.loads((write_model_folder(policy, tmp_path) / "config.json").read_text())
    assert (written["model_type"], written["architectures"]) == ("llama", ["LlamaForCausalLM"])
    assert (written["head_dim"], written["hidden_size"], written["num_attention_heads"]) == (32, 48, 2)
    assert (written["qkv_bias"], written["attention_bias"], written["mlp_bias"]) == (True, False, False)
    assert not set(QWEN2_ONLY_FIELDS) & set(written)
    # the weights keep Qwen2's names: query/key/value biases, none on the output projection
    names = set(dict(policy.model.named_parameters()))
    assert any(n.endswith("q_proj.bias") for n in names) and not any(n.endswith("o_proj.bias") for n in names)


def test_models_vllm_reads_as_they_are_stay_as_they_are(tmp_path):
    natural = {"model_type": "qwen2", "hidden_size": 96, "num_attention_heads": 4, "head_dim": 24}
    assert vllm_config(natural) is natural
    assert vllm_config({"model_type": "qwen2", "hidden_size": 96, "num_attention_heads": 4}) == {
        "model_type": "qwen2", "hidden_size": 96, "num_attention_heads": 4}
    llama = {"model_type": "llama", "hidden_size": 96, "num_attention_heads": 4, "head_dim": 32}
    assert vllm_config(llama) is llama
    policy = load_policy(ModelConfig(name="tiny", tiny_layers=1, tiny_hidden=48, tiny_heads=2, tiny_head_dim=32))
    assert json.loads((write_model_folder(policy, tmp_path) / "config.json").read_text())["model_type"] == "llama"
