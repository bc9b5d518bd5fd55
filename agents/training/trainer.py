"""One trainer for every algorithm and every backend: rollout -> reward -> advantages -> update.

Each step:

1. the environment's reward is told the step (scheduled rewards, e.g. R1-Searcher's two stages);
2. ``rollout.questions_per_step`` questions (a seeded reshuffle of the dataset per epoch) are rolled out
   ``algorithm.group_size`` times each with the policy's sampler;
3. the trajectories become a :class:`~agents.rollout.batch.TrainBatch`; the algorithm may drop rows (DAPO's
   dynamic sampling, which may roll out further questions to refill the batch) and shapes scores
   itself (overlong punishment);
4. with no gradient: the rollout policy's log-probs, the reference's (when KL is on) and the critic's
   values (PPO). With one update pass of one optimiser step over the whole rollout and nothing in the
   advantages that needs them (no critic, no KL in the reward), the rollout policy's log-probs are
   those of the update's own forward pass, detached (ratio 1, the on-policy gradient), and the extra
   pass is skipped;
5. the algorithm's advantages; then ``optim.update_epochs`` passes over mini-batches
   (:mod:`agents.training.update`), each split by the backend into micro-batches whose losses are scaled
   by the mini-batch's global counts (reduced across data-parallel ranks by the backend), so one
   optimiser step sees the full mini-batch gradient.

The trainer owns the run's life cycle, which reads top to bottom here: prepare (the output folder
checked), start (:mod:`agents.training.run_stages`: the ``"start"`` evaluation, the optional warm start,
the evaluation after it), the loop (evaluating every ``eval.every`` steps), finish (the ``"final"``
evaluation, a checkpoint, the policy exported as a transformers model folder, ``policy/``). Callbacks
(:mod:`agents.training.callbacks`; the loggers are callbacks) run at each of these points and steer the
loop through ``trainer.control``. Checkpoints hold everything a step depends on - the backend's folder
(weights, optimiser and schedule states) and the run's state
(:class:`~agents.training.run_state.RunState`) - so a run stopped at any point and resumed takes exactly
the steps an uninterrupted run takes; a resume may change only settings that leave a step's computation
alone (:mod:`agents.training.resume`). Samplers and mini-batch shuffles draw from generators seeded by
(seed, step), so evaluating more or less often never changes what training does. With
``rollout.max_staleness`` K the next K steps' episodes are generated while a step updates
(:mod:`agents.training.async_rollout`). The rollout half of a step - the engine, its sync check, that
pipeline, the seeds and the environment worker - has one owner, :class:`~agents.training.rollout_driver.RolloutDriver`.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from agents.learners import Algorithm
from agents.policies.policy import HFPolicy
from agents.rollout.engines import RolloutEngine
from agents.training.backends import TrainingBackend
from agents.training.callbacks import Callback, TrainerControl, stop_on_interrupt
from agents.training.checkpoint import clean_run_folder, load_run, load_run_backend, open_run, save_run
from agents.training.config import TrainConfig
from agents.training.console_log import ConsoleProgress, quiet_transformers, say
from agents.training.data import QuestionOrder
from agents.training.evaluation import EvalResult, evaluate, questions_by_hops, reward_component_means, summarize
from agents.training.health import FailedSearchWarning, NoSearchWarning, UpdateWatch, episodes_without_search, search_failures
from agents.training.library_noise import hide_deepspeed_cpu_notice
from agents.training.loggers import loggers_for
from agents.training.rank_metrics import all_rank_metrics
from agents.training.result import TrainResult
from agents.training.resume import check_settings, record_resume
from agents.training.rollout_driver import RolloutDriver
from agents.training.run_checks import prepare_output
from agents.training.run_files import RunFiles
from agents.training.run_reach import check_shared_output
from agents.training.run_lock import RunLock, lock_run_folder
from agents.training.run_stages import run_final, run_start
from agents.training.run_state import RunState, check_format
from agents.training.samples import SampleLogger
from agents.training.update import by_length, engine_mismatch, score_batch, to_device, update_batch
from agents.training.warm_start import WarmStartProgress, warm_start
from search_env import BatchSearchQAEnv
from search_env.console import progress
from search_env.data.example import QAExample
from search_env.files import write_atomically

__all__ = ["Trainer"]


class Trainer:
    """Trains ``policy`` with ``algorithm`` on the episodes of ``env`` (see the module docstring).

    Args:
        config: the run's settings.
        policy: the policy rollouts sample from; ``backend`` owns and updates it (``backend.policy``).
        env: ``questions_per_step * group_size`` episodes side by side (or fewer: they run in waves).
        algorithm: advantages and losses (:mod:`agents.learners`).
        backend: models, optimisers, micro-batches and the optimiser step (:mod:`agents.training.backends`).
        eval_env / eval_questions: held-out questions (indices into ``eval_env``'s dataset, or examples);
            no evaluation without them.
        engine: what samples the episodes (:class:`~agents.rollout.engines.RolloutEngine`); the trainer's
            rollout driver attaches it to ``backend``. Default: the engine ``rollout.engine`` names, over ``policy``, at the
            config's temperature and top-p (the HF sampler on the policy itself, for ``hf``).
        callbacks: run besides the loggers ``run.report_to`` asks for (:mod:`agents.training.callbacks`).
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
        engine: RolloutEngine | None = None,
        callbacks: Sequence[Callback] = (),
    ) -> None:
        if backend.policy is not policy:
            raise ValueError("the backend must own the policy the trainer samples from (backend.policy is not policy)")
        self.config, self.policy, self.env, self.algorithm, self.backend = config, policy, env, algorithm, backend
        self.eval_env, self.eval_questions = eval_env, list(eval_questions)
        #: What the run has done (step, data position, evaluations, the start's parts): what a checkpoint holds.
        self.state = RunState(QuestionOrder(len(env.examples), config.run.seed))
        #: The rollout half of each step: the engine, its sync check, the rollouts ahead, seeds, the env worker.
        self.rollout_driver = RolloutDriver(config, policy, env, algorithm, backend, self.state, engine=engine)
        # With several data-parallel ranks (backend.world_size > 1) rank 0 alone runs the callbacks: it logs,
        # evaluates, and writes the run's files; every rank rolls out its share of the questions.
        self.callbacks: list[Callback] = ([*loggers_for(config.run.report_to), ConsoleProgress(), SampleLogger(), *callbacks]
                                          if backend.rank == 0 else [])
        if backend.world_size > 1:  # batch-wide statistics (REINFORCE++'s and PPO's whitening) over all ranks
            algorithm.reduce_sum = backend.all_reduce_sum
        self.files = RunFiles(config.run.output_dir)  #: the paths of the run's files
        #: What the callbacks ask of the loop: evaluate, checkpoint or stop after the step (Ctrl-C stops too).
        self.control = TrainerControl()
        self.resumed = False
        #: Compute the policy's entropy in updates to log it, even when the loss does not use it.
        self.log_entropy = config.run.log_entropy
        self._lock: RunLock | None = None  # rank 0's hold on the run's folder while it trains
        self._trailing_skips = 0  # optimiser updates skipped after the last step's last applied one
        if config.run.resume:
            self.load()

    @property
    def step(self) -> int:
        """Training steps done."""
        return self.state.step

    @property
    def order(self) -> QuestionOrder:
        """The seeded order the training questions are taken in."""
        return self.state.order

    @property
    def engine(self) -> RolloutEngine:
        """What samples the episodes (the rollout driver's :class:`~agents.rollout.engines.RolloutEngine`)."""
        return self.rollout_driver.engine

    @engine.setter
    def engine(self, engine: RolloutEngine) -> None:
        self.rollout_driver.engine = engine

    # -- the run ------------------------------------------------------------------------------------
    def train(self) -> TrainResult:
        """Run to ``run.steps`` (or stop after ``run.stop_after``, at Ctrl-C after the current step, or when
        a callback sets ``control.should_stop``); a trainer that loaded a checkpoint (``run.resume``, or
        :meth:`load`) continues it. A checkpoint is written every ``run.save_every`` steps and when the
        call returns; a run that reached its last step is evaluated there (``"final"``) and leaves its
        policy as a model folder. First ``run.output_dir`` must be writable and, for a fresh run, hold no
        earlier run unless ``run.overwrite`` (:mod:`agents.training.run_checks`). Raises
        :class:`~agents.training.health.TrainingDiverged` after ``optim.max_skipped_updates`` skipped
        updates in a row.
        """
        try:
            with quiet_transformers(self.config.run.progress):
                return self._train()
        finally:
            self.close()

    def _train(self) -> TrainResult:
        run = self.config.run
        if self.backend.rank == 0:
            self._lock = lock_run_folder(self.files.root)  # one run in the folder at a time; let go in close()
            prepare_output(self.config, fresh=not self.resumed and self.step == 0 and not self.state.evaluations)
            if not self.resumed:  # a new run: its settings written, what an earlier run's crash mid-save left removed
                write_atomically(self.files.config, json.dumps(self.config.as_dict(), indent=2) + "\n")
                clean_run_folder(self.files.checkpoint)
        self.backend.barrier()
        check_shared_output(self.files.root, self.backend)  # several ranks: one folder that every rank sees
        watch = UpdateWatch(self.config.optim.max_skipped_updates, say)
        failed_searches = FailedSearchWarning(run.warn_failed_searches, say)
        no_search = NoSearchWarning(self.env.protocol.name, self.env.protocol.call_open, say)
        self._call("on_run_start")
        self.control.should_stop |= run_start(  # the parts of the start not done: evaluation, warm start, evaluation
            self.state, warm=self.config.warm_start.steps > 0, evaluate=self._evaluate_stage, warm_start=self._warm_start,
            save=self.save, back_to_checkpoint=lambda: self.load_state_dict(load_run(self.files.checkpoint, self.backend)))
        last, every = (run.steps if run.stop_after is None else min(run.steps, run.stop_after)), self.config.eval.every
        with stop_on_interrupt(self.control), progress(total=run.steps, initial=self.step,
                                                       show=run.progress if self.backend.rank == 0 else False, unit="step") as bar:
            while self.step < last and not self.control.shared(self.backend).should_stop:
                metrics = self.train_step()
                asked = self.control.shared(self.backend).take_step_flags()  # what the step's hooks asked for
                evaluated = (asked.should_evaluate or (every > 0 and self.step % every == 0)) and self.step < run.steps
                if evaluated:
                    metrics.update(self._evaluation_metrics(self._evaluate(None)))
                if evaluated or self.step % run.log_every == 0 or self.step == last or metrics.get("updates/skipped"):
                    self._call("on_log", self.step, metrics)
                watch.check(self.step, metrics, self._trailing_skips)
                failed_searches.check(self.step, metrics)
                no_search.check(self.step, metrics)
                if asked.should_save or (run.save_every > 0 and self.step % run.save_every == 0):
                    self.save()
                bar.update(1)
                if hasattr(bar, "set_postfix"):  # a drawn bar (the silent stand-in has no postfix)
                    bar.set_postfix(reward=f"{metrics['reward']:.3f}", em=f"{metrics['em']:.3f}")
        # A resumed run that goes past the step of its "final" evaluation is evaluated again at its new last step.
        if self.step >= run.steps and self.state.stage_steps.get("final") != self.step:
            self.control.should_stop |= run_final(self._evaluate_stage)
        self.save()
        if self.step >= run.steps:
            self.export_policy(self.files.policy)
        result = TrainResult(self.step, run.steps, self.config.algo, dict(self.state.evaluations), self.files.root,
                             self.files.checkpoint, self.files.policy, watch.steps, watch.updated_steps, watch.skipped,
                             stopped=self.control.should_stop)
        self._call("on_run_end", result)
        return result

    def close(self) -> None:
        """Wait for a rollout in flight (``rollout.max_staleness``), stop the environment worker
        (``rollout.env_worker``), if one runs (a later step starts another), and let go of the run's folder
        (:mod:`agents.training.run_lock`)."""
        self.rollout_driver.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def close_environments(self) -> None:
        """Close the worker, the rollout engine (servers it launched are stopped; once, whoever built it) and
        the training and held-out environments (their sources' threads): the trainer is done."""
        self.close()
        self.rollout_driver.close_engine()
        self.env.close()
        if self.eval_env is not None:
            self.eval_env.close()

    def export_policy(self, directory: str | Path) -> Path:
        """Write the policy as a standard transformers model folder (weights, config, tokenizer); with
        several ranks, rank 0 writes it (a sharded engine's weights gathered first)."""
        hide_deepspeed_cpu_notice()  # transformers' save imports deepspeed through accelerate: its CPU notice is noise
        with self.backend.generation():
            if self.backend.rank == 0:
                self.policy.save_pretrained(directory)
        self.backend.barrier()
        return Path(directory)

    def train_step(self) -> dict[str, float]:
        """One rollout and update; returns the step's metrics and advances ``self.step``."""
        started = time.perf_counter()
        # Rolled out now, or (rollout.max_staleness) sampled while the last step updated, the next steps launched.
        (trajectories, batch, timings, rounds), pipeline = self.rollout_driver.take(self.step)
        self._call("on_rollout", trajectories)
        batch = batch.select(by_length(batch, torch.arange(len(batch))))
        update_started = time.perf_counter()
        stats: dict[str, float] = {"rows": float(len(batch)), "rollout_rounds": float(rounds),
                                   "updates/applied": 0.0, "updates/skipped": 0.0}
        self._trailing_skips = 0
        trained = torch.tensor(float(bool(len(batch)) and bool(batch.trained_mask.any())))
        update_keys: set[str] = set()
        if float(self.backend.all_reduce_sum(trained)) > 0:  # every rank updates when any has trained tokens
            batch = to_device(batch, self.backend.device)
            score_batch(self.backend, self.algorithm, self._optim, batch, reuse_logprobs=self.rollout_driver.reuses_logprobs)
            stats.update(engine_mismatch(batch))
            stats.update(self.algorithm.compute_advantages(batch))
            with_entropy = self.algorithm.needs_entropy or self.log_entropy
            update_stats, self._trailing_skips = update_batch(self.backend, self.algorithm, self._optim, batch,
                                                              shuffle_seed=self.rollout_driver.seed("shuffle"), with_entropy=with_entropy)
            stats.update(update_stats)
            update_keys = set(update_stats)
        lr = self.backend.learning_rate  # the rate this step's updates used (finish_step moves it on)
        self.backend.finish_step()
        if "kl_reward" in stats:  # KL to the reference, however it was applied, is logged as "kl"
            stats["kl"] = stats.pop("kl_reward")
        now = time.perf_counter()
        agent_tokens = sum(int(t.agent_mask.sum()) for t in trajectories)
        metrics = {
            **summarize(trajectories).as_dict(),
            **{f"reward/{k}": v for k, v in reward_component_means(trajectories).items()},
            **search_failures(trajectories),
            **episodes_without_search(trajectories),
            **stats,
            "lr": lr,
            "tokens_per_s": agent_tokens / max(now - started, 1e-9),
            "time/generation": timings.generation_s, "time/env": timings.env_s, "time/search": timings.search_s,
            "time/env_worker": timings.worker_s, "time/rollout": timings.total_s,
            "time/update": now - update_started, "time/step": now - started,
            **self.rollout_driver.sync_metrics(self.step), **pipeline,
        }
        if self.backend.world_size > 1:
            metrics = all_rank_metrics(self.backend, metrics, update_keys)
        self.state.advance()
        self._call("on_update", metrics)
        return metrics

    @property
    def _optim(self):
        """The ``optim`` group as one rank sees it: ``mini_batch_size`` counts the rows of all ranks, so each
        rank's mini-batches hold its share of them."""
        optim, world = self.config.optim, self.backend.world_size
        return optim if world == 1 else dataclasses.replace(optim, mini_batch_size=optim.mini_batch_size // world)

    def _call(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(self, *args)

    # -- the start's warm start ---------------------------------------------------------------------
    def _warm_start(self) -> dict[str, float]:
        """Clone scripted demonstrations into the policy (:func:`agents.training.warm_start.warm_start`); the reference
        becomes the warm-started policy. Returns the warm start's statistics."""
        def save(progress: WarmStartProgress) -> None:
            self.state.warm_start_progress = progress
            self.save()

        result = warm_start(self.backend, self.config, self.env, progress=self.state.warm_start_progress, save=save)
        self.state.warm_start_progress = None
        self.backend.reset_reference()
        if self.config.warm_start.export:  # before the checkpoint that marks the warm start done
            self.export_policy(self.files.warm_start_policy)
        return result.as_dict()

    # -- evaluation ---------------------------------------------------------------------------------
    def run_evaluation(self, modes: Sequence[str] = ("greedy", "sampled")) -> dict[str, EvalResult]:
        """Episodes of the current policy on the held-out questions, greedy and/or sampled (the eval env's
        reward follows the step too); with ``eval.by_hops``, each hop count's questions (up to
        ``eval.questions`` of each) are reported on their own as ``"greedy 1-hop"`` ...."""
        if self.eval_env is None or not self.eval_questions:
            return {}
        self.eval_env.set_reward_step(self.step)
        seed = self.rollout_driver.seed("eval")
        results: dict[str, EvalResult] = {}
        for mode in modes:
            if not self.config.eval.by_hops:
                results[mode] = evaluate(self.engine.agent(greedy=mode == "greedy", seed=seed), self.eval_env, self.eval_questions)[0]
                continue
            for hops, questions in questions_by_hops(self.eval_env.examples, self.eval_questions,
                                                     self.config.eval.questions).items():
                results[f"{mode} {hops}-hop"] = evaluate(self.engine.agent(greedy=mode == "greedy", seed=seed), self.eval_env, questions)[0]
        return results

    def _evaluate(self, stage: str | None) -> dict[str, EvalResult]:
        """:meth:`run_evaluation` between the callbacks' evaluation hooks (``stage``: see
        :meth:`~agents.training.callbacks.Callback.on_evaluation`)."""
        if self.eval_env is None or not self.eval_questions:
            return {}
        self._call("on_evaluation_start", stage)
        periodic_greedy = stage is None and not self.config.eval.periodic_sampled
        self.rollout_driver.ready_for_evaluation()  # the rollouts ahead ended, every rank's engine on the current weights
        with self.rollout_driver.decoding():  # rank 0 evaluates, the others wait
            results = self.run_evaluation(("greedy",) if periodic_greedy else ("greedy", "sampled")) if self.backend.rank == 0 else {}
        self.backend.barrier()
        self._call("on_evaluation", stage, results)
        return results

    def _evaluate_stage(self, stage: str, extra: dict[str, float] | None = None) -> None:
        """Evaluate, keep the result for the before/after table, and log it (with ``extra``) at this step."""
        results = self._evaluate(stage)
        if results:
            self.state.keep_evaluation(stage, results)
        if results or extra:
            self._call("on_log", self.step, {"stage": stage, **(extra or {}), **self._evaluation_metrics(results)})

    @staticmethod
    def _evaluation_metrics(results: dict[str, EvalResult]) -> dict[str, float]:
        return {k: v for mode, r in results.items() for k, v in r.as_dict(f"eval/{mode.replace(' ', '/')}/").items()}

    # -- checkpoints --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds besides the backend's folder: the algorithm, the settings (JSON text, which
        a resume is checked against), the run's state (:meth:`RunState.state_dict`, with its format) and, with
        ``rollout.max_staleness``, the next steps' episodes (finished first: :mod:`agents.training.async_rollout`)."""
        return {"algo": self.config.algo, "config_json": json.dumps(self.config.as_dict(), sort_keys=True),
                **self.state.state_dict(), **self.rollout_driver.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["algo"] != self.config.algo:
            raise ValueError(f"the checkpoint was trained with {state['algo']!r}, not {self.config.algo!r}")
        self.state.load_state_dict(state)
        self.rollout_driver.load_state_dict(state)

    def save(self, path: str | Path | None = None) -> Path:
        """Write a checkpoint (default: the run's ``checkpoint.pt``; :func:`~agents.training.checkpoint.save_run`:
        the backend's folder, then the trainer's state naming it, replaced atomically)."""
        path = save_run(path or self.files.checkpoint, self.step, self.state_dict(), self.backend)
        self._call("on_checkpoint", path)
        return path

    def load(self, path: str | Path | None = None) -> None:
        """Continue from a checkpoint written by :meth:`save` (default: the run's own; the next :meth:`train`
        resumes the run), its files checked (:func:`~agents.training.checkpoint.open_run`) and its settings
        compared with the config before anything is loaded (:mod:`agents.training.resume`).

        Raises:
            FileNotFoundError: no checkpoint, or a file of it is missing.
            ValueError: one line: a damaged file, a changed setting, a checkpoint of another model.
        """
        path = Path(path or self.files.checkpoint)
        saved = open_run(path, self.backend)
        check_format(saved)
        changes = check_settings(self.config, json.loads(saved["config_json"]), f"checkpoint {path}")
        saved = load_run_backend(path, saved, self.backend)
        if self.backend.rank == 0:  # with several ranks, rank 0 alone changes the run's files
            record_resume(self.files, int(saved["step"]), self.config, changes)
        self.load_state_dict(saved)
        self.resumed = True

