"""What the command-line tools show a person at a terminal, and only there.

Progress bars redraw many times a second; written to a log file or a CI console (stderr not a
terminal) each redraw becomes a line, and a corpus encoding floods the log with thousands of them.
:func:`progress` therefore draws a tqdm bar only when stderr is a terminal, unless the caller or the
``SEARCHQA_PROGRESS`` environment variable (``1``/``0``) says otherwise, and stays silent when tqdm
is not installed (it comes with the ``dense`` and ``agents`` extras, not the core install).

:class:`HelpFormatter` is the ``--help`` layout of every command: the module docstring as written,
and each option's default.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Iterable, Iterator, TypeVar

__all__ = ["PROGRESS_ENV", "HelpFormatter", "progress", "progress_enabled"]

PROGRESS_ENV = "SEARCHQA_PROGRESS"
"""Environment variable forcing progress bars on (``1``, ``true``, ``yes``, ``on``) or off (``0``,
``false``, ``no``, ``off``) whatever stderr is."""

_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off"})

T = TypeVar("T")


def progress_enabled(show: bool | None = None) -> bool:
    """Whether to draw progress bars: ``show`` when the caller decided; else ``$SEARCHQA_PROGRESS``
    when set; else only when stderr is a terminal."""
    if show is not None:
        return show
    setting = os.environ.get(PROGRESS_ENV, "").strip().lower()
    if setting in _ON:
        return True
    if setting in _OFF:
        return False
    if setting:
        raise ValueError(f"${PROGRESS_ENV} must be one of 1/0, true/false, yes/no, on/off; got {os.environ[PROGRESS_ENV]!r}")
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()


class _Silent:
    """The part of tqdm's interface our callers use, doing nothing: iterate, ``update``, ``close``,
    and use as a context manager."""

    def __init__(self, iterable: Iterable[Any] | None) -> None:
        self._iterable = iterable if iterable is not None else ()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._iterable)

    def update(self, n: float = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "_Silent":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def progress(iterable: Iterable[T] | None = None, *, show: bool | None = None, **tqdm_kwargs: Any) -> Any:
    """A tqdm bar over ``iterable`` (or a manual one with ``total=``) on stderr when
    :func:`progress_enabled` says so and tqdm is installed, else a silent stand-in with the same
    ``update``/``close``/``with``/iteration interface. ``tqdm_kwargs`` (``total``, ``desc``,
    ``unit``, ``leave``...) go to tqdm."""
    if not progress_enabled(show):
        return _Silent(iterable)
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Silent(iterable)
    return tqdm(iterable, file=sys.stderr, **tqdm_kwargs)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``--help`` with the description as written (line breaks kept) and every option's default.
    Flags (which default to off) and options whose default is None (their help says what unset
    means) show no ``(default: ...)``."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.nargs == 0 or action.default is None:
            return action.help
        return super()._get_help_string(action)
