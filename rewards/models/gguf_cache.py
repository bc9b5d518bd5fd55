"""A gguf model converted once per machine: its tokenizer and de-quantised weights kept as a plain folder.

Why: ``transformers`` rebuilds a gguf file's tokenizer from its vocabulary and merges, and de-quantises its
weights tensor by tensor in numpy, on every load: about 20 s for SmolLM2-135M's tokenizer and 40 s for its
weights on one CPU core, in every process that loads it (a run's ranks, a vLLM engine's, each evaluation).
Saved once with ``save_pretrained``, the same tokenizer and the same float32 weights (the values the
de-quantisation produced) load in about a second.

Where: ``$SEARCHQA_GYM_CACHE`` (default ``~/.cache/searchqa_gym``), under
``gguf/<file stem>-<key>/tokenizer`` and ``.../model``; the key is the gguf file's sha256 with the
``transformers`` version (another version may convert differently). Each part is written to a temporary
folder and renamed into place, so processes converting at once never read half a copy.
``SEARCHQA_GYM_CACHE=off`` converts in memory on every load instead, as does a cache folder that cannot be
written.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["CACHE_ENV", "cache_root", "gguf_cache_folder", "load_gguf_model", "load_gguf_tokenizer"]

#: The environment variable naming the cache folder (``off``: no cache).
CACHE_ENV = "SEARCHQA_GYM_CACHE"
_HASH_CHUNK = 1 << 20


def cache_root() -> Path | None:
    """The cache folder (``$SEARCHQA_GYM_CACHE``, default ``~/.cache/searchqa_gym``), or ``None`` when it is ``off``."""
    value = os.environ.get(CACHE_ENV, "")
    if value.strip().lower() == "off":
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "searchqa_gym"


def gguf_cache_folder(path: Path) -> Path | None:
    """Where the converted copy of the gguf file ``path`` lives (whether written yet or not), or ``None``
    with the cache off."""
    root = cache_root()
    if root is None:
        return None
    import transformers

    stat = path.stat()
    key = _file_key(str(path), stat.st_size, stat.st_mtime_ns, transformers.__version__)
    return root / "gguf" / f"{path.stem}-{key}"


@functools.lru_cache(maxsize=8)
def _file_key(path: str, size: int, mtime_ns: int, transformers_version: str) -> str:
    """The copy's key: the file's sha256 with the transformers version, hashed once per process while the
    file's size and modification time stay (a tokenizer and a model load read the same file)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_HASH_CHUNK):
            digest.update(chunk)
    digest.update(f"transformers {transformers_version}".encode())
    return digest.hexdigest()[:16]


def load_gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer of the gguf file ``path``: from its converted copy, converted first if there is none."""
    from transformers import AutoTokenizer

    def convert() -> PreTrainedTokenizerBase:
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)

    folder = _converted(path, "tokenizer", convert)
    return convert() if folder is None else AutoTokenizer.from_pretrained(folder)


def load_gguf_model(path: Path, *, dtype: torch.dtype | str | None = None) -> PreTrainedModel:
    """The causal LM of the gguf file ``path`` in ``dtype`` (default float32), de-quantised once: from its
    converted copy (float32), converted first if there is none. The model is a plain one (no quantizer left
    on it), so it saves like any other."""
    import torch
    from transformers import AutoModelForCausalLM

    def convert() -> PreTrainedModel:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        # transformers refuses to save a model it still marks as gguf-quantised: the values are plain now.
        model.hf_quantizer = None
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
        return model

    folder = _converted(path, "model", convert)
    if dtype is None or dtype == "auto":  # the converted copy's own
        dtype = torch.float32
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return convert().to(dtype) if folder is None else AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)


def _converted(path: Path, part: str, convert: Any) -> Path | None:
    """The folder of ``part`` of ``path``'s converted copy, written by ``convert()``'s ``save_pretrained`` when
    missing (into a temporary folder beside it, renamed into place; another process's copy, renamed first,
    is kept). ``None`` with the cache off or not writable."""
    base = gguf_cache_folder(path)
    if base is None:
        return None
    folder = base / part
    if folder.is_dir():
        return folder
    try:
        base.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{part}-", dir=base))
    except OSError:  # a cache folder that cannot be written (read-only home): convert in memory, as with off
        return None
    try:
        convert().save_pretrained(scratch)
        os.replace(scratch, folder)
    except OSError:
        if not folder.is_dir():  # not another process's copy that got there first
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder
