"""Multi-turn rollouts: many episodes at once over a batch environment (:class:`search_env.BatchEnv`).

:func:`collect_rollouts` drives any :class:`~agents.rollout.agent.RolloutAgent`: it asks the running rows
for a chunk (up to a stop string, EOS or the row's budget), hands every chunk to the environment in one
batched ``step`` (so each source answers one batch of queries), feeds each row the tokens the
environment appended, and repeats until every episode has ended. Every turn is checked token-in/
token-out: the environment consumed the chunk's ids as given, and what it appended is environment text;
at the end each trajectory's ids equal the prompt, chunks and environment tokens exactly as handed
around.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from agents.rollout.agent import Chunk, RolloutAgent, StreamingRolloutAgent
from search_env import BatchEnv
from search_env.data.example import QAExample
from search_env.trajectory import AGENT, Trajectory
from search_env.worker import EnvWorker, StepResult

__all__ = ["Rollout", "RolloutTimings", "collect_rollouts"]

_TRUNCATIONS = ("max_new_tokens", "max_context")


@dataclass
class RolloutTimings:
    """Where a rollout's wall time went, in seconds.

    Attributes:
        generation_s: inside the agent (sampling, feeding environment tokens to its cache).
        env_s: inside the environment's ``reset``/``step``, search excluded (tag scanning, encoding
            results, rewards).
        search_s: searching: per batched step, the time its search round took (see ``_search_time``; the
            episodes' own call durations overlap and also hold other episodes' stepping).
        total_s: the whole of :func:`collect_rollouts`; the rest is the rollout's own bookkeeping.
        worker_s: with an :class:`~search_env.worker.EnvWorker`, the worker's own time stepping (search
            included), which overlaps generation; ``env_s`` is then the time the rollout spent handing
            chunks over and waiting for results, and ``search_s`` is 0 (it happens inside the worker).
    """

    generation_s: float = 0.0
    env_s: float = 0.0
    search_s: float = 0.0
    total_s: float = 0.0
    worker_s: float = 0.0

    def add(self, other: RolloutTimings) -> None:
        """Add ``other``'s times to these (rollouts taken one after another)."""
        self.generation_s += other.generation_s
        self.env_s += other.env_s
        self.search_s += other.search_s
        self.total_s += other.total_s
        self.worker_s += other.worker_s

    def shares(self) -> dict[str, float]:
        """Each part as a fraction of ``total_s`` (``other``: what the rollout itself spent)."""
        total = self.total_s or 1.0
        other = self.total_s - self.generation_s - self.env_s - self.search_s
        return {"generation": self.generation_s / total, "env": self.env_s / total, "search": self.search_s / total,
                "other": other / total}


@dataclass
class Rollout:
    """The episodes of one :func:`collect_rollouts` call, question-major (the samples of a question are
    consecutive).

    Attributes:
        trajectories: the environment's records, the single truth for rewards, logs and training.
        group_ids: per episode, the id of its question (the example id): the group of group baselines.
        timings: where the time went.
        sampled_logprobs: per episode, token-aligned with ``token_ids``: the log-prob the agent gave each
            id it sampled (0.0 on prompt and environment tokens); ``None`` when the agent gives none.
    """

    trajectories: list[Trajectory]
    group_ids: list[str]
    timings: RolloutTimings = field(default_factory=RolloutTimings)
    sampled_logprobs: list[list[float]] | None = None

    def stats(self) -> dict[str, float]:
        """Means over episodes (reward, searches, lengths, how episodes ended) and the time shares."""
        trajs = self.trajectories
        rewards = np.array([t.reward for t in trajs], dtype=np.float64)
        agent_tokens = np.array([sum(t.producers[t.prompt_length :]) for t in trajs], dtype=np.float64)
        response = np.array([len(t.token_ids) - t.prompt_length for t in trajs], dtype=np.float64)
        t = self.timings
        return {
            "episodes": float(len(trajs)),
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "answered": float(np.mean([tr.answer is not None for tr in trajs])),
            "truncated": float(np.mean([tr.end_reason in _TRUNCATIONS for tr in trajs])),
            "searches_mean": float(np.mean([len(tr.tool_calls) for tr in trajs])),
            "agent_tokens_mean": float(agent_tokens.mean()),
            "response_tokens_mean": float(response.mean()),
            "agent_tokens_per_s": float(agent_tokens.sum() / t.total_s) if t.total_s else 0.0,
            **{f"time_{name}": share for name, share in t.shares().items()},
            "total_s": t.total_s,
        }


def collect_rollouts(
    agent: RolloutAgent,
    env: BatchEnv,
    questions: Sequence[int | QAExample],
    *,
    group_size: int = 1,
) -> Rollout:
    """Run ``group_size`` episodes of ``agent`` on each question and return them with their timings.

    ``questions`` are indices into the environment's dataset or :class:`QAExample` objects. Episodes run
    ``env.num_envs`` at a time (in waves when there are more). With an :class:`EnvWorker` and an agent
    that streams its chunks (:class:`~agents.rollout.agent.StreamingRolloutAgent`), each row's chunk goes to
    the worker as soon as the row stops, and the worker steps it while the agent decodes the other rows;
    the episodes are the same as stepping in-process. Raises ``RuntimeError`` when an agent's chunk and
    the environment disagree about where a turn ends (token-in/token-out would be broken).
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if not questions:
        raise ValueError("no questions to roll out")
    started = time.perf_counter()
    examples = [env.examples[q] if isinstance(q, (int, np.integer)) else q for q in questions]
    _check_ids(examples)
    episodes = [ex for ex in examples for _ in range(group_size)]
    timings = RolloutTimings()
    worker_busy = env.busy_s if isinstance(env, EnvWorker) else 0.0
    trajectories: list[Trajectory] = []
    logprobs: list[list[float]] | None = []
    for start in range(0, len(episodes), env.num_envs):
        wave = episodes[start : start + env.num_envs]
        wave_trajs, wave_logprobs = _run_wave(agent, env, wave, timings)
        trajectories += wave_trajs
        logprobs = None if logprobs is None or wave_logprobs is None else logprobs + wave_logprobs
    if isinstance(env, EnvWorker):
        timings.worker_s = env.busy_s - worker_busy
    else:
        timings.search_s = _search_time(trajectories)
        timings.env_s -= timings.search_s
    timings.total_s = time.perf_counter() - started
    return Rollout(trajectories, [ex.id for ex in episodes], timings, logprobs)


def _check_ids(examples: list[QAExample]) -> None:
    """Groups are keyed by example id, so one id must not name two different questions."""
    seen: dict[str, str] = {}
    for ex in examples:
        if seen.setdefault(ex.id, ex.question) != ex.question:
            raise ValueError(f"example id {ex.id!r} names two different questions; group ids must be unique per question")


def _run_wave(
    agent: RolloutAgent, env: BatchEnv, wave: list[QAExample], timings: RolloutTimings
) -> tuple[list[Trajectory], list[list[float]] | None]:
    """Run one episode per example of ``wave`` (at most ``env.num_envs``) to its end, turn by turn."""
    m, n_envs = len(wave), env.num_envs
    tick = time.perf_counter()
    obs, _ = env.reset(options=[{"example": ex} for ex in wave] + [{"example": wave[0]}] * (n_envs - m))
    tock = time.perf_counter()
    timings.env_s += tock - tick
    sequences = [list(o["token_ids"]) for o in obs[:m]]
    logprobs: list[list[float]] | None = [[0.0] * len(s) for s in sequences]
    agent.begin([list(s) for s in sequences], examples=wave, protocol=env.protocol, codec=env.codec)
    timings.generation_s += time.perf_counter() - tock
    generated = [0] * m
    trajectories: list[Trajectory | None] = [None] * m
    alive = list(range(m))
    streaming = isinstance(env, EnvWorker) and getattr(agent, "streams_chunks", False)
    while alive:
        budgets = [min(env.max_new_tokens - generated[r], env.max_context - len(sequences[r])) for r in alive]
        if streaming:
            chunks, results = _turn_streamed(agent, env, alive, budgets, timings)  # type: ignore[arg-type]
        else:
            chunks, results = _turn(agent, env, alive, budgets, timings)
        still, ended_rows = [], []
        for r, chunk in zip(alive, chunks):
            obs, _, terminated, truncated, info = results[r]
            ended = bool(terminated or truncated)
            env_ids = _environment_tokens(r, chunk.ids, obs, info["consumed"], ended)
            kept = info["consumed"]
            sequences[r] += chunk.ids[:kept] + env_ids
            generated[r] += kept
            if logprobs is not None and chunk.logprobs is not None:
                logprobs[r] += chunk.logprobs[:kept] + [0.0] * len(env_ids)
            else:
                logprobs = None
            if ended:
                trajectories[r] = info["trajectory"]
                ended_rows.append(r)
            else:
                still.append((r, env_ids))
        tick = time.perf_counter()
        for r in ended_rows:
            agent.finish(r)
        for r, env_ids in still:
            agent.feed(r, env_ids)
        timings.generation_s += time.perf_counter() - tick
        alive = [r for r, _ in still]
    for r, traj in enumerate(trajectories):
        if traj.token_ids != sequences[r]:
            raise RuntimeError(f"episode {r}: the trajectory's ids differ from the ids the agent and the environment exchanged")
    return trajectories, logprobs


def _check_chunk(row: int, chunk: Chunk, budget: int) -> None:
    if not 1 <= len(chunk.ids) <= budget:
        raise RuntimeError(f"the agent returned {len(chunk.ids)} ids for row {row}, whose budget is {budget} (at least 1)")


def _turn(agent: RolloutAgent, env: BatchEnv, alive: list[int], budgets: list[int],
          timings: RolloutTimings) -> tuple[list[Chunk], dict[int, StepResult]]:
    """One turn: the agent writes every running row's chunk, then the environment steps them all."""
    tick = time.perf_counter()
    chunks = agent.generate(alive, budgets)
    tock = time.perf_counter()
    timings.generation_s += tock - tick
    actions: list[list[int] | None] = [None] * env.num_envs
    for r, budget, chunk in zip(alive, budgets, chunks):
        _check_chunk(r, chunk, budget)
        actions[r] = chunk.ids
    obs, rewards, terminated, truncated, infos = env.step(actions)
    timings.env_s += time.perf_counter() - tock
    return chunks, {r: (obs[r], float(rewards[r]), bool(terminated[r]), bool(truncated[r]), infos[r]) for r in alive}


def _turn_streamed(agent: StreamingRolloutAgent, worker: EnvWorker, alive: list[int], budgets: list[int],
                   timings: RolloutTimings) -> tuple[list[Chunk], dict[int, StepResult]]:
    """One turn with the environment in a worker: each row's chunk is submitted as the row stops, so the
    worker steps it while the agent decodes the rest; then the rollout waits for the last results."""
    budget_of = dict(zip(alive, budgets))
    handed: dict[int, Chunk] = {}
    handing = 0.0

    def hand_over(stopped: dict[int, Chunk]) -> None:
        nonlocal handing
        tick = time.perf_counter()
        for r, chunk in stopped.items():
            if r not in budget_of or r in handed:
                raise RuntimeError(f"the agent reported a chunk for row {r}, which is not running or was reported already")
            _check_chunk(r, chunk, budget_of[r])
            handed[r] = chunk
        worker.submit({r: chunk.ids for r, chunk in stopped.items()})
        handing += time.perf_counter() - tick

    tick = time.perf_counter()
    chunks = agent.generate(alive, budgets, on_chunks=hand_over)
    tock = time.perf_counter()
    results = worker.collect()
    timings.generation_s += tock - tick - handing
    timings.env_s += handing + time.perf_counter() - tock
    for r, chunk in zip(alive, chunks):
        if r not in handed or handed[r].ids != chunk.ids:
            raise RuntimeError(f"row {r}: the chunk the agent returned is not the one it reported as the row stopped")
    if set(results) != set(alive):
        raise RuntimeError(f"the worker stepped rows {sorted(results)}, not the running rows {sorted(alive)}")
    return chunks, results


def _environment_tokens(row: int, chunk: list[int], obs: dict, consumed: int, ended: bool) -> list[int]:
    """The tokens the environment appended after a chunk, after checking it kept the chunk's ids as given."""
    ids, producers = obs["token_ids"], obs["producers"]
    if consumed < len(chunk) and not ended:
        raise RuntimeError(f"row {row}: the environment consumed {consumed} of {len(chunk)} ids but the episode goes on")
    if list(ids[:consumed]) != chunk[:consumed] or any(p == AGENT for p in producers[consumed:]):
        raise RuntimeError(
            f"row {row}: the environment ended the turn inside the chunk (its stop detection and the agent's differ)"
        )
    return list(ids[consumed:])


def _search_time(trajectories: list[Trajectory]) -> float:
    """Wall time spent searching, from the tool calls' intervals.

    A batched ``step`` answers the calls of all its episodes in one round, and a call's interval runs
    from its episode's request to its resumption: it also covers the other episodes' stepping before
    and after the round. The round itself is the part that all the step's intervals share (from the
    last request to the first resumption), so each cluster of overlapping calls (one per step, as a
    rollout chunk makes at most one call) counts for its intersection.
    """
    spans = sorted((c.started_at, c.started_at + c.duration_s) for t in trajectories for c in t.tool_calls)
    total, i = 0.0, 0
    while i < len(spans):
        last_start, first_end = spans[i]
        cluster_end, i = first_end, i + 1
        while i < len(spans) and spans[i][0] <= cluster_end:
            last_start, first_end = spans[i][0], min(first_end, spans[i][1])
            cluster_end, i = max(cluster_end, spans[i][1]), i + 1
        total += max(0.0, first_end - last_start)
    return total
