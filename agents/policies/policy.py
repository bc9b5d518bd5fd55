"""The policy the learners train: a ``transformers`` causal LM over the environment's tokenizer.

Per-token outputs are *token-aligned* with ``input_ids`` (B, T): entry ``[b, t]`` belongs to token ``t``
and is computed from the tokens before it (the logits at ``t - 1``), so column 0 is 0. Log-probs and
entropy are those of the tempered distribution ``softmax(logits / temperature)`` over the tokenizer's
ids: the distribution the sampler draws from (before any top-p cut), so importance ratios compare like
with like. Padding may be on either side as long as ``position_ids`` count real tokens only
(:func:`position_ids_from_mask`); a padded row then gets the log-probs it gets alone.
"""
from __future__ import annotations

import inspect
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from search_env.tokenization import TokenCodec, as_codec

__all__ = ["ADAPTER_DIR", "HFPolicy", "PolicyOutput", "ValueModel", "merged_state_dict", "position_ids_from_mask", "token_aligned"]


@dataclass
class PolicyOutput:
    """What one forward pass gives the learner; every tensor is (B, T), token-aligned, with grad."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count real tokens only (left or right padding): ``cumsum(mask) - 1``, clamped at 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_aligned(predictions: torch.Tensor) -> torch.Tensor:
    """(B, T) from (B, T - 1) values computed at positions ``0..T-2`` (each about the next token): entry
    ``t`` holds position ``t - 1``'s, column 0 is 0."""
    return torch.cat([predictions.new_zeros(predictions.shape[0], 1), predictions], dim=1)


