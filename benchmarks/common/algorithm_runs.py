"""One run of the RL algorithm benchmark (:mod:`benchmarks.algorithms`) as it is recorded: the metrics it
records, a trainer callback that fills the record step by step (with the KL of each step's sampling policy to
the warm start), and the record kept in the run's folder so that a later command with the same settings
takes it instead of training again."""
from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from agents.training.callbacks import Callback

if TYPE_CHECKING:
    from agents.policies.policy import HFPolicy
    from agents.training.config import TrainConfig
    from agents.training.evaluation import EvalResult
    from agents.training.result import TrainResult
    from agents.training.trainer import Trainer
    from search_env.trajectory import Trajectory

__all__ = ["COLLAPSE_FRACTIONS", "METRICS", "RECORD_FILE", "AlgorithmCurve", "RunRecord", "finished_run", "kl_to_reference",
           "save_finished_run"]

#: A run collapses when the rolling mean of the metric stays below this share of its peak to the end
#: (:mod:`benchmarks.common.collapse`): reward halved; entropy down to a fifth, a nearly deterministic policy
#: (entropy falls as any policy learns, so its rule is stricter).
COLLAPSE_FRACTIONS = {"reward": 0.5, "entropy": 0.2}

#: The metrics plotted and tabled: name -> (label, whether it is read from the held-out evaluations).
METRICS: dict[str, tuple[str, bool]] = {
    "reward": ("training reward (episode mean)", False),
    "heldout_em": ("held-out greedy EM", True),
    "heldout_em_2hop": ("held-out greedy EM, 2-hop questions", True),
    "searches": ("searches per episode", False),
    "zero_search_frac": ("share of episodes without a search", False),
    "response_tokens": ("agent tokens per episode", False),
    "kl": ("KL to the warm start (k3 per trained token)", False),
    "entropy": ("policy entropy (nats per trained token)", False),
}
#: Step metrics read from the trainer's metrics, by the name the record keeps, the trainer's name (the KL is
#: the callback's own).
_TRAINER_METRICS = {"reward": "reward", "searches": "searches", "zero_search_frac": "rollout/zero_search_frac",
                    "response_tokens": "response_tokens", "entropy": "entropy"}


def kl_to_reference(policy: HFPolicy, reference: HFPolicy, trajectories: Sequence[Trajectory], *, temperature: float,
                    rows_per_pass: int = 16) -> float | None:
    """Mean k3 estimate of KL(policy || reference) over the trained tokens of ``trajectories``, which
    ``policy`` sampled (log-probs at the sampling ``temperature``); ``None`` when no token is trained."""
    import torch

    from agents.learners.core import kl_estimate
    from agents.rollout.batch import build_batch

    batch = build_batch(trajectories, [str(i) for i in range(len(trajectories))], policy.codec.pad_id)
    device = next(policy.parameters()).device
    total, count = 0.0, 0
    with torch.no_grad():
        for part in batch.micro_batches(rows_per_pass):
            keep = part.trained_mask.bool().to(device)
            if not keep.any():
                continue
            args = (part.input_ids.to(device), part.attention_mask.to(device), part.position_ids.to(device))
            options = {"temperature": temperature, "from_column": part.first_trained_column}
            kl = kl_estimate(policy(*args, **options).logprobs, reference(*args, **options).logprobs, "k3")
            total += float(kl[keep].sum())
            count += int(keep.sum())
    return total / count if count else None


@dataclass
class RunRecord:
    """One algorithm's run at one seed.

    Attributes:
        steps: per training step, ``step``, the step metrics of :data:`METRICS` (``None`` where the step
            had none, e.g. no entropy in a step whose update had no trained tokens), ``episodes``, those
            rolled out for training up to and including this step (what a threshold cost in samples), and
            ``cpu_s``, the process CPU seconds of the run up to the end of this step (what it cost in compute).
        evaluations: per held-out evaluation, ``step``, ``stage`` (``"start"``, ``"final"`` or ``None``),
            ``heldout_em`` and ``heldout_em_2hop`` (greedy).
        episodes: episodes rolled out for training, all steps together.
        wall_s / cpu_s: the run's wall time and its process's CPU time, evaluations included.
        eval_wall_s: the wall time of its held-out evaluations.
        collapse: per metric of :data:`COLLAPSE_FRACTIONS`, the step it collapsed at (``None``: it did not).
    """

    algorithm: str
    seed: int
    output_dir: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    episodes: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    eval_wall_s: float = 0.0
    collapse: dict[str, int | None] = field(default_factory=dict)


class AlgorithmCurve(Callback):
    """A trainer callback filling a :class:`RunRecord`: the step metrics, the KL of each step's sampling
    policy to the policy the run started from (a frozen copy made when the run starts), the held-out
    evaluations and the run's times; it prints a progress line at each evaluation."""

    def __init__(self, record: RunRecord, log: Callable[[str], Any] = print) -> None:
        self.record = record
        self.log = log
        self._reference: HFPolicy | None = None
        self._kl: float | None = None
        self._started = (0.0, 0.0)
        self._eval_started = 0.0

    def on_run_start(self, trainer: Trainer) -> None:
        from agents.policies.policy import HFPolicy

        self._started = (time.perf_counter(), time.process_time())
        self._reference = HFPolicy(copy.deepcopy(trainer.policy.model), trainer.policy.codec).eval().requires_grad_(False)

    def on_rollout(self, trainer: Trainer, trajectories: Sequence[Trajectory]) -> None:
        assert self._reference is not None, "on_run_start makes the reference"
        self.record.episodes += len(trajectories)
        self._kl = kl_to_reference(trainer.policy, self._reference, trajectories, temperature=trainer.config.rollout.temperature)

    def on_update(self, trainer: Trainer, metrics: Mapping[str, Any]) -> None:
        point = {"step": trainer.step, **{name: _number(metrics.get(key)) for name, key in _TRAINER_METRICS.items()}, "kl": self._kl,
                 "episodes": self.record.episodes, "cpu_s": time.process_time() - self._started[1]}
        self.record.steps.append(point)

    def on_evaluation_start(self, trainer: Trainer, stage: str | None) -> None:
        self._eval_started = time.perf_counter()

    def on_evaluation(self, trainer: Trainer, stage: str | None, results: Mapping[str, EvalResult]) -> None:
        self.record.eval_wall_s += time.perf_counter() - self._eval_started
        greedy = {mode: r for mode, r in results.items() if mode == "greedy" or mode.startswith("greedy ")}
        episodes = sum(r.episodes for r in greedy.values())
        em = sum(r.em * r.episodes for r in greedy.values()) / episodes if episodes else None
        two_hop = greedy.get("greedy 2-hop")
        point = {"step": trainer.step, "stage": stage, "heldout_em": em, "heldout_em_2hop": two_hop.em if two_hop else None}
        self.record.evaluations.append(point)
        last = self.record.steps[-1] if self.record.steps and trainer.step > 0 else {}
        shown = (("reward", 3), ("entropy", 3), ("kl", 5)) if last else ()
        training = "".join(f", {name} {_fmt(last.get(name), digits)}" for name, digits in shown)
        self.log(f"[{self.record.algorithm} seed {self.record.seed}] step {trainer.step}/{trainer.config.run.steps}"
                 f"{' (' + stage + ')' if stage else ''}{training}, held-out greedy EM {_fmt(em)} (2-hop "
                 f"{_fmt(point['heldout_em_2hop'])}), {(time.perf_counter() - self._started[0]) / 60:.1f} min")

    def on_run_end(self, trainer: Trainer, result: TrainResult) -> None:
        self.record.wall_s = time.perf_counter() - self._started[0]
        self.record.cpu_s = time.process_time() - self._started[1]
        self._reference = None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"



#: A finished run's record, in its run folder: a later command with the same settings takes it instead of
#: training again (a stopped benchmark goes on where it was; seeds may be run by separate commands).
RECORD_FILE = "algorithm_record.json"


def finished_run(config: TrainConfig, window: int) -> RunRecord | None:
    """The record :func:`save_finished_run` left in ``config``'s run folder, when it was made with the same
    settings (the whole config, the warm start's folder included, and the collapse window); else ``None``."""
    path = Path(config.run.output_dir) / RECORD_FILE
    if not path.is_file():
        return None
    saved = json.loads(path.read_text(encoding="utf-8"))
    if saved.get("config") != json.loads(json.dumps(config.as_dict())) or saved.get("window") != window:
        return None
    return RunRecord(**saved["record"])


def save_finished_run(config: TrainConfig, record: RunRecord, window: int) -> Path:
    """Write ``record`` into its run folder with the settings it was made with (for :func:`finished_run`)."""
    path = Path(config.run.output_dir) / RECORD_FILE
    path.write_text(json.dumps({"config": config.as_dict(), "window": window, "record": asdict(record)}, indent=1) + "\n",
                    encoding="utf-8")
    return path
