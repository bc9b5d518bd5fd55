"""The RL algorithm benchmark's ladder of tasks (``python -m benchmarks.algorithms --ladder quick|full``): named
rungs, each a documented change of the demo's task, from easy to hard, and the two sizes the ladder runs at.

A rung changes the task reinforcement learning faces, never the policy it starts from: every rung of a
seed trains from the same warm start (the demo recipe's, on its 2-hop world, cached by
:mod:`benchmarks.common.warm_start_cache`), so a rung's runs differ from another rung's by the task alone,
and the warm start's minutes are paid once for the whole ladder: once per seed in the full ladder, once in
all in the quick one, whose seeds share seed 0's warm start and differ in the RL seed alone (so its
intervals say how RL varies from one warm start, the full ladder's how it varies with the warm start too).
A rung's changes are recipe changes (``GROUP.FIELD`` -> value, applied after the size's and before
``--set``) and, for retrieval noise, a probe that wraps every source of the rung's training and held-out
worlds (:class:`search_env.ProbeSource`: the held-out EM is then measured under the same noise).

``multi-source`` (the ``reasoning-search`` protocol's NL-DAG plans over several named sources) is not a
rung: the warm start's scripted demonstrations are written in the ``search-r1-compact`` dialect, so a
from-scratch policy would need a warm start of its own in the NL-DAG dialect, which the quick ladder's
budget does not hold; it was not tried.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from agents.training.data import RunData

__all__ = ["FULL", "LADDERS", "QUICK", "RUNGS", "LadderSize", "Probe", "Rung", "probed_data", "select_rungs"]


@dataclass(frozen=True)
class Probe:
    """Retrieval noise of a rung: ``share`` of the distinct queries get ``kind``'s answer
    (:data:`search_env.sources.probes.PROBES`) instead of the source's results, seeded by the run's seed."""

    kind: str
    share: float


@dataclass(frozen=True)
class Rung:
    """One task of the ladder.

    Attributes:
        name: its name in ``--rungs``, the output folder and the tables.
        changes: recipe changes (``GROUP.FIELD`` -> value) of its runs and held-out evaluation.
        why: what it tests, and why it is on the ladder (what was measured on it).
        probe: retrieval noise on its training and held-out sources (``None``: none).
    """

    name: str
    changes: Mapping[str, Any]
    why: str
    probe: Probe | None = None


RUNGS: tuple[Rung, ...] = (
    Rung("1hop", {"data.world_max_hops": 1},
         "single-lookup questions only: one search, copy the answer; the warm start answers every held-out 1-hop "
         "question already (EM 1.00 on 2hop's), so the rung shows an algorithm that unlearns, not a speed (quick "
         "ladder: every algorithm stays at 1.00; every group's rewards are equal, so the grouped ones do not move)"),
    Rung("2hop", {}, "the demo's task: 1- and 2-hop chain questions; the warm start answers 2-hop ones with the bridge "
         "entity, and RL must find the second search (quick ladder: grouped algorithms about two steps ahead of "
         "PPO and REINFORCE++, intervals touching)"),
    Rung("3hop", {"data.world_max_hops": 3},
         "1- to 3-hop chains: a third search the warm start never demonstrated, so rewards are sparser (quick "
         "ladder: the grouped algorithms reach EM 0.5 six to nine steps before PPO and REINFORCE++, intervals apart; "
         "so on the full ladder's five seeds)"),
    Rung("distractors", {"env.top_k": 1},
         "the 2-hop task with one passage per search instead of two: the query must rank the right passage "
         "first (the demo's recipe notes that one result trained worse than two)"),
    Rung("noisy", {}, "the 2-hop task where a third of the distinct queries find nothing (an empty probe source), "
         "training and held-out alike: a run's reward depends on searching again or guessing (quick ladder: GiGPO "
         "and REINFORCE++-baseline ahead of PPO and REINFORCE++ with intervals apart, the others between)",
         Probe("empty", 0.3)),
)
_BY_NAME = {r.name: r for r in RUNGS}


@dataclass(frozen=True)
class LadderSize:
    """How large the ladder's runs are.

    Attributes:
        name: ``quick`` or ``full`` (``--ladder``).
        changes: recipe changes of every rung's runs (before the rung's own and ``--set``), not of the warm
            start: the RL runs may train on a smaller world than the warm start's demonstrations came from.
        warm_start_changes: recipe changes of the warm start (before ``--set``).
        seeds: the model seeds run by default (``--seeds`` may give others).
        warm_start_seed: every seed trains from the warm start of this seed (the RL seed still differs);
            ``None``: each seed from its own.
        budget: what the size costs, and how that was found (measured or estimated).
        rungs: the rungs run when ``--rungs`` is not given (``--rungs all``: every rung), in the ladder's order.
        rung_changes: per rung, recipe changes of its runs at this size (after the rung's own, before
            ``--set``): a rung whose algorithms had separated well before the size's last step runs
            only as long as measurement showed it needs.
    """

    name: str
    changes: Mapping[str, Any]
    warm_start_changes: Mapping[str, Any]
    seeds: Sequence[int]
    warm_start_seed: int | None
    budget: str
    rungs: Sequence[str]
    rung_changes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


QUICK = LadderSize(
    "quick",
    {"run.steps": 30, "eval.every": 3, "eval.questions": 30, "rollout.questions_per_step": 8, "algorithm.group_size": 8,
     "rollout.env_worker": False},
    {}, (0, 1, 2), 0,
    "measured on the idle 2-core CPU as one command from an empty cache (two jobs, the cores free): 27.3 min wall, "
    "the demo's warm start 6.1 of them, then 3hop's 27 runs of 21 steps and noisy's 27 runs of 27 steps "
    "(benchmarks/RESULTS.md). The default rungs are the two on which the best and the worst algorithms' "
    "intervals were apart at 30 steps; they run shorter because those intervals were apart by then (3hop's "
    "by step 21, noisy's by step 27: the same runs cut there, and then measured so). 2hop, 1hop and distractors "
    "run 30 steps with --rungs (all: every rung): 11.7, 7.4 and 11.5 min each beside other work",
    ("3hop", "noisy"),
    {"3hop": {"run.steps": 21}, "noisy": {"run.steps": 27}})

FULL = LadderSize(
    "full",
    {"run.steps": 40, "eval.every": 2, "eval.questions": 30, "rollout.questions_per_step": 8, "algorithm.group_size": 8,
     "rollout.env_worker": False},
    {}, (0, 1, 2, 3, 4), None,
    "the quick size's runs with five seeds, each from a warm start of its own, ten steps longer and evaluated "
    "every 2 steps (steps to a threshold to the nearest 2); measured on 3hop, --jobs 2, on the 2-core CPU (load 2-4): "
    "four warm starts made two at a time in about 27 min, then its 45 runs in 38 min (61 process CPU min); the five "
    "rungs estimated from it at about 3.5 h with the warm starts (benchmarks/RESULTS.md)",
    tuple(r.name for r in RUNGS))

LADDERS: dict[str, LadderSize] = {s.name: s for s in (QUICK, FULL)}


def select_rungs(names: Sequence[str] | None, size: LadderSize | None = None) -> list[Rung]:
    """The rungs named (in the ladder's order, each once; ``all``: every rung); for ``None``, ``size``'s
    default rungs, or every rung without a size.

    Raises:
        ValueError: a name that is no rung (one line, with the rungs there are).
    """
    if names is None:
        names = size.rungs if size is not None else ["all"]
    if "all" in names:
        return list(RUNGS)
    unknown = [n for n in names if n not in _BY_NAME]
    if unknown:
        raise ValueError(f"--rungs {' '.join(unknown)}: no such rung; known: {', '.join(_BY_NAME)} (or all)")
    return [r for r in RUNGS if r.name in names]


def probed_data(data: RunData, probe: Probe, seed: int) -> RunData:
    """``data`` with every training and held-out source wrapped in a :class:`search_env.ProbeSource` of
    ``probe`` (seeded by ``seed``); closing the result closes ``data``'s sources."""
    from agents.training.data import RunData
    from search_env import ProbeSource

    def wrap(part: Any) -> Any:
        if part is None:
            return None
        questions, sources = part
        return questions, {name: ProbeSource(s, probe.kind, share=probe.share, seed=seed) for name, s in sources.items()}

    return RunData(wrap(data.train), wrap(data.held_out), dict(data.settings))