class HFPolicy(nn.Module):
    """A causal LM with the codec of its tokenizer, and an optional value head (PPO with a shared trunk).

    Args:
        model: any ``transformers`` causal LM whose embedding covers the tokenizer's ids.
        codec: the environment's :class:`~search_env.tokenization.TokenCodec`, or anything
            :func:`~search_env.tokenization.as_codec` takes (a tokenizer object or path; ``None`` for
            the built-in tokenizer). Logits are cut to its ``vocab_size`` (ids past it, padding rows of
            the embedding, are never sampled and carry no probability).
        value_head: add ``value_head = nn.Linear(hidden, 1)`` on the last hidden state (zero-initialised,
            so the critic starts as a zero baseline).

    ``policy.parameters()`` covers the LM and the value head; ``policy.model`` is the LM itself, or the
    peft model wrapping it when it carries LoRA adapters (:func:`agents.policies.loading.add_lora`), whose
    frozen base is then the reference policy (:meth:`adapters_off`); ``policy.lm`` is the transformers
    model in both cases.
    """

    def __init__(self, model: nn.Module, codec: Any = None, *, value_head: bool = False) -> None:
        super().__init__()
        self.model = model
        self.codec: TokenCodec = as_codec(codec)
        rows = model.get_input_embeddings().num_embeddings
        if self.codec.vocab_size > rows:
            raise ValueError(f"the tokenizer has {self.codec.vocab_size} ids but the model's embedding only {rows} rows")
        self.vocab_size = self.codec.vocab_size
        # Models that cannot skip positions in their LM head get full logits, cut here instead (a peft
        # wrapper passes the argument on to the model it wraps).
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.lm.forward).parameters
        self.value_head: nn.Linear | None = None
        if value_head:
            self.value_head = nn.Linear(model.config.hidden_size, 1)
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)

    @property
    def lm(self) -> nn.Module:
        """The transformers causal LM: ``model`` itself, or the one a peft wrapper adapts (its adapted
        layers in place)."""
        return self.model.get_base_model() if self.has_adapters else self.model

    @property
    def has_adapters(self) -> bool:
        """Whether ``model`` is a peft model (LoRA adapters trained on a frozen base)."""
        return hasattr(self.model, "disable_adapter") and hasattr(self.model, "get_base_model")

    @contextmanager
    def adapters_off(self) -> Iterator[None]:
        """Within the block the policy is its frozen base model: a LoRA run's reference policy, without
        a second copy of the weights."""
        if not self.has_adapters:
            raise ValueError("this policy has no adapters to switch off (model.lora_rank is 0)")
        with self.model.disable_adapter():
            yield

    def named_weights(self, *, adapters: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """The LM's weights by name as a loader of the model reads them, for an engine that keeps a copy
        (vLLM): the transformers model's state-dict names; with LoRA adapters, the frozen base model's
        weights under those plain names (peft's ``base_layer`` dropped, adapters left out), or with
        ``adapters=True`` the adapters alone under peft's names (what ``PeftModel.save_pretrained(...,
        state_dict=...)`` writes). The tensors are the module's own (parameters, not copies: a ZeRO-3
        engine's hold their shard only, see :meth:`TrainingBackend.rollout_weights
        <agents.training.backends.base.TrainingBackend.rollout_weights>`); the value head is not the LM's."""
        if adapters:
            if not self.has_adapters:
                raise ValueError("this policy has no adapters (model.lora_rank is 0)")
            for name, tensor in self.model.state_dict(keep_vars=True).items():
                if ".lora_" in name:
                    yield name, tensor
            return
        for name, tensor in self.lm.state_dict(keep_vars=True).items():
            if not self.has_adapters:
                yield name, tensor
            elif ".lora_" not in name:
                yield name.replace(".base_layer.", "."), tensor

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        """Recompute each layer's activations in the backward pass instead of keeping them (Hugging Face's
        non-reentrant gradient checkpointing, which also lets gradients reach adapters over a frozen
        embedding). Active in training mode only: rollouts in evaluation mode keep their KV cache."""
        lm = self.lm
        renamed = hasattr(lm, "activation_checkpointing_enable")  # the name transformers 5.24 gave it
        if not enabled:
            lm.activation_checkpointing_disable() if renamed else lm.gradient_checkpointing_disable()
        elif renamed:
            lm.activation_checkpointing_enable({"use_reentrant": False})
        else:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        with_values: bool = False,
        from_column: int = 0,
    ) -> PolicyOutput:
        """Token-aligned log-probs of ``input_ids`` (and entropy, values) at ``temperature``.

        ``position_ids`` defaults to :func:`position_ids_from_mask`. Entries are 0 on padding and on a row's
        first real token (nothing precedes it). ``from_column > 0`` computes log-probs and entropy only for
        columns ``from_column`` and later (earlier ones are 0; values are unaffected): the learner needs
        them on trained tokens only, and with a long prompt and a large vocabulary the LM head over the
        prompt's positions is most of a forward pass (the model's ``logits_to_keep`` skips it).
        """
        if with_values and self.value_head is None:
            raise ValueError("with_values=True needs HFPolicy(..., value_head=True)")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (greedy decoding has no log-probs), got {temperature}")
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask)
        width = input_ids.shape[1]
        first = min(max(from_column, 1), max(width - 1, 1))  # column 0 never has a log-prob
        keep = width - first + 1  # positions first-1 .. width-1
        kept = {"logits_to_keep": keep} if first > 1 and self._keeps_logits else {}
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            output_hidden_states=with_values, use_cache=False, **kept,
        )
        logits = out.logits[:, -keep:-1, : self.vocab_size].float() / temperature  # predicts columns first .. width-1
        lse = torch.logsumexp(logits, dim=-1)
        chosen = logits.gather(-1, input_ids[:, first:, None]).squeeze(-1)
        # A token has a log-prob when it and the token before it are real (so column 0 and the first
        # token of a left-padded row get 0, as they do alone).
        real = attention_mask.bool()
        real = real & token_aligned(real[:, :-1])
        if from_column >= width:  # nothing asked for (the head still ran on one position)
            real = torch.zeros_like(real)
        logprobs = torch.where(real, _from_column(chosen - lse, first), 0.0)
        entropy = values = None
        if with_entropy:
            probs = torch.softmax(logits, dim=-1)
            entropy = torch.where(real, _from_column(lse - (probs * logits).sum(-1), first), 0.0)
        if with_values:
            hidden = out.hidden_states[-1]
            hidden = hidden[:, :-1].to(self.value_head.weight.dtype)
            values = torch.where(real, token_aligned(self.value_head(hidden).squeeze(-1).float()), 0.0)
        return PolicyOutput(logprobs, entropy, values)


    def save_pretrained(self, directory: str | os.PathLike[str], *, merge_adapters: bool = True) -> Path:
        """Write the LM as a standard transformers model folder (weights, config, tokenizer), which
        :func:`agents.policies.loading.load_policy`, the evaluation harness and any Hugging Face tool load.
        The value head, a training device, is not part of it. Returns the folder.

        With LoRA adapters the folder holds the model with the adapters merged into its weights (so every
        tool loads the trained policy as it is), and ``adapter/`` inside it the adapters alone, in peft's
        format (``PeftModel.from_pretrained(base_model, folder / "adapter")``); the policy itself is left
        unmerged. ``merge_adapters=False`` writes the frozen base's weights instead, for an engine that
        applies the adapters itself (vLLM's LoRA support)."""
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        if self.has_adapters:
            weights = (merged_state_dict(self.model) if merge_adapters
                       else {name: tensor.detach() for name, tensor in self.named_weights()})
            self.lm.save_pretrained(target, state_dict=weights)
            self.model.save_pretrained(target / ADAPTER_DIR)
        else:
            self.model.save_pretrained(target)
        tokenizer = self.codec.tokenizer
        if not hasattr(tokenizer, "save_pretrained"):  # a bare ``tokenizers.Tokenizer`` (the built-in one)
            from transformers import PreTrainedTokenizerFast

            eos = tokenizer.id_to_token(min(self.codec.eos_ids))
            tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos,
                                                pad_token=tokenizer.id_to_token(self.codec.pad_id))
        tokenizer.save_pretrained(target)
        return target


