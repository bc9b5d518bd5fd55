"""The settings every algorithm shares (the run's ``algorithm`` group); each algorithm's own config
subclasses :class:`AlgorithmConfig` beside the algorithm (:mod:`agents.learners.grpo`, ...).

Only loss and advantage settings live here. What the run samples, how it optimises and where it writes are
the trainer's groups (:mod:`agents.training.config`), so one algorithm config reads the same on a laptop
and on a cluster.
"""
from __future__ import annotations

from dataclasses import dataclass

from agents.learners.core import AGG_MODES, KL_ESTIMATORS

__all__ = ["AlgorithmConfig", "check_warmup", "warmup_steps"]


@dataclass
class AlgorithmConfig:
    """Loss settings shared by PPO, GRPO and REINFORCE++.

    Attributes:
        group_size: samples per question (GRPO compares a question's samples; PPO's seed recipe takes one).
        clip_low: the surrogate's ratio clip range is ``[1 - clip_low, 1 + clip_high]``.
        clip_high: see ``clip_low`` (DAPO's clip-higher raises it).
        dual_clip: the dual-clip constant c (> 1) for negative advantages; ``None``: off.
        kl_coef: weight of the KL to the reference policy; 0 disables the reference model.
        kl_estimator: ``k1``, ``k2`` or ``k3``.
        kl_clamp: clamp each token's KL estimate to ``[-kl_clamp, kl_clamp]``, as verl (``low_var_kl``, 10)
            and OpenRLHF clamp k3, so one token whose probability collapsed cannot dominate the step;
            ``None`` (the default, as the estimators always were here): only the log-ratio's ±20 guard.
        kl_in_reward: KL in the token reward (PPO's and REINFORCE++'s way) instead of a loss term (GRPO's).
        entropy_coef: entropy bonus.
        loss_agg_mode: ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum`` or
            ``seq-mean-token-sum-norm`` (Dr. GRPO's: divided by rows x budget, where verl's mode of
            that name divides by the budget alone; :func:`agents.learners.core.aggregate`).
        tis_cap: token-level truncated importance sampling against the rollout engine's log-probs: each
            trained token's policy-gradient loss is weighted by ``min(π_old / π_engine, tis_cap)``
            (:func:`agents.learners.core.rollout_correction`). ``None``: the rollout engine's default,
            resolved for the algorithm when the run is built while the config keeps ``None`` (off for an
            engine whose log-probs are the trainer's own, ``hf``; 2.0 otherwise, ``vllm``); ``0``: off
            whatever the engine.
        seq_mask_delta: drop (weight 0) the rows whose geometric-mean ratio π_old / π_engine over their
            trained tokens leaves ``[1 - δ, 1 + δ]``. ``None`` or ``0``: off (with any engine).
    """

    group_size: int = 8
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_clamp: float | None = None
    kl_in_reward: bool = False
    entropy_coef: float = 0.0
    loss_agg_mode: str = "token-mean"
    tis_cap: float | None = None
    seq_mask_delta: float | None = None

    def __post_init__(self) -> None:
        if self.loss_agg_mode not in AGG_MODES:
            raise ValueError(f"unknown loss_agg_mode {self.loss_agg_mode!r}; known: {', '.join(AGG_MODES)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown kl_estimator {self.kl_estimator!r}; known: {', '.join(KL_ESTIMATORS)}")
        if not 0.0 <= self.clip_low < 1.0 or self.clip_high < 0.0:
            raise ValueError(f"clip range needs 0 <= clip_low < 1 and clip_high >= 0, got {self.clip_low}, {self.clip_high}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or None to turn it off), got {self.dual_clip}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_clamp is not None and self.kl_clamp <= 0:
            raise ValueError(f"kl_clamp must be > 0 (or None to turn it off), got {self.kl_clamp}")
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.tis_cap is not None and not (0 <= self.tis_cap < float("inf")):
            raise ValueError(f"tis_cap must be a finite number >= 0 (0: off; None: the engine's default), got {self.tis_cap}")
        if self.seq_mask_delta is not None and not (0 <= self.seq_mask_delta < float("inf")):
            raise ValueError(f"seq_mask_delta must be a finite number >= 0 (0 or None: off), got {self.seq_mask_delta}")


def check_warmup(steps: int, ratio: float, name: str) -> None:
    """One-line errors for a warm-up given both ways, or out of range (``name``: the fields' stem)."""
    if steps < 0 or not 0.0 <= ratio <= 1.0:
        raise ValueError(f"{name}_steps must be >= 0 and {name}_ratio in [0, 1], got {steps}, {ratio}")
    if steps > 0 and ratio > 0:
        raise ValueError(f"give {name}_steps or {name}_ratio, not both")


def warmup_steps(steps: int, ratio: float, total_steps: int) -> int:
    """Training steps of a linear learning-rate warm-up: ``steps``, or ``ratio`` of the run's
    ``total_steps`` rounded down (verl's ``int(lr_warmup_steps_ratio * total_training_steps)``)."""
    return steps if steps > 0 else int(ratio * total_steps)
