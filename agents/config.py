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
    """What every trainer run needs, whatever the algorithm.

    Model and data:
        model: a local transformers model folder, ``"smollm2"`` (the offline SmolLM2-135M-Instruct gguf), or
            ``"tiny"`` (a small Llama over the tokenizer, trained from scratch).
        tokenizer: a tokenizer path; ``None`` uses the model's (the built-in tokenizer for ``"tiny"``).
        tiny_layers / tiny_hidden / tiny_heads: size of the ``"tiny"`` model.
        protocol: the environment's protocol (tag dialect, prompt, reward preset).
        dataset: ``"synthetic"`` or a FlashRAG jsonl / Search-R1 parquet path.
        corpus: a ``{id, title, text}`` jsonl searched with BM25 (``retriever="dense"`` for a dense index).
        world_seed / world_max_hops / world_size: the synthetic world trained on.
        eval_dataset / eval_world_seed: held-out questions (default: a synthetic world with another seed,
            so names are new and the policy must search).
        reward: a reward preset overriding the protocol's; ``reward_stages`` a list of ``[start_step, preset]``
            pairs (R1-Searcher's two stages) that follow the trainer's step.
        evidence_model: the answer model of R-Search's evidence reward (``r-search``): ``"smollm2"`` (the
            offline SmolLM2-135M-Instruct) or a local transformers folder, of another family than the
            policy as in R-Search; ``None``: the evidence F1 is skipped (scored 0).

    Rollout:
        steps: policy updates (each after one rollout).
        questions_per_step: distinct questions per rollout; ``group_size`` samples each.
        max_new_tokens / max_context / max_turns: episode budgets.
        temperature / top_p: sampling; log-probs are taken at this temperature.

    Optimisation:
        learning_rate, weight_decay, adam_betas, max_grad_norm, warmup_steps: AdamW and its schedule.
        update_epochs: passes over each rollout; ``mini_batch_size`` rows per optimiser step (0: the
            whole rollout); ``micro_batch_size`` rows per forward pass (gradient accumulation).
        clip_low / clip_high: the surrogate's ratio clip range ``[1 - clip_low, 1 + clip_high]``;
            ``dual_clip``: the dual-clip constant c (> 1) for negative advantages, ``None`` off.
        kl_coef / kl_estimator / kl_in_reward: KL to the reference policy (k1, k2 or k3), in the reward or
            as a loss term; 0 disables the reference model.
        entropy_coef: entropy bonus.
        loss_agg_mode: ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum`` or
            ``seq-mean-token-sum-norm``.

    Warm start, evaluation, output:
        sft_steps / sft_examples / sft_lr / sft_second_hop_rate: supervised warm start on scripted
            trajectories (0 steps: none); demonstrations take the second hop with this probability.
        eval_every / eval_questions: evaluation on held-out questions (greedy and sampled).
        save_every / output_dir / resume: checkpoints (atomic) and exact resume.
        stop_after: end this invocation after this many steps in all (checkpointed; a later ``resume``
            continues to ``steps``), e.g. to run in slices on a machine that is lent for a while.
        seed / device / num_threads / log_every / tensorboard.
        progress: a progress bar; ``None`` shows it when stderr is a terminal.
    """

    algo: str = ""
    # model and data
    model: str = "tiny"
    tokenizer: str | None = None
    tiny_layers: int = 2
    tiny_hidden: int = 128
    tiny_heads: int = 4
    protocol: str = "search-r1"
    dataset: str = "synthetic"
    corpus: str | None = None
    retriever: str = "bm25"
    world_seed: int = 0
    world_max_hops: int = 2
    world_size: int = 1000
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
