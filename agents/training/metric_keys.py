"""Every key a training run writes to ``metrics.jsonl`` (and TensorBoard, W&B), with its meaning and unit.

The one list of them: the documentation's metrics glossary is generated from :data:`METRIC_KEYS`, and a
test trains a tiny run and fails on any key it logs that no entry matches, so a new metric cannot go
undocumented. A pattern's ``{name}`` part stands for one path segment (no ``/``): ``eval/{decoding}/em``
matches ``eval/greedy/em`` and ``eval/sampled/em``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["MACHINE_KEYS", "METRIC_KEYS", "MetricKey", "describe", "measures_the_machine"]


@dataclass(frozen=True)
class MetricKey:
    """One logged key, or a family of them.

    Attributes:
        pattern: the key, with ``{name}`` for a varying segment (``reward/{component}``).
        meaning: what the number is, in a sentence.
        unit: its unit (``s``, ``tokens``, ``share`` for a fraction in [0, 1], ``count``, ``nats`` ...).
    """

    pattern: str
    meaning: str
    unit: str


#: Prefixes of the logged keys that measure the machine (times, rates, the threads the warm start found free):
#: everything else a run logs is a result of its steps, the same wherever and however loaded it ran, so a
#: reproduction compares all but these.
MACHINE_KEYS = ("time/", "tokens_per_s", "warm_start/seconds", "warm_start/trained_tokens_per_s", "warm_start/threads")


def measures_the_machine(key: str) -> bool:
    """Whether a logged key is one of :data:`MACHINE_KEYS`."""
    return key.startswith(MACHINE_KEYS)


_EVAL = "Held-out evaluation ({decoding}: ``greedy`` or ``sampled`` decoding), logged at the start, every ``eval.every`` steps and at the end: "

#: Every key a run logs, grouped as the glossary shows them (the order is the page's order).
METRIC_KEYS: tuple[MetricKey, ...] = (
    # The log line itself.
    MetricKey("step", "The training step the line belongs to (0: before the first update).", "count"),
    MetricKey("stage", "Which evaluation the line reports outside the training steps (``start``, ``final``).", "label"),
    # The step's episodes.
    MetricKey("em", "Exact match of the predicted answer, mean over the step's episodes.", "share"),
    MetricKey("f1", "Token F1 of the predicted answer (SQuAD normalisation), mean over the step's episodes.", "share"),
    MetricKey("reward", "The environment's episode reward, mean over the step's episodes.", "reward"),
    MetricKey("reward/{component}", "One component of the episode reward (e.g. ``em``, a format bonus), mean over the episodes.", "reward"),
    MetricKey("searches", "Search calls per episode.", "count"),
    MetricKey("searches/failed", "Search calls per episode that failed or timed out (an error observation instead of passages).", "count"),
    MetricKey("searches/timed_out", "Search calls per episode that timed out.", "count"),
    MetricKey("searches/failed_share", "Share of the step's search calls that failed.", "share"),
    MetricKey("response_tokens", "Agent (generated) tokens per episode.", "tokens"),
    MetricKey("episodes", "Episodes played in the step (summed over ranks).", "count"),
    MetricKey("rows", "Trajectories in the step's training batch (summed over ranks).", "count"),
    MetricKey("rollout_rounds", "Rollouts the step took (more than 1 when dynamic sampling refills uninformative groups).", "count"),
    MetricKey("rollout/zero_search_frac", "Share of the step's episodes that made no search call.", "share"),
    # The rollout engine against the trainer.
    MetricKey("rollout/logprob_gap_mean", "Mean absolute difference between the engine's and the trainer's log-prob of a sampled token.", "nats"),
    MetricKey("rollout/logprob_gap_max", "Largest such difference in the step.", "nats"),
    MetricKey("rollout/logprob_gap_turn{turn}_mean", "The mean engine/trainer log-prob gap over the tokens of search turn {turn}.", "nats"),
    MetricKey("rollout/logprob_gap_turn{turn}_max", "The largest engine/trainer log-prob gap in search turn {turn}.", "nats"),
    MetricKey("rollout/sync_gap", "After a weight sync, the largest log-prob difference on a fixed probe between the engine "
              "and the trainer (``rollout.sync_check``); logged with the step whose episodes that sync's weights sampled.", "nats"),
    MetricKey("rollout/sync_gap_rank{rank}", "The sync gap measured by data-parallel rank {rank}.", "nats"),
    MetricKey("rollout/staleness_mean", "How many optimiser steps behind the trained weights the step's episodes were sampled "
              "(``rollout.max_staleness``), mean.", "steps"),
    MetricKey("rollout/staleness_max", "The same, largest in the step.", "steps"),
    # Advantages and the update.
    MetricKey("score/mean", "The score the advantages are computed from (the reward, shaped by the algorithm), mean over rows.", "reward"),
    MetricKey("score/overlong_penalty", "The mean change of the score by the overlong-response penalty (GRPO/DAPO shaping).", "reward"),
    MetricKey("advantage/mean", "Mean advantage over the trained rows.", "advantage"),
    MetricKey("advantage/std", "Standard deviation of the advantages.", "advantage"),
    MetricKey("groups/informative_frac", "Share of the question groups whose samples' scores differ (the others give zero advantage).", "share"),
    MetricKey("gigpo/shared_turn_frac", "GiGPO: share of later turns whose anchor state is shared by another episode (the "
              "step-level comparison had something to compare).", "share"),
    MetricKey("return/mean", "PPO: mean return the value head is fitted to.", "reward"),
    MetricKey("value/mean", "PPO: mean predicted value.", "reward"),
    MetricKey("value/clip_frac", "PPO: share of tokens whose value update was clipped.", "share"),
    MetricKey("loss/policy", "The policy-gradient loss.", "loss"),
    MetricKey("loss/value", "PPO: the value loss.", "loss"),
    MetricKey("loss/kl", "The KL term of the loss (to the reference policy).", "nats"),
    MetricKey("loss/entropy", "The mean token entropy entering the loss.", "nats"),
    MetricKey("loss/total", "The loss the optimiser minimised (policy, value, KL and entropy terms with their coefficients).", "loss"),
    MetricKey("kl", "KL to the reference policy, however it was applied (in the loss or the reward).", "nats"),
    MetricKey("entropy", "Mean entropy of the policy over the trained tokens.", "nats"),
    MetricKey("policy/ratio", "Mean new/old probability ratio of the trained tokens.", "ratio"),
    MetricKey("policy/approx_kl", "Approximate KL between the policy before and after the update.", "nats"),
    MetricKey("policy/clip_frac", "Share of trained tokens whose ratio was clipped.", "share"),
    MetricKey("policy/dual_clip_frac", "Share of trained tokens hit by the dual clip (negative advantages).", "share"),
    MetricKey("rollout_correction/weight", "Mean truncated importance weight against the engine's log-probs (``algorithm.tis_cap``).", "ratio"),
    MetricKey("rollout_correction/capped_frac", "Share of tokens whose importance weight was capped.", "share"),
    MetricKey("rollout_correction/masked_rows", "Share of rows dropped by the sequence-level mask.", "share"),
    MetricKey("grad_norm", "Gradient norm before clipping, mean over the step's optimiser steps.", "norm"),
    MetricKey("updates/applied", "Optimiser steps taken in the step.", "count"),
    MetricKey("updates/skipped", "Optimiser steps skipped for a non-finite gradient.", "count"),
    MetricKey("lr", "The learning rate the step's updates used.", "1/step"),
    # Time.
    MetricKey("tokens_per_s", "Agent tokens generated per second of the whole step (summed over ranks).", "tokens/s"),
    MetricKey("time/step", "Wall time of the step.", "s"),
    MetricKey("time/rollout", "Wall time of the step's rollout.", "s"),
    MetricKey("time/generation", "Time spent decoding in the rollout.", "s"),
    MetricKey("time/env", "Time spent stepping the environments in the rollout.", "s"),
    MetricKey("time/search", "Time spent searching (retrieval) in the rollout.", "s"),
    MetricKey("time/env_worker", "Time the forked environment worker spent (``rollout.env_worker``; 0 without one).", "s"),
    MetricKey("time/update", "Wall time of the update (scoring, advantages, optimiser steps).", "s"),
    MetricKey("time/update_waited", "Asynchronous rollouts: time the trainer waited for the step's episodes.", "s"),
    MetricKey("time/rollout_waited", "Asynchronous rollouts: time the engine sat idle waiting for the update and the sync.", "s"),
    MetricKey("time/weight_sync", "Asynchronous rollouts: the trainer's part of the weight sync.", "s"),
    # Warm start (supervised cloning of scripted demonstrations before training).
    MetricKey("warm_start/loss_first", "Cross-entropy per trained token at the first warm-start step.", "nats"),
    MetricKey("warm_start/loss_last", "Cross-entropy per trained token at the last warm-start step.", "nats"),
    MetricKey("warm_start/copy_loss_last", "Loss at the last copy warm-up step (NaN: none).", "nats"),
    MetricKey("warm_start/steps", "Warm-start optimiser steps.", "count"),
    MetricKey("warm_start/demonstrations", "Scripted demonstrations cloned.", "count"),
    MetricKey("warm_start/demo_second_hop_share", "Share of the demonstrations that search a second hop.", "share"),
    MetricKey("warm_start/demo_reward", "Mean reward of the demonstrations.", "reward"),
    MetricKey("warm_start/seconds", "Wall time of the warm start's optimisation.", "s"),
    MetricKey("warm_start/trained_tokens_per_s", "Trained (loss-carrying) tokens processed per second.", "tokens/s"),
    MetricKey("warm_start/threads", "The torch threads the warm start ran on (time-weighted mean when following free cores).", "count"),
    # Evaluation.
    MetricKey("eval/{decoding}/em", _EVAL + "exact match.", "share"),
    MetricKey("eval/{decoding}/f1", _EVAL + "token F1.", "share"),
    MetricKey("eval/{decoding}/reward", _EVAL + "episode reward.", "reward"),
    MetricKey("eval/{decoding}/searches", _EVAL + "search calls per episode.", "count"),
    MetricKey("eval/{decoding}/searches/failed", _EVAL + "failed search calls per episode.", "count"),
    MetricKey("eval/{decoding}/response_tokens", _EVAL + "agent tokens per episode.", "tokens"),
    MetricKey("eval/{decoding}/episodes", _EVAL + "episodes the means are over.", "count"),
)


@lru_cache(maxsize=None)
def _compiled() -> tuple[tuple[re.Pattern[str], MetricKey], ...]:
    return tuple((re.compile(re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(entry.pattern)) + r"\Z"), entry) for entry in METRIC_KEYS)


def describe(key: str) -> MetricKey:
    """The entry of :data:`METRIC_KEYS` that ``key`` (as logged) matches, an exact pattern before a family.

    Raises:
        KeyError: no entry matches (one line naming the key): add one to :data:`METRIC_KEYS`.
    """
    matches = [entry for pattern, entry in _compiled() if pattern.match(key)]
    if not matches:
        raise KeyError(f"metric {key!r} has no entry in agents.training.metric_keys.METRIC_KEYS")
    return min(matches, key=lambda entry: "{" in entry.pattern)
