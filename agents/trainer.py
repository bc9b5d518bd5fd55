"""One trainer for every algorithm and every backend: rollout -> reward -> advantages -> update.

Each step:

1. the environment's reward is told the step (scheduled rewards, e.g. R1-Searcher's two stages);
2. ``questions_per_step`` questions (a seeded reshuffle of the dataset per epoch) are rolled out
   ``group_size`` times each with the policy's sampler;
3. the trajectories become a :class:`~agents.batch.TrainBatch`; the algorithm may drop rows (DAPO's
   dynamic sampling, which may roll out further questions to refill the batch) and shapes scores
   itself (overlong punishment);
4. with no gradient: the rollout policy's log-probs, the reference's (when KL is on) and the critic's
   values (PPO). With one update pass of one optimiser step over the whole rollout and nothing in the
   advantages that needs them (no critic, no KL in the reward), the rollout policy's log-probs are
   those of the update's own forward pass, detached (ratio 1, the on-policy gradient), and the extra
   pass is skipped;
5. the algorithm's advantages; then ``update_epochs`` passes over mini-batches, each split by the
   backend into micro-batches whose losses are scaled by the mini-batch's global counts, so one
   optimiser step sees the full mini-batch gradient. Rows are ordered by length before the split, so
   that a micro-batch, trimmed to its longest row, carries little padding (the result does not depend
   on the split).

Evaluation (greedy and sampled, on held-out questions) runs before training, after the optional
warm start, every ``eval_every`` steps and at the end. Checkpoints hold everything a step depends on -
weights, optimiser and schedule states, the global random generators, the data position, the step - so
a run stopped after step k and resumed takes exactly the steps an uninterrupted run takes. Samplers
and mini-batch shuffles draw from generators seeded by (seed, step), so evaluating more or less often
never changes what training does.
"""
from __future__ import annotations

import dataclasses
import json
import signal
import sys
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from agents.backend import TrainingBackend
from agents.batch import TrainBatch
from agents.checkpoint import CHECKPOINT_FILE, capture_rng, load_checkpoint, restore_rng, save_checkpoint
from agents.config import TrainConfig
from agents.evaluation import EvalResult, evaluate, reward_component_means, summarize
from agents.interface import RolloutAgent
from agents.learners import Algorithm
from agents.logger import RunLogger
from agents.policy import HFPolicy
from agents.rollout import RolloutTimings, build_batch, collect_rollouts
from agents.sampler import HFSampler
from search_env import BatchSearchQAEnv
from search_env.console import progress
from search_env.data.example import QAExample
from search_env.trajectory import Trajectory
from search_env.worker import EnvWorker

__all__ = ["Trainer", "TrainResult", "QuestionOrder"]

CHECKPOINT_FORMAT = 1
#: Names of the random streams derived from (seed, step); fixed so that runs stay reproducible.
_STREAMS = {"rollout": 0, "shuffle": 1, "eval": 2}

AgentFactory = Callable[[bool, int], RolloutAgent]
"""``factory(greedy, seed)``: the rollout agent for one rollout (greedy decoding or sampling, seeded)."""


class QuestionOrder:
    """The questions of each step: the dataset in a seeded random order, reshuffled every epoch.

    The position (epoch, offset) is all the state there is, so a checkpoint stores two ints.
    """

    def __init__(self, size: int, seed: int) -> None:
        if size < 1:
            raise ValueError("the training set is empty")
        self.size, self.seed = size, seed
        self.epoch, self.offset = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.size)

    def take(self, k: int) -> list[int]:
        """The next ``k`` question indices (crossing into the next epoch's order when needed)."""
        out: list[int] = []
        while len(out) < k:
            if self.offset == self.size:
                self.epoch, self.offset = self.epoch + 1, 0
                self._order = self._permutation()
            n = min(k - len(out), self.size - self.offset)
            out += self._order[self.offset : self.offset + n].tolist()
            self.offset += n
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self._order = self._permutation()


