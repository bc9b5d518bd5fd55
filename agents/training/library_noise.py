"""Lines other libraries print that say nothing to the person running a training command, kept off the console.

Each filter is narrow - one logger's one message, or one warning's message and category - so that anything
else those libraries say still shows:

* DeepSpeed's "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect
  it." It is logged when ``deepspeed`` is first imported on a machine without CUDA, and ``deepspeed`` is
  imported by every run, not only the DeepSpeed backend's: ``accelerate`` (which transformers calls to
  unwrap a model as it saves one, i.e. at the policy's export) imports it whenever it is installed. The
  run's first line already says which device it trains on (:mod:`agents.training.devices`).
* torch's ``FutureWarning`` that ``torch.distributed.all_gather_into_tensor`` is deprecated, raised by
  DeepSpeed's ZeRO collectives on every gather (a multi-rank run printed hundreds of them).
"""
from __future__ import annotations

import logging
import warnings

__all__ = ["DEEPSPEED_CPU_NOTICE", "hide_deepspeed_cpu_notice", "ignore_deprecated_collective_warnings"]

#: The start of DeepSpeed's notice that it picked the CPU.
DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU"


class _DropMessage(logging.Filter):
    """Drops the records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def hide_deepspeed_cpu_notice() -> None:
    """Keep DeepSpeed's CPU-accelerator notice (module docstring) off the console, from now on; before or
    after ``deepspeed`` is imported (its logger keeps the filters of the logger object it takes over)."""
    logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _DropMessage) and f.prefix == DEEPSPEED_CPU_NOTICE for f in logger.filters):
        logger.addFilter(_DropMessage(DEEPSPEED_CPU_NOTICE))


def ignore_deprecated_collective_warnings() -> None:
    """Ignore torch's deprecation warning for ``all_gather_into_tensor``, which DeepSpeed calls (module
    docstring); other warnings of ``torch.distributed`` still show."""
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.all_gather_into_tensor` is deprecated",
                            category=FutureWarning, module=r"torch\.distributed")
