"""What a policy's episodes score: answer EM/F1, reward, searches and length, over a set of questions.

One function, :func:`summarize`, reads trajectories (the single record of an episode) and is used for
training rollouts and held-out evaluation alike, so the numbers in the step logs, the evaluation logs
and the before/after table are computed the same way. EM and F1 are the standard SQuAD-normalised
metrics on the answer the reward extracted, whatever the protocol's reward is, so runs with different
rewards compare on one scale.
"""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from agents.rollout.agent import RolloutAgent
from agents.rollout.collect import collect_rollouts
from agents.training.health import search_failures
from rewards.extraction import boxed_answer
from rewards.metrics import exact_match, f1_score
from search_env import BatchSearchQAEnv
from search_env.data.example import QAExample
from search_env.trajectory import Trajectory

__all__ = ["EvalResult", "evaluate", "format_table", "predicted_answer", "questions_by_hops", "reward_component_means", "summarize"]

#: Reward components that hold the answer the reward scored (extracted from the answer span).
_ANSWER_COMPONENTS = ("answer", "prediction")


@dataclass(frozen=True)
class EvalResult:
    """Means over a set of episodes.

    Attributes:
        em / f1: exact match and token F1 (SQuAD normalisation) of the predicted answer.
        reward: the environment's episode reward.
        searches: search calls per episode.
        response_tokens: agent tokens per episode.
        episodes: how many episodes the means are over.
        failed_searches: search calls per episode that failed or timed out (an error observation instead
            of passages): an EM read beside ``searches`` alone would hide a retriever that was down.
    """

    em: float
    f1: float
    reward: float
    searches: float
    response_tokens: float
    episodes: int
    failed_searches: float

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """The fields as ``{prefix + name: value}`` (for logs); failed searches under ``searches/failed``,
        the key of a training step's metrics, so a step's line and an evaluation's read alike."""
        names = {"failed_searches": "searches/failed"}
        return {prefix + names.get(name, name): float(value) for name, value in asdict(self).items()}



def predicted_answer(trajectory: Trajectory) -> str:
    """The answer an episode gave, as its reward read it: the reward's extracted ``answer`` (or
    ``prediction``) component when it has one, else the answer span (its ``\\boxed{}`` content if
    any); ``""`` when the episode gave none."""
    for key in _ANSWER_COMPONENTS:
        value = trajectory.reward_components.get(key)
        if isinstance(value, str):
            return value
    if trajectory.answer is None:
        return ""
    boxed = boxed_answer(trajectory.answer)
    return boxed if boxed is not None else trajectory.answer


def summarize(trajectories: Sequence[Trajectory]) -> EvalResult:
    """EM, F1, reward, searches, agent tokens and failed searches averaged over ``trajectories``."""
    if not trajectories:
        raise ValueError("no episodes to summarize")
    answers = [predicted_answer(t) for t in trajectories]
    return EvalResult(
        em=float(np.mean([exact_match(a, t.golden_answers) for a, t in zip(answers, trajectories)])),
        f1=float(np.mean([f1_score(a, t.golden_answers) for a, t in zip(answers, trajectories)])),
        reward=float(np.mean([t.reward for t in trajectories])),
        searches=float(np.mean([len(t.tool_calls) for t in trajectories])),
        response_tokens=float(np.mean([int(t.agent_mask.sum()) for t in trajectories])),
        episodes=len(trajectories),
        failed_searches=search_failures(trajectories)["searches/failed"],
    )


def reward_component_means(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Mean of each numeric reward component (a bool counts 0/1) over the episodes that report it as a
    number; text components (the extracted answer) and ``None`` (a part that did not apply) are skipped."""
    values: dict[str, list[float]] = {}
    for trajectory in trajectories:
        for key, value in trajectory.reward_components.items():
            if isinstance(value, numbers.Real):
                values.setdefault(key, []).append(float(value))
    return {key: float(np.mean(v)) for key, v in values.items()}


def evaluate(agent: RolloutAgent, env: BatchSearchQAEnv, questions: Sequence[int | QAExample]) -> tuple[EvalResult, list[Trajectory]]:
    """One episode of ``agent`` per question in ``env`` (``env.num_envs`` at a time); the summary and
    the episodes."""
    rollout = collect_rollouts(agent, env, questions, group_size=1)
    return summarize(rollout.trajectories), rollout.trajectories


def questions_by_hops(examples: Sequence[QAExample], questions: Sequence[int | QAExample],
                      per_hop: int) -> dict[int, list[int | QAExample]]:
    """``questions`` (indices into ``examples``, or examples) by hop count (``metadata["hops"]``, 0 when
    absent), the first ``per_hop`` of each, in ascending hop count."""
    by_hops: dict[int, list[int | QAExample]] = {}
    for question in questions:
        example = examples[question] if isinstance(question, numbers.Integral) else question
        group = by_hops.setdefault(int(example.metadata.get("hops", 0)), [])
        if len(group) < per_hop:
            group.append(question)
    return dict(sorted(by_hops.items()))


def format_table(results: Mapping[str, Mapping[str, EvalResult]]) -> str:
    """A plain-text table: one row per (stage, decoding), e.g. ``{"before": {"greedy": r, "sampled": r}}``; a row
    whose searches failed says so after its EM (:attr:`EvalResult.em_note`)."""
    header = ("stage", "decoding", "EM", "F1", "reward", "searches", "failed", "tokens", "episodes")
    rows: list[tuple[Any, ...]] = []
    for stage, by_mode in results.items():
        for mode, r in by_mode.items():
            em = f"{r.em:.3f} (searches failed)" if r.failed_searches > 0 else f"{r.em:.3f}"
            rows.append((stage, mode, em, f"{r.f1:.3f}", f"{r.reward:.3f}", f"{r.searches:.2f}", f"{r.failed_searches:.2f}",
                         f"{r.response_tokens:.1f}", str(r.episodes)))
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
