"""A training run's configuration: one small dataclass per concern, and :class:`TrainConfig` holding them.

The groups, as the command line and YAML recipes spell them (``--optim.learning_rate 1e-6``, or
``optim: {learning_rate: 1.0e-6}`` in a recipe):

* ``model`` (:class:`~agents.policies.config.ModelConfig`): which model and tokenizer;
* ``data`` (:class:`~agents.training.task_config.DataConfig`): the questions and what they are searched in;
* ``env`` (:class:`~agents.training.task_config.EnvConfig`): the protocol, reward and episode budgets;
* ``rollout`` (:class:`RolloutConfig`): how many episodes a step plays and how they are sampled;
* ``optim`` (:class:`OptimConfig`): the optimiser, its schedule and the update's batching;
* ``warm_start`` (:class:`WarmStartConfig`): supervised cloning of scripted demonstrations first;
* ``eval`` (:class:`EvalConfig`): held-out evaluation;
* ``run`` (:class:`RunConfig`): steps, seed, device, backend, output, logs and checkpoints;
* ``algorithm``: the algorithm's own config (:mod:`agents.learners`), chosen by ``algo``;
* ``engine``: the rollout engine's own options (:mod:`agents.rollout.engines`), chosen by ``rollout.engine``;
* ``backend``: the training backend's own options (:mod:`agents.training.backends`), chosen by ``run.backend``.

The last three are declared by what they configure, so that a new algorithm, engine or backend brings its
settings in its own file; ``--help`` lists the fields of the ones chosen. Every field is checked when the
config is built, so a bad recipe or flag fails with one line before any model is loaded.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from agents.learners.config import AlgorithmConfig, check_warmup
from agents.policies.config import ModelConfig
from agents.training.config_fields import RESUME_FREE, check_finite, check_positive
from agents.training.run_files import POLICY_DIR
from agents.training.task_config import DataConfig, EnvConfig

__all__ = [
    "CHOSEN_GROUPS", "DataConfig", "EnvConfig", "EvalConfig", "GROUPS", "ModelConfig", "OptimConfig", "RESUME_FREE",
    "RolloutConfig", "RunConfig", "TrainConfig", "WarmStartConfig",
]


@dataclass
class RolloutConfig:
    """How a training step's episodes are played (the number of samples per question is the
    algorithm's ``group_size``).

    Attributes:
        questions_per_step: distinct questions per rollout.
        temperature: sampling temperature; log-probs are taken at this temperature.
        top_p: nucleus sampling (1.0: off).
        env_worker: step the training episodes in a forked worker process (Linux), handing each episode's
            chunk over as it ends, so the environment and search run on another core while the policy
            decodes the other episodes (:class:`search_env.worker.EnvWorker`); the episodes are the same.
            Worth it when a core is free: it takes a second one.
        engine: what samples the episodes, a registered engine (:mod:`agents.rollout.engines`): ``hf``
            (:class:`~agents.rollout.hf_sampler.HFSampler` on the trained model itself) or ``vllm``
            (:mod:`agents.rollout.vllm_engine`: a vLLM engine in the trainer's process, its weights
            streamed in after the optimiser steps). Its own settings are the ``engine`` group
            (``--engine.FIELD``; ``--rollout.engine NAME --help`` lists them).
        sync_check: after each weight sync of an engine with its own copy of the weights (``vllm``,
            ``vllm-server``), the engine and the trainer score a fixed probe of a few short sequences from the
            run's prompts (:mod:`agents.rollout.sync_check`) and the largest log-prob difference is logged as
            ``rollout/sync_gap``; above ``sync_tolerance``: ``error`` stops the run with one line naming the
            engine, the sync and the gap (a sync that silently did nothing keeps sampling from old weights),
            ``warn`` says that line and goes on, ``off`` scores nothing. The ``hf`` engine decodes with the
            trained policy itself and is never checked.
        sync_tolerance: the largest sync gap accepted; 0: 1e-2 when the engine and the trainer both compute
            in float32 (correct syncs measured 1e-6 on the tiny model and up to 4e-4 on SmolLM2-135M), 0.2
            when either computes in bf16 (its rounding alone moves a log-prob by ~0.1); a sync that did
            nothing measured ~0.7 after a large change of the weights.
        max_staleness: 0: each step's episodes are sampled by the weights it trains (generate, then
            update). K >= 1: the episodes of steps t+1..t+K are generated while step t updates, step s by
            the weights after max(0, s - K) steps (at most K versions behind;
            :mod:`agents.training.async_rollout`), so with K = 1 a step takes about the longer of the two
            phases rather than their sum; the learners' truncated importance sampling
            (``algorithm.tis_cap``) corrects against the engine's log-probs. It needs an engine with its own
            copy of the weights (``vllm-server``, ``vllm``) and one process. K >= 2 keeps a copy of the
            weights (with LoRA, of the adapters) per version ahead, up to K - 1 at once, until the engine
            takes them; with one engine it adds staleness, not overlap (the rollouts still run one after
            another).
    """

    questions_per_step: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    env_worker: bool = field(default=False, metadata=RESUME_FREE)
    engine: str = "hf"
    sync_check: str = field(default="error", metadata=RESUME_FREE)
    sync_tolerance: float = field(default=0.0, metadata=RESUME_FREE)
    max_staleness: int = 0

    def __post_init__(self) -> None:
        check_positive("rollout", self, "questions_per_step")
        if self.max_staleness < 0:
            raise ValueError(f"rollout.max_staleness must be >= 0 (0: synchronous; K: K steps generated ahead), got {self.max_staleness}")
        check_finite("rollout", self, "temperature", "top_p")
        if not self.temperature > 0:
            raise ValueError(f"rollout.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.sync_check not in ("error", "warn", "off"):
            raise ValueError(f"rollout.sync_check must be error, warn or off, got {self.sync_check!r}")
        check_finite("rollout", self, "sync_tolerance")
        if self.sync_tolerance < 0:
            raise ValueError(f"rollout.sync_tolerance must be >= 0 (0: the default for the precision), got {self.sync_tolerance}")


@dataclass
class OptimConfig:
    """The policy's optimiser (AdamW), its learning-rate schedule and the update's batching.

    Warm-up is counted as the seed systems count it: in training steps (one rollout and its update),
    whatever the number of optimiser steps each takes, or as a share of the run's steps.

    Attributes:
        learning_rate: AdamW's learning rate.
        weight_decay: AdamW's weight decay.
        adam_betas: AdamW's betas.
        max_grad_norm: gradient-norm clipping (0: none).
        warmup_steps: training steps of linear learning-rate warm-up (then constant). A warm-up longer
            than ``run.steps`` draws a warning when the run starts: the rate never reaches
            ``learning_rate`` (the run still learns, more slowly, so it is not refused: a recipe's
            warm-up with a shortened trial ``--run.steps`` is common).
        warmup_ratio: the warm-up as a share of ``run.steps`` (verl's ``lr_warmup_steps_ratio``); use one of the two.
        update_epochs: passes over each rollout.
        mini_batch_size: rows per optimiser step (0: the whole rollout). One larger than a step's rows
            (``rollout.questions_per_step`` x ``algorithm.group_size``) draws a warning when the run
            starts: each pass is then one optimiser step over the whole rollout (the run still learns).
        micro_batch_size: rows per forward pass (gradient accumulation; 0: the whole mini-batch).
        max_skipped_updates: a non-finite (NaN or infinite) gradient norm skips that optimiser update;
            after this many skipped in a row the run stops with an error
            (:class:`~agents.training.health.TrainingDiverged`): its weights or loss have diverged and
            the steps left would train nothing.
    """

    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    update_epochs: int = 1
    mini_batch_size: int = 0
    micro_batch_size: int = 8
    max_skipped_updates: int = field(default=3, metadata=RESUME_FREE)

    def __post_init__(self) -> None:
        check_positive("optim", self, "update_epochs", "max_skipped_updates")
        check_finite("optim", self, "learning_rate", "weight_decay", "max_grad_norm")
        check_positive("optim", self, "mini_batch_size", "micro_batch_size", zero_ok=True)
        if not self.learning_rate > 0:
            raise ValueError(f"optim.learning_rate must be > 0, got {self.learning_rate}")
        if self.weight_decay < 0 or self.max_grad_norm < 0:
            raise ValueError(f"optim.weight_decay and optim.max_grad_norm must be >= 0, got {self.weight_decay}, {self.max_grad_norm}")
        self.adam_betas = tuple(self.adam_betas)
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            raise ValueError(f"optim.adam_betas must be two numbers in [0, 1), got {list(self.adam_betas)}")
        check_warmup(self.warmup_steps, self.warmup_ratio, "optim.warmup")


@dataclass
class WarmStartConfig:
    """Supervised cloning of scripted demonstrations before RL (:func:`agents.training.warm_start.warm_start`),
    for a policy that cannot find the search-and-answer format by chance (a model trained from scratch).

    Attributes:
        steps: optimiser steps of the warm start (0: none).
        copy_steps: steps of the copy warm-up before them (:mod:`agents.training.copy_warmup`): repeated
            random strings teach a model trained from scratch to copy, which answering from results needs.
        examples: demonstrations played for the warm start.
        batch_size: demonstrations per step.
        learning_rate: the warm start's peak learning rate (linear warm-up, then a cosine decay to 0).
        second_hop_rate: share of multi-hop demonstrations that take the second hop (the rest answer
            with the bridge entity: a systematic mistake for RL to correct).
        answerable_only: keep only the ``examples`` played whose results hold a gold answer
            (:func:`~agents.scripted.demonstrations.gold_in_results`): a pretrained model learns to copy it.
        export: write the policy after the warm start to ``warm_start_policy/``, to evaluate cloning alone.
        save_every: write a run checkpoint every this many warm-start steps (0: only before and after
            the warm start), so that a run stopped during a long warm start goes on from there.
        num_threads: torch's CPU threads during the warm start; ``None`` (the default): the cores other work
            leaves free, looked at again every few seconds as it runs
            (:class:`agents.training.cpu_threads.FollowFreeCores`; 1 where the platform does not say). No
            rollout runs then, so on a CPU the warm start can use the cores that RL shares with the environment
            worker (``rollout.env_worker``); on a host whose cores are busy, a fixed second
            thread would slow every step. The count does not change the result.
    """

    steps: int = 0
    copy_steps: int = 0
    examples: int = 512
    batch_size: int = 32
    learning_rate: float = 1e-3
    second_hop_rate: float = 1.0
    answerable_only: bool = False
    export: bool = field(default=False, metadata=RESUME_FREE)
    save_every: int = field(default=500, metadata=RESUME_FREE)
    num_threads: int | None = field(default=None, metadata=RESUME_FREE)

    def __post_init__(self) -> None:
        check_positive("warm_start", self, "steps", "copy_steps", "save_every", zero_ok=True)
        check_positive("warm_start", self, "examples", "batch_size", "num_threads")
        check_finite("warm_start", self, "learning_rate")
        if not self.learning_rate > 0:
            raise ValueError(f"warm_start.learning_rate must be > 0, got {self.learning_rate}")
        if not 0 <= self.second_hop_rate <= 1:
            raise ValueError(f"warm_start.second_hop_rate must be in [0, 1], got {self.second_hop_rate}")


@dataclass
class EvalConfig:
    """Held-out evaluation, greedy and sampled, before training, after the warm start, every ``eval.every``
    steps and at the end.

    Attributes:
        every: evaluate every this many steps (0: only before and after training).
        questions: held-out questions per evaluation (0: no evaluation).
        by_hops: report each hop count of the held-out questions on its own (synthetic questions carry
            their hop count), as ``eval/<mode>/<n>-hop/<metric>``, with ``questions`` of each.
        periodic_sampled: sample in the evaluations every ``eval.every`` steps too, not only greedy (the
            evaluations before and after training always do both).
    """

    every: int = field(default=0, metadata=RESUME_FREE)
    questions: int = 64
    by_hops: bool = field(default=False, metadata=RESUME_FREE)
    periodic_sampled: bool = field(default=True, metadata=RESUME_FREE)

    def __post_init__(self) -> None:
        check_positive("eval", self, "every", "questions", zero_ok=True)


@dataclass
class RunConfig:
    """The run itself: length, seed, where it runs and what it writes.

    Attributes:
        steps: training steps (each one rollout and its update).
        seed: seed of everything random in the run (model init, data order, sampling).
        device: torch device of the models: ``auto`` (CUDA when available - under ``torchrun`` the rank's
            own GPU, ``LOCAL_RANK`` - else the CPU; :mod:`agents.training.devices`), ``cpu``, ``cuda``,
            ``cuda:1`` ... The run's first line says which device and precision it trains in; a resume
            compares the setting as given.
        backend: the training backend, a registered one (:mod:`agents.training.backends`): ``torch`` (one
            device), ``deepspeed`` (ZeRO-2/3) or ``fsdp`` (PyTorch's FSDP2), the last two data-parallel with
            one process per device under ``torchrun``.
            Its own settings are the ``backend`` group (``--backend.FIELD``; ``--run.backend NAME --help``
            lists them).
        dtype: the training precision: ``auto`` (bf16 on a GPU that supports it, fp32 on a CPU),
            ``bf16`` or ``fp32``. With bf16 the forward passes (rollouts, log-probs, updates) compute in
            bf16 while log-probs, losses and the optimiser's steps stay in fp32: the trained weights are
            kept in fp32 (an AdamW step of RL's 1e-6 rates is far below bf16's resolution of a weight,
            2^-8 of it, and would round away), and what no optimiser updates - the ``torch`` backend's
            frozen reference, a LoRA run's base model - is held in bf16, half the memory. ``torch``
            backend: autocast over fp32 weights; ``bf16`` is allowed on a CPU too (PyTorch's CPU kernels
            run bf16). ``deepspeed`` backend: the engine's bf16 mode (fp32 master weights in its
            optimiser); ``bf16`` needs a GPU there.
        gradient_checkpointing: recompute each transformer layer's activations in the backward pass instead
            of keeping them (Hugging Face's activation checkpointing, non-reentrant): less memory
            for long episodes, about a third more compute per update, the same gradients. Rollouts
            (evaluation mode, with a KV cache) are unaffected.
        num_threads: torch's CPU threads.
        output_dir: where logs, curve, config, checkpoint and the trained policy go. It must be writable
            (checked when the run starts, before any model is loaded by the command line).
        resume: continue the run whose checkpoint is in ``output_dir``, exactly where it stopped.
        overwrite: start a new run in an ``output_dir`` that already holds one (a ``metrics.jsonl`` or
            ``checkpoint.pt``), whose files are all removed as the new run starts, so the folder holds the
            new run only, even when it dies early (:data:`~agents.training.run_files.REPLACED_BY_NEW_RUN`);
            without it (or ``resume``) such a run is refused, so that an earlier run is never lost by a
            repeated command.
        stop_after: end this invocation after this many steps in all (checkpointed; a later ``resume``
            continues to ``steps``), e.g. to run in slices on a machine that is lent for a while.
        save_every: write a checkpoint every this many steps (one is always written at the end; 0: only then).
        log_every: write the step metrics every this many steps.
        report_to: where metrics go besides ``metrics.jsonl``: ``tensorboard``, ``wandb`` (offline unless
            ``WANDB_MODE`` says otherwise; needs the ``wandb`` package).
        progress: a progress bar; ``None``: when stderr is a terminal (or ``$SEARCHQA_PROGRESS`` says).
            Without a bar, transformers' own bars (model loading, saving) are off too.
        print_every: without a progress bar (a log file, CI), print a plain progress line to stderr every
            this many steps: step, reward, EM, searches, failed searches, tokens/s, elapsed and
            estimated time left (0: none). Evaluations print one line each either way.
        sample_every: every this many steps, write a few of the step's episodes as text (question,
            the agent's turns and the results it saw, reward components) to ``samples.jsonl`` (0: none).
        warn_failed_searches: warn on stderr when at least this share of a step's searches failed (the
            retrieval server down or timing out), at most once every few steps (0: never).
        log_entropy: log the policy's entropy on trained tokens (a softmax over the vocabulary per token of
            each update; computed anyway when the algorithm's ``entropy_coef`` uses it).
        allow_changes: settings (``group.field``, a whole ``group``, or ``all``) that a resume may change
            from the run's own; any other change is refused (see :mod:`agents.training.resume`).
        collective_timeout_s: with several ranks, how long a rank waits in a collective for the others
            before it stops with one line naming the rank that stopped answering (a hung or stopped rank
            would otherwise block the rest for ever); long enough for the slowest step between two
            collectives: a checkpoint, or an evaluation, which rank 0 runs while the others wait (the
            default is torch's own for gloo). See :mod:`agents.training.backends.distributed`.
    """

    steps: int = field(default=100, metadata=RESUME_FREE)
    seed: int = 0
    device: str = "auto"
    backend: str = "torch"
    dtype: str = "auto"
    gradient_checkpointing: bool = field(default=False, metadata=RESUME_FREE)
    num_threads: int = 1
    output_dir: str = field(default="runs/latest", metadata=RESUME_FREE)
    resume: bool = field(default=False, metadata=RESUME_FREE)
    overwrite: bool = field(default=False, metadata=RESUME_FREE)
    stop_after: int | None = field(default=None, metadata=RESUME_FREE)
    save_every: int = field(default=0, metadata=RESUME_FREE)
    log_every: int = field(default=1, metadata=RESUME_FREE)
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"], metadata=RESUME_FREE)
    progress: bool | None = field(default=None, metadata=RESUME_FREE)
    print_every: int = field(default=10, metadata=RESUME_FREE)
    sample_every: int = field(default=50, metadata=RESUME_FREE)
    warn_failed_searches: float = field(default=0.5, metadata=RESUME_FREE)
    log_entropy: bool = field(default=True, metadata=RESUME_FREE)
    allow_changes: list[str] = field(default_factory=list, metadata=RESUME_FREE)
    collective_timeout_s: float = field(default=1800.0, metadata=RESUME_FREE)

    def __post_init__(self) -> None:
        check_positive("run", self, "steps", "num_threads", "log_every", "stop_after")
        check_positive("run", self, "save_every", "print_every", "sample_every", zero_ok=True)
        check_finite("run", self, "warn_failed_searches", "collective_timeout_s")
        if self.collective_timeout_s <= 0:
            raise ValueError(f"run.collective_timeout_s must be > 0 seconds, got {self.collective_timeout_s}")
        if not 0 <= self.warn_failed_searches <= 1:
            raise ValueError(f"run.warn_failed_searches must be in [0, 1], got {self.warn_failed_searches}")
        if self.resume and self.overwrite:
            raise ValueError("give run.resume or run.overwrite, not both")
        if self.dtype not in ("auto", "bf16", "fp32"):
            raise ValueError(f"unknown run.dtype {self.dtype!r}; known: auto, bf16, fp32")
        self.report_to = list(self.report_to)
        self.allow_changes = list(self.allow_changes)
        unknown = sorted(set(self.report_to) - {"tensorboard", "wandb"})
        if unknown:
            raise ValueError(f"unknown run.report_to {', '.join(unknown)}; known: tensorboard, wandb")
        if not self.output_dir:
            raise ValueError("run.output_dir must be a folder path")
        try:
            import torch  # noqa: F401  (only to check the device string; parsing without torch skips it)
        except ImportError:
            return
        try:
            torch.device("cpu" if self.device == "auto" else self.device)
        except RuntimeError:
            from agents.training.devices import unknown_device
            raise ValueError(unknown_device(self.device)) from None


#: The groups of :class:`TrainConfig` besides ``algorithm``, in the order ``--help`` shows them.
GROUPS: dict[str, type] = {
    "model": ModelConfig, "data": DataConfig, "env": EnvConfig, "rollout": RolloutConfig, "optim": OptimConfig,
    "warm_start": WarmStartConfig, "eval": EvalConfig, "run": RunConfig,
}


#: The groups whose class a choice decides (see :meth:`TrainConfig.chosen_groups`).
CHOSEN_GROUPS = ("algorithm", "engine", "backend")


def _choice_classes(algo: str, engine: str, backend: str) -> dict[str, type]:
    """The classes of the ``algorithm``, ``engine`` and ``backend`` groups for these choices (registries
    imported here: they import this module's neighbours)."""
    from agents.learners.registry import lookup_algorithm
    from agents.rollout.engines import engine_options_class
    from agents.training.backends import backend_options_class

    return {"algorithm": lookup_algorithm(algo).config_class, "engine": engine_options_class(engine),
            "backend": backend_options_class(backend)}


@dataclass
class TrainConfig:
    """Everything a training run needs: the algorithm's name and config, and the groups above.

    Build one in Python with the groups you change (the rest keep their defaults)::

        TrainConfig("grpo", run=RunConfig(steps=50), algorithm=GRPOConfig(kl_coef=0.0))
        config.updated({"run.steps": 10, "algorithm.clip_high": 0.28})

    Attributes:
        algo: the algorithm's registered name (``--algo``).
        algorithm: its config; ``None`` takes the algorithm's defaults.
        engine: the options of the rollout engine ``rollout.engine`` names (its registered options class;
            ``None`` takes their defaults).
        backend: the options of the training backend ``run.backend`` names (likewise).
    """

    algo: str = "grpo"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    algorithm: AlgorithmConfig | None = None
    engine: Any = None
    backend: Any = None

    def __post_init__(self) -> None:
        for name, group_class in GROUPS.items():
            if not isinstance(getattr(self, name), group_class):
                raise ValueError(f"{name} must be a {group_class.__name__}, got {type(getattr(self, name)).__name__}")
        for group, (choice, option_class) in self.chosen_groups().items():
            value = getattr(self, group)
            if value is None:
                setattr(self, group, option_class())
            elif not isinstance(value, option_class):
                raise ValueError(f"{choice} takes a {option_class.__name__}, got a {type(value).__name__}")
        self.validate()

    def chosen_groups(self) -> dict[str, tuple[str, type]]:
        """The groups whose class a choice decides: ``{group: (the choice as written, its class)}`` for
        ``algorithm`` (``algo``), ``engine`` (``rollout.engine``) and ``backend`` (``run.backend``).

        Raises:
            UnknownNameError: a choice names nothing registered (one line, with the known names).
        """
        classes = _choice_classes(self.algo, self.rollout.engine, self.run.backend)
        return {"algorithm": (f"algo {self.algo!r}", classes["algorithm"]),
                "engine": (f"rollout.engine {self.rollout.engine!r}", classes["engine"]),
                "backend": (f"run.backend {self.run.backend!r}", classes["backend"])}

    def updated(self, changes: Mapping[str, Any]) -> TrainConfig:
        """A copy with ``{"group.field": value}`` changes applied (``"algo"`` too); a change of choice
        (``algo``, ``rollout.engine``, ``run.backend``) resets the group it decides to the new choice's
        defaults before that group's changes. Every value is checked as on construction.

        Raises:
            ValueError: a key names no group or field.
        """
        algo = changes.get("algo", self.algo)
        engine, backend = changes.get("rollout.engine", self.rollout.engine), changes.get("run.backend", self.run.backend)
        classes = _choice_classes(algo, engine, backend)
        new_choice = {"algorithm": algo != self.algo, "engine": engine != self.rollout.engine, "backend": backend != self.run.backend}
        groups: dict[str, Any] = {name: getattr(self, name) for name in (*GROUPS, *CHOSEN_GROUPS)}
        edits: dict[str, dict[str, Any]] = {}
        for key, value in changes.items():
            if key == "algo":
                continue
            group, _, name = key.partition(".")
            known = {f.name for f in dataclasses.fields(classes.get(group) or groups[group])} if group in groups else set()
            if name not in known:
                raise ValueError(f"unknown config field {key!r}: use group.field with a group of {', '.join(groups)}")
            edits.setdefault(group, {})[name] = value
        for group, obj in groups.items():
            if new_choice.get(group):  # a new choice: its defaults, then the changes
                groups[group] = classes[group](**edits.get(group, {}))
            elif group in edits:
                groups[group] = dataclasses.replace(obj, **edits[group])
        return TrainConfig(algo, **groups)

    def as_dict(self) -> dict[str, Any]:
        """Plain values, as a recipe or ``config.json`` holds them."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """The config that :meth:`as_dict` (or a recipe's mapping) describes; missing groups and fields
        keep their defaults.

        Raises:
            ValueError: an unknown group or field.
        """
        values = dict(values)
        algo = values.pop("algo", "grpo")
        flat = {}
        for group, fields in values.items():
            if not isinstance(fields, Mapping):
                raise ValueError(f"config group {group!r} must be a mapping of fields, got {fields!r}")
            flat.update({f"{group}.{name}": value for name, value in fields.items()})
        return cls(algo).updated(flat)

    def validate(self) -> None:
        """Checks that span groups (each group checks its own fields when built)."""
        algorithm = self.algorithm
        if getattr(algorithm, "overlong_buffer", 0) > self.env.max_new_tokens:
            raise ValueError(f"algorithm.overlong_buffer must be in [0, env.max_new_tokens={self.env.max_new_tokens}], "
                             f"got {algorithm.overlong_buffer}")
        from agents.training.layout_checks import check_layout  # backend, ranks and engine: before any model loads
        check_layout(self)
        if self.run.stop_after is not None and self.run.stop_after > self.run.steps:
            raise ValueError(f"run.stop_after ({self.run.stop_after}) is past run.steps ({self.run.steps})")
        if self.model.lora_rank > 0:
            if self.warm_start.steps + self.warm_start.copy_steps > 0:
                raise ValueError("model.lora_rank trains adapters on a base that is also the reference, so a warm start cannot "
                                 "precede it: warm-start in a run of its own, then train its policy/ with --model.name")
            if getattr(algorithm, "critic", None) == "separate":
                raise ValueError("model.lora_rank with PPO's separate critic would copy the whole model for it: "
                                 "use --algorithm.critic head")
            if _same_path(self.model.name, os.path.join(self.run.output_dir, POLICY_DIR)):  # the export would replace the base
                raise ValueError(f"model.name {self.model.name!r} is this run's own policy/ folder, which its export "
                                 "replaces, and a LoRA run loads its base from model.name again on resume: copy the "
                                 "base elsewhere, or give another --run.output_dir")


def _same_path(a: str, b: str) -> bool:
    """Whether two folder names lead to the same place (``~`` expanded, relative to the working folder)."""
    return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))
