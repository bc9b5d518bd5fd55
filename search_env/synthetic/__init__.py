"""The built-in synthetic world and tokenizer: what ``gym.make("SearchQA-v0")`` runs on with no network,
no data and no model weights."""
from typing import Any

from search_env.synthetic.config import WorldConfig
from search_env.synthetic.world import SyntheticWorld, generate_world

__all__ = ["SyntheticWorld", "WorldConfig", "generate_world", "load_builtin_tokenizer", "train_tokenizer"]


def __getattr__(name: str) -> Any:
    # The tokenizer functions are loaded on first use: the world needs no `tokenizers`, and
    # `python -m search_env.synthetic.tokenizer` must not find its module already imported.
    if name in ("load_builtin_tokenizer", "train_tokenizer"):
        from search_env.synthetic import tokenizer

        return getattr(tokenizer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
