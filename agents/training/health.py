"""Signs that a run is not doing what its numbers suggest, each counted, logged and said once on stderr:

* optimiser updates skipped because the gradient norm was not finite (:class:`UpdateWatch`): a backend
  skips such an update rather than write NaN into the weights, so a diverged run would otherwise go on
  "training" with a frozen policy and healthy-looking logs. A few skipped in a row stop the run with
  :class:`TrainingDiverged`;
* searches that failed or timed out (:func:`search_failures`, :class:`FailedSearchWarning`): with the
  retrieval server down, every call still counts in ``searches`` while the policy only ever sees error
  observations;
* episodes that never search (:func:`episodes_without_search`, :class:`NoSearchWarning`): a policy that
  answers from the question alone under a protocol built for searching gets a reward and a falling loss,
  yet RL cannot teach it a search it never makes.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

from search_env.trajectory import ToolCall, Trajectory

__all__ = ["FailedSearchWarning", "NoSearchWarning", "TrainingDiverged", "TrainingFailed", "UpdateWatch",
           "episodes_without_search", "search_failures"]

#: Failed-search warnings repeat at most once in this many steps.
FAILED_SEARCH_WARN_INTERVAL = 20

#: Training steps in a row in which no episode searched before :class:`NoSearchWarning` speaks: one such
#: step is noise early in a run, several in a row are a policy that does not search.
NO_SEARCH_WARN_STEPS = 3


class TrainingFailed(RuntimeError):
    """A run that cannot usefully go on; the message is one line naming the cause. ``python -m
    agents.train`` prints it as ``error: <message>`` and exits with status 1 (bad input is status 2)."""


class TrainingDiverged(TrainingFailed):
    """``optim.max_skipped_updates`` optimiser updates in a row had a non-finite gradient norm."""


class UpdateWatch:
    """Counts optimiser updates skipped for a non-finite gradient norm, across training steps.

    Args:
        max_in_a_row: ``optim.max_skipped_updates``.
        say: prints one line (on stderr, beside any progress bar).
    """

    def __init__(self, max_in_a_row: int, say: Callable[[str], None]) -> None:
        self.max_in_a_row, self.say = max_in_a_row, say
        self.in_a_row = 0  #: skipped updates since the last applied one
        self.skipped = 0  #: skipped updates in this invocation
        self.steps = 0  #: training steps checked in this invocation
        self.updated_steps = 0  #: of which at least one optimiser update was applied

    def check(self, step: int, metrics: Mapping[str, float], trailing: int) -> None:
        """Count the step's ``updates/applied`` and ``updates/skipped`` (see
        :meth:`~agents.training.trainer.Trainer.train_step`; ``trailing``: the skips after its last
        applied update), say so at the first skip of a streak, and raise :class:`TrainingDiverged` once
        ``max_in_a_row`` were skipped in a row."""
        applied, skipped = int(metrics.get("updates/applied", 0)), int(metrics.get("updates/skipped", 0))
        self.steps += 1
        self.updated_steps += applied > 0
        self.skipped += skipped
        if not skipped:
            self.in_a_row = 0 if applied else self.in_a_row
            return
        first = self.in_a_row == 0 or applied > 0
        self.in_a_row = trailing if applied else self.in_a_row + skipped
        if self.in_a_row >= self.max_in_a_row:
            raise TrainingDiverged(
                f"step {step}: {self.in_a_row} optimiser updates in a row had a non-finite gradient norm "
                f"(grad_norm {metrics.get('grad_norm', math.nan):.3g}) and were skipped: the run has diverged "
                f"(lower optim.learning_rate, or raise optim.max_skipped_updates={self.max_in_a_row} to wait longer)")
        if first:
            self.say(f"warning: step {step}: {skipped} optimiser update(s) skipped: the gradient norm is not finite "
                     f"(the run stops after optim.max_skipped_updates={self.max_in_a_row} in a row)")


def _failed(call: ToolCall) -> tuple[bool, bool]:
    """Whether a search call failed, and whether its failure was a timeout (a DAG call fails when any
    of its nodes did)."""
    errors = [call.error] if call.error else []
    errors += [node["error"] for node in call.nodes if isinstance(node, Mapping) and node.get("error")]
    timed_out = any("timed out" in e.lower() or e.startswith(("TimeoutError", "ReadTimeout")) for e in errors)
    return bool(errors), timed_out


def search_failures(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``searches/failed`` and ``searches/timed_out``: failed (and, of those, timed-out) search calls per
    episode, as ``searches`` counts calls per episode; ``searches/failed_share``: the share of calls
    that failed (0 when none was made)."""
    calls = [_failed(call) for t in trajectories for call in t.tool_calls]
    episodes = max(len(trajectories), 1)
    failed = sum(f for f, _ in calls)
    return {"searches/failed": failed / episodes, "searches/timed_out": sum(t for _, t in calls) / episodes,
            "searches/failed_share": failed / len(calls) if calls else 0.0}


class FailedSearchWarning:
    """Says (one line) when a step's failed share of searches reaches ``threshold``
    (``run.warn_failed_searches``; 0: never), at most once in :data:`FAILED_SEARCH_WARN_INTERVAL` steps."""

    def __init__(self, threshold: float, say: Callable[[str], None]) -> None:
        self.threshold, self.say = threshold, say
        self.last: int | None = None

    def check(self, step: int, metrics: Mapping[str, float]) -> None:
        share = metrics.get("searches/failed_share", 0.0)
        if self.threshold <= 0 or share < self.threshold:
            return
        if self.last is not None and step - self.last < FAILED_SEARCH_WARN_INTERVAL:
            return
        self.last = step
        timed_out = metrics.get("searches/timed_out", 0.0) / max(metrics.get("searches/failed", 0.0), 1e-12)
        self.say(f"warning: step {step}: {share:.0%} of the searches failed ({min(timed_out, 1.0):.0%} of those "
                 f"timed out): is the retrieval source up? (the policy sees only error observations)")


def episodes_without_search(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``rollout/zero_search_frac``: the share of the episodes that made no search call (0 for none)."""
    return {"rollout/zero_search_frac": sum(not t.tool_calls for t in trajectories) / max(len(trajectories), 1)}


class NoSearchWarning:
    """Says (one line, once in a run) when no episode searched (``rollout/zero_search_frac`` 1.0) for
    :data:`NO_SEARCH_WARN_STEPS` training steps in a row, under a protocol that expects searches (one with
    a search call tag: every built-in protocol).

    Args:
        protocol: the name of the training environment's protocol (said in the warning).
        call_tag: the protocol's search call tag; empty when the protocol has none (then never a warning).
        say: prints one line (on stderr, beside any progress bar).
    """

    def __init__(self, protocol: str, call_tag: str, say: Callable[[str], None], steps: int = NO_SEARCH_WARN_STEPS) -> None:
        self.protocol, self.call_tag, self.say, self.steps = protocol, call_tag, say, steps
        self.in_a_row = 0  #: steps in a row without a search, up to now
        self.said = False

    def check(self, step: int, metrics: Mapping[str, float]) -> None:
        if not self.call_tag or self.said:
            return
        self.in_a_row = self.in_a_row + 1 if metrics.get("rollout/zero_search_frac", 0.0) >= 1.0 else 0
        if self.in_a_row >= self.steps:
            self.said = True
            self.say(f"warning: step {step}: no episode searched in {self.in_a_row} steps in a row (rollout/zero_search_frac "
                     f"1.0): the policy answers without ever opening a search call ({self.call_tag}), which the {self.protocol} "
                     f"protocol expects, so RL cannot teach it to search (warm start it, or check its prompt and stop strings)")
