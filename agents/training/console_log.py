"""What a run says on stderr while it trains, for a person watching a terminal or reading a log file.

At a terminal the trainer draws a progress bar. Off a terminal (``nohup``, CI, a job scheduler) a bar
would be a flood of redraws, so none is drawn, and :class:`ConsoleProgress` prints a plain line every
``run.print_every`` steps instead (step, reward, EM, searches, failed searches, tokens/s, elapsed and
estimated time left). Either way each held-out evaluation prints one line (stage and EM per mode), and
warnings go through :func:`say`, which writes beside a drawn bar without breaking it.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from agents.training.callbacks import Callback
from search_env.console import progress_enabled
from search_env.progress_lines import format_duration

if TYPE_CHECKING:
    from agents.training.evaluation import EvalResult
    from agents.training.trainer import Trainer

__all__ = ["ConsoleProgress", "bar_drawn", "format_duration", "quiet_transformers", "say"]


def say(line: str) -> None:
    """Print ``line`` on stderr (through tqdm when it is installed, so that a drawn bar stays whole)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        print(line, file=sys.stderr, flush=True)
        return
    tqdm.write(line, file=sys.stderr)


def bar_drawn(show: bool | None) -> bool:
    """Whether the trainer's progress bar is drawn (``run.progress``, see
    :func:`search_env.console.progress_enabled`; tqdm installed)."""
    if not progress_enabled(show):
        return False
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def quiet_transformers(show: bool | None) -> Iterator[None]:
    """Within the block, transformers draws no progress bars of its own (writing model shards,
    de-quantising a GGUF model ...) when the run draws none (``run.progress``): in a log file each
    redraw would be a line. The previous setting is restored afterwards."""
    if progress_enabled(show):
        yield
        return
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


class ConsoleProgress(Callback):
    """Plain progress lines without a bar (every ``run.print_every`` steps) and one line per evaluation."""

    every = 0  #: ``run.print_every`` without a bar, read when a run starts (0: no progress lines)

    def on_run_start(self, trainer: Trainer) -> None:
        run = trainer.config.run
        self.every = 0 if bar_drawn(run.progress) else run.print_every
        self.started, self.done, self.step_seconds = time.monotonic(), 0, 0.0

    def on_update(self, trainer: Trainer, metrics: Mapping[str, Any]) -> None:
        if self.every <= 0:
            return
        self.done += 1
        self.step_seconds += float(metrics.get("time/step", 0.0))
        if trainer.step % self.every:
            return
        steps = trainer.config.run.steps
        left = self.step_seconds / self.done * (steps - trainer.step)  # at the training steps' pace (evaluations aside)
        say(f"step {trainer.step}/{steps}  reward {metrics.get('reward', 0.0):.3f}  em {metrics.get('em', 0.0):.3f}  "
            f"searches {metrics.get('searches', 0.0):.2f}  failed {metrics.get('searches/failed', 0.0):.2f}  "
            f"tokens/s {metrics.get('tokens_per_s', 0.0):.0f}  elapsed {format_duration(time.monotonic() - self.started)}  "
            f"left {format_duration(left)}")

    def on_evaluation(self, trainer: Trainer, stage: str | None, results: Mapping[str, EvalResult]) -> None:
        if not results:
            return
        modes = "  ".join(f"{mode} em {r.em:.3f}" for mode, r in results.items())
        say(f"eval {stage} (step {trainer.step}): {modes}" if stage else f"eval (step {trainer.step}): {modes}")