#: Where :meth:`HFPolicy.save_pretrained` puts a LoRA policy's adapters, inside the model folder.
ADAPTER_DIR = "adapter"


def merged_state_dict(peft_model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapted model's weights with each LoRA adapter folded into the weight it adapts (``W + (alpha /
    r) B A``, peft's merge), under the plain model's key names; the peft model is not changed (merging it
    in place and back would leave rounding in the frozen base)."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    adapter = peft_model.active_adapter
    merged: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            weight = module.get_base_layer().weight
            # In the adapters' own precision even when called under a bf16 autocast (a run's export).
            with torch.no_grad(), torch.autocast(weight.device.type, enabled=False):
                merged[f"{name}.weight"] = weight + module.get_delta_weight(adapter).to(weight.dtype)
    out: dict[str, torch.Tensor] = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        out[key] = merged.get(key, value)
    return out


def _from_column(predictions: torch.Tensor, first: int) -> torch.Tensor:
    """(B, T) from (B, T - first) values for columns ``first..T-1``; earlier columns are 0."""
    return torch.cat([predictions.new_zeros(predictions.shape[0], first), predictions], dim=1)


class ValueModel(nn.Module):
    """A separate critic: a causal LM's transformer trunk (its LM head dropped) and a linear value head.

    Pass a copy of the policy's LM (``copy.deepcopy(policy.model)``) or another checkpoint; the head is
    zero-initialised. :meth:`values` is token-aligned like :class:`HFPolicy`'s outputs.
    """

    def __init__(self, backbone_lm: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone_lm.base_model
        self.value_head = nn.Linear(backbone_lm.config.hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) values: entry ``t`` is the value of the state before token ``t`` (0 where the policy's log-probs are 0)."""
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask)
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False).last_hidden_state
        per_position = self.value_head(hidden[:, :-1].to(self.value_head.weight.dtype)).squeeze(-1).float()
        real = attention_mask.bool()
        return torch.where(real & token_aligned(real[:, :-1]), token_aligned(per_position), 0.0)

    forward = values
