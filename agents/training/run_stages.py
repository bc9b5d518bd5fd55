"""The stages of a run around its training steps, each safe to stop with Ctrl-C: the start, in parts a
checkpoint records - the ``"start"`` evaluation, the optional warm start, the evaluation after it
(:data:`~agents.training.run_state.START_PARTS`) - and the ``"final"`` evaluation.

:func:`run_start` takes a fresh run through all of them and a resumed one through those its checkpoint
does not hold. With a warm start a checkpoint is written before it (to come back to), every
``warm_start.save_every`` of its steps (a run stopped there goes on from that step,
:class:`~agents.training.warm_start.WarmStartProgress`) and after it, so a run stopped later never
redoes it. A Ctrl-C during the start stops cleanly: the run goes back to its last checkpoint (or, before
any, to its state when the start began), says in one line where it stopped and what ``run.resume``
does next, and the trainer ends with a checkpoint that ``run.resume`` continues. :func:`run_final` is
the evaluation at the last step; a Ctrl-C during it keeps the finished run and leaves the evaluation to
a resume.

The trainer (:meth:`~agents.training.trainer.Trainer.train`) calls them with its own steps as plain
callables, so the order of the parts and what a Ctrl-C in each leaves are read (and tested) here.
"""
from __future__ import annotations

from typing import Any, Callable

from agents.training.checkpoint import capture_rng, restore_rng
from agents.training.console_log import say
from agents.training.run_state import START_PARTS, RunState

__all__ = ["run_final", "run_start"]


def run_start(
    state: RunState,
    *,
    warm: bool,
    evaluate: Callable[[str, dict[str, float] | None], None],
    warm_start: Callable[[], dict[str, float]],
    save: Callable[[], Any],
    back_to_checkpoint: Callable[[], None],
) -> bool:
    """Take the run whose progress is ``state`` through the parts of its start not done yet (see the
    module docstring), marking each done in ``state`` as it ends; returns whether a Ctrl-C stopped it.

    Args:
        warm: whether the run warm-starts (``warm_start.steps > 0``).
        evaluate: ``evaluate(stage, extra)`` evaluates, keeps and logs the stage ``"start"`` or ``"warm
            start"`` (with ``extra``, the warm start's statistics, in its record).
        warm_start: runs (or, from ``state.warm_start_progress``, goes on with) the warm start, which
            checkpoints itself every ``warm_start.save_every`` steps; returns its statistics.
        save: writes the run's checkpoint from ``state``.
        back_to_checkpoint: loads the run's last checkpoint back (weights and ``state``).
    """
    left = state.start_left()
    if not left:
        return False
    rng, saved, part = capture_rng(), False, ""
    try:
        if "start" in left:
            part = "the start evaluation"
            evaluate("start", None)
            state.start_done.add("start")
        if warm and "warm start" in left:
            part = "the warm start"
            if state.warm_start_progress is None:
                save()  # what a Ctrl-C or a kill during the warm start goes back to
            saved = True
            state.warm_start_stats = warm_start()
            state.start_done.add("warm start")
            save()  # a run stopped after this point never redoes the warm start
        if warm:
            part = "the evaluation after the warm start"
            evaluate("warm start", state.warm_start_stats)
            state.warm_start_stats = None  # logged with that evaluation
        state.start_done.update(START_PARTS)
    except KeyboardInterrupt:
        if saved:  # back to the last checkpoint: the weights of a cut-short update are not kept
            back_to_checkpoint()
        else:  # nothing moved the weights; a draw of the interrupted evaluation is undone
            restore_rng(rng)
        say(f"stopped during {part}; --run.resume true {state.resume_plan(part)}")
        return True
    return False


def run_final(evaluate: Callable[[str, dict[str, float] | None], None]) -> bool:
    """The ``"final"`` evaluation (``evaluate`` as for :func:`run_start`); returns whether a Ctrl-C stopped
    it, after putting back the random generators it drew from."""
    rng = capture_rng()
    try:
        evaluate("final", None)
    except KeyboardInterrupt:  # the run itself is done: keep it, and let a resume evaluate it
        restore_rng(rng)
        say("stopped during the final evaluation; --run.resume true runs it again")
        return True
    return False
