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


def _write_on_rank(rank: int, folder: str, port: int) -> None:
    """Rank ``rank`` of a two-process gloo group writes its own weight-free folder, and the policy's own folder."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        policy = load_policy(ModelConfig(name="tiny", tiny_layers=1, tiny_hidden=48, tiny_heads=2, tiny_head_dim=32,
                                         tiny_arch="qwen2"))
        write_model_folder(policy, f"{folder}/bare{rank}", weights=False)
        policy.save_pretrained(f"{folder}/whole{rank}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_every_rank_writes_its_own_weight_free_folder(tmp_path):
    """Each data-parallel rank's engine loads a folder of its own. transformers writes a model's folder on rank
    0 alone (rank 1's engine found no config.json); the weight-free folder (the engine takes the weights at
    its first sync) is written whatever the rank: config as vLLM reads it, generation config, tokenizer."""
    import torch.multiprocessing as mp

    from tests.agents.training.torchrun import free_port

    mp.spawn(_write_on_rank, args=(str(tmp_path), free_port()), nprocs=2)
    assert not (tmp_path / "whole1" / "config.json").exists()  # why: transformers' rank-0 write
    whole = vllm_config(json.loads((tmp_path / "whole0" / "config.json").read_text()))
    assert whole["model_type"] == "llama"  # the wide-headed Qwen2, as vLLM reads it
    for rank in (0, 1):
        bare = tmp_path / f"bare{rank}"
        assert json.loads((bare / "config.json").read_text()) == whole
        assert (bare / "generation_config.json").is_file() and (bare / "tokenizer.json").is_file()
        assert not list(bare.glob("*.safetensors"))