@dataclass
class TrainResult:
    """What a finished (or stopped) :meth:`Trainer.train` call leaves.

    Attributes:
        step: completed steps.
        evaluations: ``{stage: {"greedy": EvalResult, "sampled": EvalResult}}`` for the stages
            ``"start"``, ``"warm start"`` (with SFT) and ``"final"`` (when the run reached ``steps``).
        output_dir / metrics_path / curve_path / tensorboard_dir / checkpoint_path: where things went.
    """

    step: int
    evaluations: dict[str, dict[str, EvalResult]]
    output_dir: Path
    metrics_path: Path
    curve_path: Path
    tensorboard_dir: Path | None
    checkpoint_path: Path


class Trainer:
    """Trains ``policy`` with ``algorithm`` on the episodes of ``env`` (see the module docstring).

    Args:
        config: the run's settings (an algorithm's config dataclass).
        policy: the policy rollouts sample from; ``backend`` owns and updates it (``backend.policy``).
        env: ``questions_per_step * group_size`` episodes side by side (or fewer: they run in waves).
        algorithm: advantages and losses (:mod:`agents.learners`).
        backend: models, optimisers, micro-batches and the optimiser step (:mod:`agents.backend`).
        eval_env / eval_questions: held-out questions (indices into ``eval_env``'s dataset, or examples);
            no evaluation without them.
        agent_factory: builds the rollout agent (default: :class:`~agents.sampler.HFSampler` over the
            policy at the config's temperature and top-p); another rollout engine plugs in here.
    """

    def __init__(
        self,
        config: TrainConfig,
        policy: HFPolicy,
        env: BatchSearchQAEnv,
        algorithm: Algorithm,
        backend: TrainingBackend,
        *,
        eval_env: BatchSearchQAEnv | None = None,
        eval_questions: Sequence[int | QAExample] = (),
        agent_factory: AgentFactory | None = None,
    ) -> None:
        if backend.policy is not policy:
            raise ValueError("the backend must own the policy the trainer samples from (backend.policy is not policy)")
        self.config, self.policy, self.env, self.algorithm, self.backend = config, policy, env, algorithm, backend
        self.eval_env, self.eval_questions = eval_env, list(eval_questions)
        self.agent_factory = agent_factory or self._sampler
        self.order = QuestionOrder(len(env.envs[0].examples), config.seed)
        self.step = 0
        self.evaluations: dict[str, dict[str, EvalResult]] = {}
        self.output_dir = Path(config.output_dir)
        self.checkpoint_path = self.output_dir / CHECKPOINT_FILE
        self._stop_requested = False
        self._resumed = False
        self._worker: EnvWorker | None = None
        if config.resume:
            self.load(self.checkpoint_path)

    # -- the run ------------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        """Run to ``config.steps`` (or stop after ``config.stop_after``, or at Ctrl-C after the current
        step); a trainer that loaded a checkpoint (``config.resume``, or :meth:`load`) continues it.

        A fresh run evaluates first, then warm-starts (``sft_steps > 0``) and evaluates again. A
        checkpoint is written every ``save_every`` steps and when the call returns.
        """
        cfg = self.config
        checkpoint_path = self.checkpoint_path
        logger = RunLogger(self.output_dir, tensorboard=cfg.tensorboard, resume_step=self.step if self._resumed else None)
        try:
            if not self._resumed:
                self._write_config()
                self._evaluate_stage("start", logger)
                if cfg.sft_steps > 0:
                    self._evaluate_stage("warm start", logger, self._warm_start())
            last = cfg.steps if cfg.stop_after is None else min(cfg.steps, cfg.stop_after)
            with self._stop_on_interrupt(), progress(total=cfg.steps, initial=self.step, show=cfg.progress, unit="step") as bar:
                while self.step < last and not self._stop_requested:
                    metrics = self.train_step()
                    evaluated = cfg.eval_every > 0 and self.step % cfg.eval_every == 0 and self.step < cfg.steps
                    if evaluated:
                        metrics.update(self._evaluation_metrics(self.run_evaluation()))
                    if evaluated or self.step % max(cfg.log_every, 1) == 0 or self.step == last:
                        logger.log(self.step, metrics)
                    if cfg.save_every > 0 and self.step % cfg.save_every == 0:
                        self.save(checkpoint_path)
                    bar.update(1)
                    if hasattr(bar, "set_postfix"):  # a drawn bar (the silent stand-in has no postfix)
                        bar.set_postfix(reward=f"{metrics['reward']:.3f}", em=f"{metrics['em']:.3f}")
            if self.step >= cfg.steps and "final" not in self.evaluations:
                self._evaluate_stage("final", logger)
            self.save(checkpoint_path)
            curve = logger.plot()
            return TrainResult(self.step, dict(self.evaluations), self.output_dir, logger.metrics_path, curve,
                               logger.tensorboard_dir, checkpoint_path)
        finally:
            logger.close()
            self.close()

    def close(self) -> None:
        """Stop the environment worker (``config.env_worker``), if one runs; a later step starts another."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def rollout_env(self) -> BatchSearchQAEnv | EnvWorker:
        """What training rollouts step: ``env`` itself, or with ``config.env_worker`` a worker process
        serving it (:class:`~search_env.worker.EnvWorker`), forked at the first rollout."""
        if not self.config.env_worker:
            return self.env
        if self._worker is None:
            self._worker = EnvWorker(self.env)
        return self._worker

    def train_step(self) -> dict[str, float]:
        """One rollout and update; returns the step's metrics and advances ``self.step``."""
        cfg = self.config
        started = time.perf_counter()
        self.rollout_env().set_reward_step(self.step)
        trajectories, batch, timings, rounds = self._rollout_batch()
        batch = batch.select(_by_length(batch, torch.arange(len(batch))))
        update_started = time.perf_counter()
        stats: dict[str, float] = {"rows": float(len(batch)), "rollout_rounds": float(rounds)}
        if len(batch) and batch.trained_mask.any():
            batch = _to_device(batch, self._device())
            self._score(batch)
            stats.update(self.algorithm.compute_advantages(batch))
            stats.update(self._update(batch))
        if "kl_reward" in stats:  # KL to the reference, however it was applied, is logged as "kl"
            stats["kl"] = stats.pop("kl_reward")
        now = time.perf_counter()
        agent_tokens = sum(int(t.agent_mask.sum()) for t in trajectories)
        metrics = {
            **summarize(trajectories).as_dict(),
            **{f"reward/{k}": v for k, v in reward_component_means(trajectories).items()},
            **stats,
            "lr": self.backend.learning_rate,
            "tokens_per_s": agent_tokens / max(now - started, 1e-9),
            "time/generation": timings.generation_s,
            "time/env": timings.env_s,
            "time/search": timings.search_s,
            "time/env_worker": timings.worker_s,
            "time/rollout": timings.total_s,
            "time/update": now - update_started,
            "time/step": now - started,
        }
        self.step += 1
        return metrics

    # -- pieces of a step ---------------------------------------------------------------------------
    def _rollout_batch(self) -> tuple[list[Trajectory], TrainBatch, RolloutTimings, int]:
        """Roll out ``questions_per_step`` questions and keep the rows the algorithm keeps; while fewer than
        ``questions_per_step`` groups are kept, roll out further questions, up to the algorithm's
        ``rollout_rounds`` (GRPO's ``dynamic_sampling_rounds``), and train on the first groups kept.
        Returns every episode rolled out, the batch, the summed timings and the rounds taken."""
        cfg = self.config
        wanted = cfg.questions_per_step
        pad = self.policy.codec.pad_id
        trajectories: list[Trajectory] = []
        kept: list[TrainBatch] = []
        groups: list[str] = []  # the kept groups' ids, in order
        timings = RolloutTimings()
        for round_ in range(self.algorithm.rollout_rounds):
            # The first round keeps the seed a step's rollout always had: runs without refills are unchanged.
            seed = self._seed("rollout") if round_ == 0 else self._seed("rollout", round_)
            rollout = collect_rollouts(self.agent_factory(False, seed), self.rollout_env(), self.order.take(wanted),
                                       group_size=cfg.group_size)
            trajectories += rollout.trajectories
            timings.add(rollout.timings)
            batch = self.algorithm.filter_batch(build_batch(rollout.trajectories, rollout.group_ids, pad))
            kept.append(batch)
            groups += [g for g in dict.fromkeys(batch.group_ids) if g not in groups]
            if len(groups) >= wanted:
                break
        if len(kept) == 1 or not groups:  # one rollout's questions are at most ``wanted`` groups
            return trajectories, kept[0], timings, len(kept)
        chosen = set(groups[:wanted])
        rows = [(t, g) for b in kept for t, g in zip(b.trajectories, b.group_ids) if g in chosen]
        batch = build_batch([t for t, _ in rows], [g for _, g in rows], pad)
        return trajectories, batch, timings, len(kept)

    @torch.no_grad()
    def _score(self, batch: TrainBatch) -> None:
        """Fill the rollout policy's log-probs, the reference's and the critic's values, micro-batch by micro-batch."""
        self.backend.eval()
        rows, width = batch.input_ids.shape
        zeros = batch.input_ids.new_zeros((rows, width), dtype=torch.float32)
        old = None if self._old_logprobs_from_update(rows) else zeros.clone()
        ref = zeros.clone() if self.algorithm.uses_reference else None
        values = zeros.clone() if self.algorithm.uses_critic else None
        start = 0
        for mb in self.backend.micro_batches(batch):
            n, t = mb.input_ids.shape
            if old is not None:
                out = self.backend.forward(mb, with_values=self.algorithm.uses_critic)
                old[start : start + n, :t] = out.logprobs
                if values is not None:
                    values[start : start + n, :t] = out.values
            if ref is not None:
                ref[start : start + n, :t] = self.backend.reference_logprobs(mb)
            start += n
        batch.old_logprobs, batch.ref_logprobs, batch.values = old, ref, values

    def _old_logprobs_from_update(self, rows: int) -> bool:
        """Whether the update's own forward pass can give the rollout policy's log-probs: one pass of
        one optimiser step over all ``rows`` (the policy has not moved when it runs), and neither a
        critic nor a KL reward that needs them before the advantages."""
        cfg = self.config
        one_step = cfg.update_epochs == 1 and not 0 < cfg.mini_batch_size < rows
        kl_in_reward = self.algorithm.uses_reference and cfg.kl_in_reward
        return one_step and not self.algorithm.uses_critic and not kl_in_reward

    def _update(self, batch: TrainBatch) -> dict[str, float]:
        """``update_epochs`` passes of mini-batch optimiser steps; the mean of each statistic over steps."""
        cfg = self.config
        rows = len(batch)
        size = cfg.mini_batch_size if 0 < cfg.mini_batch_size < rows else rows
        shuffle = torch.Generator().manual_seed(self._seed("shuffle"))
        separate_critic = self.algorithm.uses_critic and not self.algorithm.value_head
        totals: dict[str, float] = defaultdict(float)
        steps = 0
        self.backend.train()
        for _ in range(cfg.update_epochs):
            order = torch.randperm(rows, generator=shuffle) if size < rows else torch.arange(rows)
            for begin in range(0, rows, size):
                mini = batch.select(_by_length(batch, order[begin : begin + size]))
                counts = self.algorithm.counts(mini)
                for mb in self.backend.micro_batches(mini):
                    out = self.backend.forward(mb, with_entropy=True, with_values=self.algorithm.uses_critic)
                    if mb.old_logprobs is None:  # the policy has not moved since the rollout (see _score)
                        mb = dataclasses.replace(mb, old_logprobs=out.logprobs.detach())
                    loss, mb_stats = self.algorithm.loss(mb, out, counts)
                    if separate_critic:
                        critic_loss, critic_stats = self.algorithm.critic_loss(mb, out.values, counts)
                        loss = loss + critic_loss
                        mb_stats = {**mb_stats, **critic_stats}
                    self.backend.backward(loss)
                    for key, value in mb_stats.items():  # additive shares of the mini-batch's statistic
                        totals[key] += value
                totals["grad_norm"] += self.backend.step()
                steps += 1
        return {key: value / steps for key, value in totals.items()}

    def _sampler(self, greedy: bool, seed: int) -> RolloutAgent:
        cfg = self.config
        return HFSampler(self.policy, temperature=cfg.temperature, top_p=cfg.top_p, greedy=greedy, seed=seed)

    def _seed(self, stream: str, *more: int) -> int:
        """A seed for ``stream`` at the current step (and ``more``, e.g. a rollout round), from the run's
        seed (independent of other streams)."""
        return int(np.random.SeedSequence([self.config.seed, _STREAMS[stream], self.step, *more]).generate_state(1)[0])

    def _device(self) -> torch.device:
        return next(self.policy.parameters()).device

    def _warm_start(self) -> dict[str, float]:
        """Clone scripted demonstrations into the policy (:func:`agents.sft.warm_start`); the reference
        becomes the warm-started policy. Returns the warm start's statistics."""
        from agents.sft import warm_start

        result = warm_start(self.policy, self.config, self.env)
        self.backend.reset_reference()
        return result.as_dict()

    # -- evaluation ---------------------------------------------------------------------------------
    def run_evaluation(self) -> dict[str, EvalResult]:
        """Greedy and sampled episodes of the current policy on the held-out questions (the eval env's
        reward follows the step too)."""
        if self.eval_env is None or not self.eval_questions:
            return {}
        self.eval_env.set_reward_step(self.step)
        seed = self._seed("eval")
        return {mode: evaluate(self.agent_factory(mode == "greedy", seed), self.eval_env, self.eval_questions)[0]
                for mode in ("greedy", "sampled")}

    def _evaluate_stage(self, stage: str, logger: RunLogger, extra: dict[str, float] | None = None) -> None:
        """Evaluate, keep the result for the before/after table, and log it (with ``extra``) at this step."""
        results = self.run_evaluation()
        if results:
            self.evaluations[stage] = results
        if results or extra:
            logger.log(self.step, {"stage": stage, **(extra or {}), **self._evaluation_metrics(results)})

    @staticmethod
    def _evaluation_metrics(results: dict[str, EvalResult]) -> dict[str, float]:
        return {k: v for mode, r in results.items() for k, v in r.as_dict(f"eval/{mode}/").items()}

    # -- checkpoints --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything the next step depends on (see the module docstring)."""
        return {
            "format": CHECKPOINT_FORMAT,
            "algo": self.config.algo,
            "step": self.step,
            "backend": self.backend.state_dict(),
            "rng": capture_rng(),
            "data": self.order.state_dict(),
            "evaluations": {stage: {mode: dataclasses.asdict(r) for mode, r in by_mode.items()}
                            for stage, by_mode in self.evaluations.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"checkpoint format {state.get('format')!r} is not {CHECKPOINT_FORMAT}")
        if state["algo"] != self.config.algo:
            raise ValueError(f"the checkpoint was trained with {state['algo']!r}, not {self.config.algo!r}")
        self.backend.load_state_dict(state["backend"])
        self.order.load_state_dict(state["data"])
        self.step = int(state["step"])
        self.evaluations = {stage: {mode: EvalResult(**r) for mode, r in by_mode.items()}
                            for stage, by_mode in state["evaluations"].items()}
        restore_rng(state["rng"])

    def save(self, path: str | Path) -> Path:
        """Write a checkpoint atomically (see :func:`agents.checkpoint.save_checkpoint`)."""
        return save_checkpoint(path, self.state_dict())

    def load(self, path: str | Path) -> None:
        """Continue from a checkpoint written by :meth:`save` (the next :meth:`train` resumes the run)."""
        self.load_state_dict(load_checkpoint(path, map_location=self._device()))
        self._resumed = True

    def _write_config(self) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / "config.json").write_text(json.dumps(dataclasses.asdict(self.config), indent=2) + "\n")

    # -- interruption -------------------------------------------------------------------------------
    @contextmanager
    def _stop_on_interrupt(self) -> Iterator[None]:
        """A first Ctrl-C finishes the current step, checkpoints and returns; a second one aborts."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.getsignal(signal.SIGINT)

        def handle(signum: int, frame: Any) -> None:
            self._stop_requested = True
            signal.signal(signal.SIGINT, previous)
            print("\nstopping after this step (Ctrl-C again to abort)", file=sys.stderr)

        signal.signal(signal.SIGINT, handle)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)


def _by_length(batch: TrainBatch, rows: torch.Tensor) -> torch.Tensor:
    """``rows`` ordered by their number of tokens (ties keep their order)."""
    lengths = batch.attention_mask[rows].sum(dim=1).cpu()
    return rows[torch.argsort(lengths, stable=True)]


def _to_device(batch: TrainBatch, device: torch.device) -> TrainBatch:
    """The batch with its tensors on ``device`` (the same object's fields when they are there already)."""
    changes = {f.name: getattr(batch, f.name).to(device) for f in dataclasses.fields(batch)
               if isinstance(getattr(batch, f.name), torch.Tensor) and getattr(batch, f.name).device != device}
    return dataclasses.replace(batch, **changes) if changes else batch
