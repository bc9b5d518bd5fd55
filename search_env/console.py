"""What the command-line tools show a person at a terminal, and only there.

Progress bars redraw many times a second; written to a log file or a CI console (stderr not a
terminal) each redraw becomes a line, and a corpus encoding floods the log with thousands of them.
:func:`progress` therefore draws a tqdm bar only when stderr is a terminal, unless the caller or the
``SEARCHQA_PROGRESS`` environment variable (``1``/``0``) says otherwise, and stays silent when tqdm
is not installed (it comes with the ``dense`` and ``agents`` extras, not the core install).

:class:`HelpFormatter` is the ``--help`` layout of every command: the module docstring as written but
without its Sphinx and reStructuredText markup (:func:`plain_text`), and each option's default.
:class:`CommandParser` ends a usage error with one line, naming the nearest option of a mistyped one.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from typing import Any, Iterable, Iterator, NoReturn, TypeVar

__all__ = ["PROGRESS_ENV", "CommandParser", "HelpFormatter", "nearest_flags", "plain_text", "progress", "progress_enabled"]

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


#: Sphinx roles (``:class:`~a.b.C```, ``:mod:`a.b```, ``:func:`x <a.b.x>```), inline literals and strong emphasis.
_ROLE = re.compile(r":[a-z]+:`(~?)([^`<]*?)\s*(?:<[^`>]*>)?`")
_LITERAL = re.compile(r"``(.*?)``")
_STRONG = re.compile(r"\*\*(\S(?:.*?\S)?)\*\*")


def plain_text(text: str) -> str:
    """``text`` without the markup the docstrings hold for the API documentation, as a terminal shows it:
    a role keeps its text (``:class:`~a.b.C``` is ``C``, ``:mod:`a.b``` is ``a.b``), a literal and a
    strong emphasis their content."""
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    return _STRONG.sub(r"\1", _LITERAL.sub(r"\1", text))


def nearest_flags(message: str, flags: Iterable[str]) -> str:
    """``message`` (an argument parser's error) with "did you mean --x?" for each unrecognised flag in it
    that is close to one of ``flags``."""
    known = [flag for flag in flags if flag.startswith("--")]
    hints = []
    for flag in re.findall(r"(--[\w.+-]+)", message.partition("nrecognized arguments")[2]):
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
        if close:
            hints.append(f"{flag}: did you mean {close[0]}?")
    return message if not hints else f"{message} ({'; '.join(hints)})"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``--help`` with the description as written (line breaks kept) and every option's default, the
    description and the options' help without markup (:func:`plain_text`). Flags (which default to off)
    and options whose default is None (their help says what unset means) show no ``(default: ...)``."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.nargs == 0 or action.default is None:
            return None if action.help is None else plain_text(action.help)
        text = super()._get_help_string(action)
        return None if text is None else plain_text(text)

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose usage error is one line on stderr (exit status 2): the error, the nearest
    known option of a mistyped one, and where the options are listed - not the whole usage, which for a
    command of many options buries the error."""

    def error(self, message: str) -> NoReturn:
        flags = [flag for action in self._actions for flag in action.option_strings]
        self.exit(2, f"{self.prog}: error: {' '.join(nearest_flags(message, flags).split())} "
                     f"({self.prog} --help lists the options)\n")
