"""Plain progress lines for long work off a terminal, where no progress bar is drawn.

Why: a bar is drawn only on a terminal (see :mod:`search_env.console`), so under ``nohup``, Slurm or CI
encoding a corpus for a dense index was silent for minutes: the log could not tell a slow build from a
hung one. :func:`progress_meter` gives the bar where one is drawn and otherwise a :class:`ProgressLines`,
which prints a line such as::

    encoding passages: 3000/13800 (22%), 41s, ~2m28s left

at most every :data:`LINE_INTERVAL_S` seconds (never for work that ends sooner), and a last line when
the work ends if it printed any. The training side prints its own progress lines the same way
(``agents.training.console_log``); this module is what ``search_env`` uses, since ``search_env``
imports nothing of ``agents``.
"""
from __future__ import annotations

import importlib.util
import sys
import time
from typing import Any, Callable, TextIO

from search_env.console import progress, progress_enabled

__all__ = ["LINE_INTERVAL_S", "ProgressLines", "format_duration", "progress_meter"]

LINE_INTERVAL_S = 10.0
"""Seconds between two progress lines: often enough that a log shows the work moving, seldom enough
that an hour's build writes a few hundred lines, not thousands."""


def format_duration(seconds: float) -> str:
    """``1h02m``, ``3m05s`` or ``42s``."""
    seconds = max(int(round(seconds)), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class ProgressLines:
    """Counts work done out of ``total`` and prints ``desc: done/total (pct%), elapsed, ~left`` lines.

    Args:
        total: units of work in all.
        desc: what is being done, at the start of each line.
        interval_s: least time between two lines (the first comes ``interval_s`` after the start).
        stream: where lines go; None: ``sys.stderr`` as it is when a line is written.
        clock: seconds on a monotonic clock (tests give their own).

    The interface is the part of tqdm's that the callers use: ``update(n)``, ``close()`` and use as a
    context manager, so the same code drives a bar or these lines.
    """

    def __init__(
        self, total: int, desc: str, *, interval_s: float = LINE_INTERVAL_S, stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.desc, self.interval_s = total, desc, interval_s
        self._stream, self._clock = stream, clock
        self.done = 0
        self._started = self._last_line = clock()
        self._printed = 0  # ``done`` at the last line printed (0: none yet)
        self.lines = 0  #: lines printed so far

    def update(self, n: int = 1) -> None:
        """Count ``n`` more units done; print a line if ``interval_s`` has passed since the last one."""
        self.done += n
        now = self._clock()
        if now - self._last_line >= self.interval_s:
            self._print(now)

    def close(self) -> None:
        """Print the count reached, if lines were printed and it has grown since the last one."""
        if self.lines and self.done > self._printed:
            self._print(self._clock())

    def __enter__(self) -> "ProgressLines":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _print(self, now: float) -> None:
        elapsed = now - self._started
        share = self.done / self.total if self.total else 1.0
        line = f"{self.desc}: {self.done}/{self.total} ({share:.0%}), {format_duration(elapsed)}"
        if 0 < self.done < self.total:
            line += f", ~{format_duration(elapsed / self.done * (self.total - self.done))} left"
        print(line, file=self._stream or sys.stderr, flush=True)
        self._last_line, self._printed = now, self.done
        self.lines += 1


def progress_meter(*, total: int, desc: str, show: bool | None = None, **tqdm_kwargs: Any) -> Any:
    """A tqdm bar where :func:`~search_env.console.progress_enabled` says to draw one and tqdm is
    installed, else :class:`ProgressLines`; either takes ``update(n)`` and ``close()`` and is a
    context manager. ``tqdm_kwargs`` (``unit``, ``leave`` ...) go to the bar."""
    if progress_enabled(show) and importlib.util.find_spec("tqdm") is not None:
        return progress(total=total, desc=desc, show=True, **tqdm_kwargs)
    return ProgressLines(total, desc, interval_s=LINE_INTERVAL_S)
