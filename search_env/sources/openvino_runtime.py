"""Running a transformers encoder on the CPU with OpenVINO: the backend that makes a lone query fast.

Why a second runtime: PyTorch runs a one-query MiniLM encode on one core only (splitting its small
matrix products over two OpenMP threads gained nothing on a 2-core machine), while OpenVINO spreads
each inference over its own thread pool and fuses the layer's small operations, so a lone query is
encoded faster, directly and through the retrieval server (figures in ``benchmarks/RESULTS.md``).

The model is converted straight from the loaded PyTorch module (no ONNX file), with pooling and
L2 normalisation inside the converted graph, and compiled for dynamic batch and sequence length.

Compiling is guarded by :func:`_signal_stack_kept`: OpenVINO's CPU plugin (2026.4 on Linux) gives the
compiling thread an alternate signal stack of its own per compiled model and, when models are not
freed in the reverse of the order they were made (freed first-made first, say), can leave the thread
on one that is already freed. The next signal delivered on that stack (a Ctrl-C in the trainer,
after the dense tests in the same process) killed the process with a segmentation fault.
"""
from __future__ import annotations

import ctypes
import importlib.util
import sys
import threading
import warnings
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Literal

import numpy as np

from search_env._optional import requires_extra

if TYPE_CHECKING:
    import torch

__all__ = ["OpenVINOModel", "openvino_available"]

#: Our precision names -> OpenVINO's inference precision hint.
PRECISION_HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


def openvino_available() -> bool:
    """Whether the ``openvino`` package is installed (checked without importing it)."""
    return importlib.util.find_spec("openvino") is not None


class _SignalStack(ctypes.Structure):
    """Linux's ``stack_t``."""

    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def _signal_stack() -> tuple[int | None, int, int] | None:
    """The calling thread's alternate signal stack (address, flags, size); ``None`` off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    current = _SignalStack()
    if ctypes.CDLL(None).sigaltstack(None, ctypes.byref(current)) != 0:
        return None
    return current.ss_sp, current.ss_flags, current.ss_size


@contextmanager
def _signal_stack_kept() -> Iterator[None]:
    """Put the calling thread's alternate signal stack back as it was on entry (see the module docstring)."""
    before = _signal_stack()
    try:
        yield
    finally:
        if before is not None and _signal_stack() != before:
            address, flags, size = before
            ctypes.CDLL(None).sigaltstack(ctypes.byref(_SignalStack(address, flags & ~1, size)), None)  # SS_ONSTACK is read-only


def _pooled_module(model: "torch.nn.Module", pooling: Literal["mean", "cls"]) -> "torch.nn.Module":
    """``model`` followed by mean or CLS pooling and L2 normalisation, as one module to convert."""
    with requires_extra("dense", "dense retrieval"):
        import torch

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.float()
            if pooling == "cls":
                pooled = hidden[:, 0]
            else:
                weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
            return torch.nn.functional.normalize(pooled, p=2, dim=-1)

    return Pooled().eval()


class OpenVINOModel:
    """A transformers encoder converted to OpenVINO and compiled for the CPU.

    Calling it with padded ``input_ids`` and ``attention_mask`` (int64 arrays of shape (n, width))
    returns the pooled, normalised float32 embeddings (n, dim). Thread-safe: each calling thread
    gets its own inference request on the shared compiled model.

    Args:
        model: the loaded PyTorch model, float32 weights (OpenVINO lowers precision itself).
        pooling: "mean" or "cls".
        precision: "fp32", "bf16" or "fp16" (the last needs a CPU with native float16).
        threads: CPU threads for one inference; the latency hint runs a single inference on all
            of them.
    """

    def __init__(self, model: "torch.nn.Module", *, pooling: Literal["mean", "cls"], precision: str, threads: int) -> None:
        with requires_extra("dense", "the OpenVINO encoder backend"):
            import openvino as ov
            import torch

        if precision not in PRECISION_HINTS:
            raise ValueError(f"precision must be one of {sorted(PRECISION_HINTS)}, got {precision!r}")
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        example = {"input_ids": torch.ones(2, 8, dtype=torch.long), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
        with warnings.catch_warnings():  # tracing warns about data-dependent branches it handles
            warnings.simplefilter("ignore")
            converted = ov.convert_model(_pooled_module(model, pooling), example_input=example)
        config = {
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": threads,
            "INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision],
        }
        with _signal_stack_kept():
            self._compiled: Any = ov.Core().compile_model(converted, "CPU", config)
        self.threads = threads
        self._local = threading.local()

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self._compiled.create_infer_request()
        outputs = request.infer({"input_ids": input_ids, "attention_mask": attention_mask})
        return np.array(outputs[0], dtype=np.float32)  # a copy: the request reuses its output buffer
