"""Playing a run's episodes: every (dataset, protocol, agent, seed) cell over a batch environment.

Episodes are played by :func:`agents.rollout.collect.collect_rollouts`, the loop training plays with,
``--batch-size`` at a time (a wave). After each wave the replay is checked for searches its file lacked
(the environment made those error observations, so such episodes are not kept), the judge scores the
wave's answers in one batch, and each episode's record is appended to the log at once: a kill loses
only the wave being played. Cells whose episodes the log holds already are skipped, and an agent
whose cells are all done is never loaded.

An episode's record (:func:`episode_record`) holds its identity, question, golds, the extracted
answer, the metrics (:mod:`~benchmarks.evaluation.metrics`), the reward and its components, the tool
calls, the counters and the whole trajectory as text (prompt, agent text, results).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from agents.rollout.agent import RolloutAgent
from agents.rollout.collect import collect_rollouts
from agents.training.evaluation import predicted_answer
from rewards.registry import value_range
from search_env import BatchSearchQAEnv
from search_env.data.example import QAExample
from search_env.progress_lines import progress_meter
from search_env.protocols import get_protocol
from search_env.trajectory import Trajectory

from benchmarks.evaluation.agent_specs import EvalAgent
from benchmarks.evaluation.datasets import Dataset
from benchmarks.evaluation.metrics import episode_metrics
from benchmarks.evaluation.retrieval import Retrieval
from benchmarks.evaluation.store import EpisodeKey, EpisodeLog

__all__ = ["Cell", "EnvOptions", "Plan", "episode_record", "play", "run"]


@dataclass(frozen=True)
class EnvOptions:
    """The environment settings of a run (None: the protocol's own).

    Attributes:
        top_k: passages per search.
        max_turns: searches per episode.
        max_new_tokens / max_context: the token budgets.
        tokenizer: the environments' tokenizer for agents that bring none (None: the built-in one).
    """

    top_k: int | None = None
    max_turns: int | None = None
    max_new_tokens: int = 1024
    max_context: int = 8192
    tokenizer: Any = None

    def top_k_of(self, protocol: str) -> int:
        """The top-k episodes of ``protocol`` run with."""
        return self.top_k if self.top_k is not None else get_protocol(protocol).top_k

    def max_turns_of(self, protocol: str) -> int | None:
        """The search budget episodes of ``protocol`` run with (None: unlimited)."""
        return self.max_turns if self.max_turns is not None else get_protocol(protocol).max_turns


@dataclass(frozen=True, eq=False)
class Cell:
    """The episodes of one agent with one seed, on one dataset under one protocol (hashed by identity)."""

    dataset: Dataset
    protocol: str
    agent: EvalAgent
    seed: int

    def key(self, example: QAExample) -> EpisodeKey:
        return (self.dataset.name, self.protocol, self.agent.name, self.seed, example.id)

    def keys(self) -> list[EpisodeKey]:
        return [self.key(example) for example in self.dataset.examples]


@dataclass
class Plan:
    """What a run plays: datasets x protocols x agents x seeds.

    Attributes:
        seed: the first seed; ``samples`` > 0 (sampled decoding) gives seeded agents ``samples`` seeds
            from it, every other agent plays ``seed`` alone.
        batch_size: episodes played side by side (a wave).
        judge: an LLM judge scoring every answer (and standing in the reasoning-search reward's judge).
    """

    datasets: list[Dataset]
    protocols: list[str]
    agents: list[EvalAgent]
    env: EnvOptions
    seed: int = 0
    samples: int = 0
    batch_size: int = 8
    judge: Any = None

    def seeds(self, agent: EvalAgent) -> list[int]:
        return [self.seed + i for i in range(self.samples)] if agent.seeded and self.samples else [self.seed]

    def cells(self) -> list[Cell]:
        """Every cell that is played, agent-major (an agent is loaded once for all its cells)."""
        skipped = {(agent.name, dataset.name) for agent, dataset, _ in self.not_played()}
        return [Cell(dataset, protocol, agent, seed) for agent in self.agents for dataset in self.datasets
                if (agent.name, dataset.name) not in skipped for protocol in self.protocols for seed in self.seeds(agent)]

    def not_played(self) -> list[tuple[EvalAgent, Dataset, str]]:
        """The agents that cannot play some question of a dataset (:attr:`EvalAgent.unable`), with the
        dataset and the first such question's reason: they do not play that dataset at all, so that every
        row of a dataset is over the same questions."""
        skipped = []
        for agent in self.agents:
            for dataset in self.datasets:
                reason = next((r for r in map(agent.unable, dataset.examples) if r is not None), None)
                if reason is not None:
                    skipped.append((agent, dataset, reason))
        return skipped


def run(plan: Plan, retrieval: Retrieval, log: EpisodeLog) -> int:
    """Play every episode of ``plan`` that ``log`` lacks, appending each to it; returns how many were played.

    Raises:
        HarnessError: a replay lacked a search (see :meth:`Retrieval.check_replay`).
    """
    todo = {cell: [ex for ex in cell.dataset.examples if cell.key(ex) not in log] for cell in plan.cells()}
    todo = {cell: examples for cell, examples in todo.items() if examples}
    total = sum(map(len, todo.values()))
    with progress_meter(total=total, desc="episodes", unit="episode") as meter:
        for agent in plan.agents:
            cells = [cell for cell in todo if cell.agent is agent]
            try:
                for cell in cells:
                    _play_cell(cell, todo[cell], plan, retrieval, log, meter.update)
            finally:
                agent.release()
    return total


def _play_cell(cell: Cell, examples: list[QAExample], plan: Plan, retrieval: Retrieval, log: EpisodeLog,
               advance: Callable[[int], Any]) -> None:
    agent = cell.agent.build(cell.seed)
    codec = getattr(agent, "codec", None)
    # The search budget travels in the protocol the agent is given (an agent that plans its searches, as
    # IRCoT does, reads it there), not only in the environment that enforces it.
    protocol = get_protocol(cell.protocol)
    if plan.env.max_turns is not None:
        protocol = protocol.with_options(max_turns=plan.env.max_turns)
    env = BatchSearchQAEnv(min(plan.batch_size, len(examples)), protocol=protocol, dataset=cell.dataset.examples,
                           sources=retrieval.sources(cell.dataset), tokenizer=codec if codec is not None else plan.env.tokenizer,
                           top_k=plan.env.top_k, max_new_tokens=plan.env.max_new_tokens,
                           max_context=plan.env.max_context, judge=plan.judge)
    identity = {"dataset": cell.dataset.name, "protocol": cell.protocol, "agent": cell.agent.name, "seed": cell.seed}
    try:
        play(agent, env, examples, identity, judge=plan.judge, after_wave=retrieval.check_replay, on_record=log.append,
             advance=advance)
    finally:
        env.close()  # the plan threads; the sources are borrowed (the run closes them)
        close = getattr(agent, "close", None)
        if callable(close):
            close()


def play(agent: RolloutAgent, env: BatchSearchQAEnv, examples: Sequence[QAExample], identity: Mapping[str, Any], *,
         judge: Any = None, after_wave: Callable[[], None] | None = None,
         on_record: Callable[[dict[str, Any]], None] | None = None, advance: Callable[[int], Any] | None = None) -> list[dict[str, Any]]:
    """One episode of ``agent`` per example, ``env.num_envs`` at a time; returns the records.

    After each wave: ``after_wave`` (may raise to drop the wave), the judge's scores, then
    ``on_record`` for each record and ``advance`` with the wave's size."""
    first = env.envs[0]
    preset = first.reward if isinstance(first.reward, str) else first.reward.name  # a name, or a StepReward
    reward_range = value_range(preset) if isinstance(first.reward, str) else None
    records = []
    for start in range(0, len(examples), env.num_envs):
        wave = list(examples[start : start + env.num_envs])
        rollout = collect_rollouts(agent, env, wave)
        if after_wave is not None:
            after_wave()
        seconds = rollout.timings.total_s / len(wave)
        answers = [predicted_answer(t) for t in rollout.trajectories]
        judgements = (judge.assess_batch([ex.question for ex in wave], [ex.golden_answers for ex in wave], answers)
                      if judge is not None else [None] * len(wave))
        for example, trajectory, answer, judgement in zip(wave, rollout.trajectories, answers, judgements):
            record = episode_record(identity, example, trajectory, answer, env.codec.decode(trajectory.token_ids), seconds,
                                    (preset, reward_range), judgement)
            records.append(record)
            if on_record is not None:
                on_record(record)
        if advance is not None:
            advance(len(wave))
    return records


def episode_record(identity: Mapping[str, Any], example: QAExample, trajectory: Trajectory, answer: str, text: str,
                   seconds: float, reward: tuple[str, tuple[float, float] | None], judgement: Any = None) -> dict[str, Any]:
    """The log's record of one episode (see the module docstring): ``answer`` is the extracted answer,
    ``text`` the decoded trajectory, ``reward`` the preset's name and its range (None: not declared),
    ``judgement`` a :class:`rewards.Judgement` or None."""
    metrics = episode_metrics(trajectory, answer, example.gold_passage_ids, seconds)
    record: dict[str, Any] = {
        **identity, "example_id": example.id, "question": example.question, "golden_answers": list(example.golden_answers),
        "prediction": answer, "metrics": metrics, "reward_preset": reward[0],
        "reward_range": list(reward[1]) if reward[1] is not None else None,
        "reward_components": _json_data(trajectory.reward_components), "end_reason": trajectory.end_reason,
        "counters": dict(trajectory.counters),
        "tool_calls": [{"turn": c.turn, "kind": c.kind, "content": c.content, "sources": list(c.sources), "k": c.k,
                        "passage_ids": list(c.passage_ids), "error": c.error} for c in trajectory.tool_calls],
        "text": text,
    }
    if judgement is not None:
        metrics["judge"] = float(judgement.score)
        record["judge_reply"] = judgement.reply
    return record


def _json_data(value: Any) -> Any:
    """``value`` as JSON data (numpy numbers become Python ones, anything else unknown its text)."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
