"""Training configuration shared by every algorithm; each algorithm's config subclasses it.

One dataclass per algorithm (``PPOConfig``, ``GRPOConfig``, ``ReinforcePPConfig``,
``ReinforcePPBaselineConfig`` in :mod:`agents.learners`), each a flat set of documented fields, so a
recipe is one YAML file and every field can be overridden on the command line.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TrainConfig"]


@dataclass
class TrainConfig:
    """What every trainer run needs, whatever the algorithm (one entry per field, so ``--help`` shows each).

    Attributes:
        algo: the algorithm (``ppo``, ``grpo``, ``reinforce++``, ``reinforce++-baseline``); set by each
            algorithm's config class.
        model: a local transformers model folder, ``"smollm2"`` (the offline SmolLM2-135M-Instruct gguf), or
            ``"tiny"`` (a small Llama over the tokenizer, trained from scratch).
        tokenizer: a tokenizer path; ``None`` uses the model's (the built-in tokenizer for ``"tiny"``).
        tiny_layers: layers of the ``"tiny"`` model.
        tiny_hidden: hidden size of the ``"tiny"`` model.
        tiny_heads: attention heads of the ``"tiny"`` model.
        tiny_head_dim: width of each head of the ``"tiny"`` model (``None``: ``tiny_hidden // tiny_heads``).
        protocol: the environment's protocol (tag dialect, prompt, reward preset).
        dataset: ``"synthetic"`` or a FlashRAG jsonl / Search-R1 parquet path.
        corpus: the passages a real dataset is searched in: a ``{id, title, text}`` jsonl.
        retriever: ``bm25`` or ``dense`` (an encoder and faiss index over ``corpus``).
        world_seed: seed of the synthetic world trained on.
        world_max_hops: most lookups a synthetic question takes (1: single-hop questions only).
        world_size: questions of the synthetic world trained on.
        world_scale: entities of the synthetic worlds (trained on and held out), as a multiple of the default
            world's: in a larger world names repeat less, so a small model cannot fit its demonstrations by
            memorising names instead of copying them.
        eval_dataset: held-out questions of a real dataset (default: its last ``eval_questions`` questions).
        eval_world_seed: seed of the held-out synthetic world (names are new, so the policy must search).
        reward: a reward preset overriding the protocol's.
        reward_stages: ``[start_step, preset]`` pairs (R1-Searcher's two stages) that follow the trainer's step.
        evidence_model: the answer model of R-Search's evidence reward (``r-search``): ``"smollm2"`` (the
            offline SmolLM2-135M-Instruct) or a local transformers folder, of another family than the
            policy as in R-Search; ``None``: the evidence F1 is skipped (scored 0).
        steps: policy updates (each after one rollout).
        questions_per_step: distinct questions per rollout.
        group_size: samples per question.
        max_new_tokens: agent tokens per episode.
        max_context: tokens per episode, prompt and results included.
        max_turns: searches per episode (None: the protocol's).
        env_worker: step the training episodes in a forked worker process (Linux), handing each episode's
            chunk over as it ends, so the environment and search run on another core while the policy
            decodes the other episodes (:class:`search_env.worker.EnvWorker`); the episodes are the same.
            Worth it when a core is free: it takes a second one.
        temperature: sampling temperature; log-probs are taken at this temperature.
        top_p: nucleus sampling (1.0: off).
        learning_rate: AdamW's learning rate.
        weight_decay: AdamW's weight decay.
        adam_betas: AdamW's betas.
        max_grad_norm: gradient-norm clipping (0: none).
        warmup_steps: optimiser steps of linear learning-rate warm-up (then constant).
        update_epochs: passes over each rollout.
        mini_batch_size: rows per optimiser step (0: the whole rollout).
        micro_batch_size: rows per forward pass (gradient accumulation; 0: the whole mini-batch).
        clip_low: the surrogate's ratio clip range is ``[1 - clip_low, 1 + clip_high]``.
        clip_high: see ``clip_low`` (DAPO's clip-higher raises it).
        dual_clip: the dual-clip constant c (> 1) for negative advantages; ``None``: off.
        kl_coef: weight of the KL to the reference policy; 0 disables the reference model.
        kl_estimator: ``k1``, ``k2`` or ``k3``.
        kl_in_reward: KL in the token reward (else a loss term).
        entropy_coef: entropy bonus.
        loss_agg_mode: ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum`` or
            ``seq-mean-token-sum-norm``.
        sft_steps: steps of supervised warm start on scripted demonstrations (0: none).
        sft_copy_steps: steps of the copy warm-up before them (:mod:`agents.copy_warmup`), for a model
            trained from scratch (0: none).
        sft_examples: demonstrations played for the warm start.
        sft_lr: the warm start's learning rate.
        sft_second_hop_rate: share of multi-hop demonstrations that take the second hop.
        eval_every: evaluate on held-out questions (greedy and sampled) every this many steps (0: only
            before and after training).
        eval_questions: held-out questions per evaluation (0: no evaluation).
        save_every: write a checkpoint every this many steps (one is always written at the end).
        output_dir: where logs, curve, config and checkpoint go.
        resume: continue the run whose checkpoint is in ``output_dir``, exactly where it stopped.
        stop_after: end this invocation after this many steps in all (checkpointed; a later ``resume``
            continues to ``steps``), e.g. to run in slices on a machine that is lent for a while.
        seed: seed of everything random in the run (model init, data order, sampling).
        device: torch device of the models.
        num_threads: torch's CPU threads.
        log_every: write the step metrics every this many steps.
        tensorboard: also write TensorBoard events.
        progress: a progress bar; ``None``: when stderr is a terminal (or ``$SEARCHQA_PROGRESS`` says).
    """

    algo: str = ""
    # model and data
    model: str = "tiny"
    tokenizer: str | None = None
    tiny_layers: int = 2
    tiny_hidden: int = 128
    tiny_heads: int = 4
    tiny_head_dim: int | None = None
    protocol: str = "search-r1"
    dataset: str = "synthetic"
    corpus: str | None = None
    retriever: str = "bm25"
    world_seed: int = 0
    world_max_hops: int = 2
    world_size: int = 1000
    world_scale: int = 1
    eval_dataset: str | None = None
    eval_world_seed: int = 1
    reward: str | None = None
    reward_stages: list[list] | None = None
    evidence_model: str | None = None
    # rollout
    steps: int = 100
    questions_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 256
    max_context: int = 2048
    max_turns: int | None = None
    env_worker: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    # optimisation
    learning_rate: float = 1e-6
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    update_epochs: int = 1
    mini_batch_size: int = 0
    micro_batch_size: int = 8
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in_reward: bool = False
    entropy_coef: float = 0.0
    loss_agg_mode: str = "token-mean"
    # warm start, evaluation, output
    sft_steps: int = 0
    sft_copy_steps: int = 0
    sft_examples: int = 512
    sft_lr: float = 1e-3
    sft_second_hop_rate: float = 1.0
    eval_every: int = 0
    eval_questions: int = 64
    save_every: int = 0
    output_dir: str = "runs/latest"
    resume: bool = False
    stop_after: int | None = None
    seed: int = 0
    device: str = "cpu"
    num_threads: int = 1
    log_every: int = 1
    tensorboard: bool = True
    progress: bool | None = None
