"""The finished runs an output folder of the RL algorithm benchmark (:mod:`benchmarks.algorithms`) holds,
so that its table covers every one of them, not only the runs of the command that wrote it last.

Commands may add algorithms or seeds to a folder one at a time (``--import my_algo --algorithms grpo mine``
after a run of all nine). Each run's folder ``runs/<algorithm>/seed<n>`` keeps its record
(:data:`~benchmarks.common.algorithm_runs.RECORD_FILE`) with the config it ran. A run is of the same task as
this command's when its config matches theirs outside what makes one algorithm's run: the algorithm and its
own settings, how the episodes of a step are split into questions and answers, the seed, the run's folder
and the warm start's folder; what those leave to compare is compared too (the shared loss settings of
:data:`COMPARED_ALGORITHM_FIELDS`, the episodes per step, and the warm start's settings but its seed, read
from the warm-start cache). A run of other settings is named in the table's header as left out, with the
first setting that differs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from benchmarks.common.algorithm_runs import RECORD_FILE, RunRecord
from benchmarks.common.warm_start_cache import RECORD_FILE as WARM_START_FILE

if TYPE_CHECKING:
    from agents.training.config import TrainConfig

__all__ = ["COMPARED_ALGORITHM_FIELDS", "FolderRuns", "folder_runs"]

#: ``algorithm`` fields every variant takes from the shared recipe unchanged: two runs of one task agree on them.
COMPARED_ALGORITHM_FIELDS = ("kl_coef", "entropy_coef", "kl_clamp", "tis_cap", "seq_mask_delta")

#: Settings that differ from one algorithm's run of a task to another's (``algorithm`` apart from
#: :data:`COMPARED_ALGORITHM_FIELDS`; the episodes per step and the warm start are compared on their own).
_RUN_OWN = frozenset({"algo", "model.name", "rollout.questions_per_step", "run.seed", "run.output_dir"})


@dataclass(frozen=True)
class FolderRuns:
    """The finished runs of a folder.

    Attributes:
        shown: the records of this command's task: its own (``own`` of them, first, in order), then those
            finished earlier.
        left_out: each run of other settings, ``ALGORITHM seed N: SETTING VALUE (here VALUE)``.
        own: how many of ``shown`` this command ran or took as finished.
    """

    shown: list[RunRecord]
    left_out: list[str]
    own: int

    def header(self) -> list[str]:
        """The lines that say which runs the folder's table shows (none when it shows this command's only)."""
        earlier = self.shown[self.own:]
        lines = []
        if earlier:
            names = ", ".join(dict.fromkeys(f"{r.algorithm}" for r in earlier))
            lines.append(f"Every finished run of this task in the folder: this command's {self.own} and {len(earlier)} "
                         f"finished earlier ({names}).")
        if self.left_out:
            listed = "; ".join(self.left_out[:3]) + ("; ..." if len(self.left_out) > 3 else "")
            lines.append(f"Not shown: {len(self.left_out)} finished run{'s' if len(self.left_out) > 1 else ''} in the folder "
                         f"of other settings ({listed}).")
        return lines


def folder_runs(runs_dir: Path, like: TrainConfig, window: int, own: Sequence[RunRecord]) -> FolderRuns:
    """The finished runs under ``runs_dir`` (``<algorithm>/seed<n>/``) of the task of ``like`` (one of this
    command's run configs) with collapse window ``window``, after this command's ``own`` records."""
    expected = {**_task(json.loads(json.dumps(like.as_dict()))), "collapse window": window}
    seen = {str(Path(r.output_dir).resolve()) for r in own}
    shown, left_out = list(own), []
    for path in sorted(runs_dir.glob(f"*/seed*/{RECORD_FILE}")):
        if str(path.parent.resolve()) in seen:
            continue
        saved = json.loads(path.read_text(encoding="utf-8"))
        record = RunRecord(**saved["record"])
        task = {**_task(saved["config"]), "collapse window": saved.get("window")}
        differs = next((key for key in [*expected, *task] if task.get(key) != expected.get(key)), None)
        if differs is None:
            shown.append(record)
        elif differs == "warm start":
            left_out.append(f"{record.algorithm} seed {record.seed}: another warm start, or one no longer in the cache")
        else:
            left_out.append(f"{record.algorithm} seed {record.seed}: {differs} {json.dumps(task.get(differs))} "
                            f"(here {json.dumps(expected.get(differs))})")
    return FolderRuns(shown, left_out, len(own))


def _task(config: dict[str, Any]) -> dict[str, Any]:
    """A run config's settings that its task's runs share (flat, ``group.field``), with the episodes per
    step and the warm start's settings but its seed."""
    flat: dict[str, Any] = {}
    for group, values in config.items():
        for name, value in (values.items() if isinstance(values, dict) else [(None, values)]):
            key = group if name is None else f"{group}.{name}"
            if key in _RUN_OWN or (group == "algorithm" and name not in COMPARED_ALGORITHM_FIELDS):
                continue
            flat[key] = value
    flat["episodes per step"] = config["rollout"]["questions_per_step"] * config["algorithm"]["group_size"]
    flat["warm start"] = _warm_start(Path(config["model"]["name"]))
    return flat


def _warm_start(policy_dir: Path) -> Any:
    """The settings of the cached warm start at ``policy_dir`` but its seed (``None``: not in the cache)."""
    record = policy_dir.parent / WARM_START_FILE
    if not record.is_file():
        return None
    key = json.loads(record.read_text(encoding="utf-8")).get("key", {})
    return {name: value for name, value in key.items() if name != "run.seed"}

