"""Thread pools forgotten in a forked child, where their threads do not exist.

``fork`` copies a process with one thread. An object that started worker threads in the parent (a
``ThreadPoolExecutor``, a sender thread) still holds them in the child, where submitting to them waits
forever. Such an object registers a function that drops them; it runs in every forked child (e.g. the
:class:`~search_env.worker.EnvWorker` process), so the object starts fresh threads there on first use.
"""
from __future__ import annotations

import os
import weakref
from typing import Any, Callable

__all__ = ["forget_threads_after_fork"]

_resets: weakref.WeakKeyDictionary[Any, Callable[[Any], None]] = weakref.WeakKeyDictionary()


def forget_threads_after_fork(owner: Any, reset: Callable[[Any], None]) -> None:
    """Call ``reset(owner)`` in each process forked from this one while ``owner`` lives (held weakly)."""
    _resets[owner] = reset


def _reset_all() -> None:
    for owner, reset in list(_resets.items()):
        reset(owner)


if hasattr(os, "register_at_fork"):  # not on Windows, which cannot fork
    os.register_at_fork(after_in_child=_reset_all)
