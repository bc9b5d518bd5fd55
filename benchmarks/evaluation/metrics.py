"""What one episode scores, and the means that make a row of the results table.

Every figure is read from the episode's trajectory (the record a learner trains on). The answer is the
one the episode's reward extracted (:func:`agents.training.evaluation.predicted_answer`), so each
dialect's answer is read by its own rules, and it is compared with every gold alias under SQuAD
normalisation (:mod:`rewards.metrics`):

- ``em``: the answer equals some gold; ``f1``: token F1, best over the golds (HotpotQA's yes/no rule);
- ``cover_em``: some gold is a substring of the answer, the "cover exact match" (subEM, FlashRAG's
  ``acc``) that Search-R1-style tables report, which forgives a correct answer wrapped in words
  ("the city of Paris"). Not :func:`rewards.cover_exact_match`, R1-Searcher's reward, which asks for
  every gold token anywhere among the answer's tokens;
- ``judge``: an LLM judge's score, when the run has one;
- ``reward``: the protocol's reward; ``searches``: search calls; ``failed_searches``: those that failed or
  timed out (an error observation in place of passages: an EM beside them says little about the agent,
  much about the retriever, so no table leaves them out); ``no_search``: 1 for an episode without a
  search call (its mean, the share of such episodes, tells an agent that answers from memory under a
  protocol built for searching from one that searches little); ``agent_tokens``: tokens the agent
  wrote; ``retrieved_tokens``: tokens of the result blocks the environment appended; ``seconds``:
  the wall time of the episode's batch over its size; ``gold_recall``: gold passages among those
  retrieved (None for a question with no gold passages).
"""
from __future__ import annotations

import statistics
from typing import Iterable, Mapping, Sequence

from agents.training.health import search_failures
from rewards.metrics import as_gold_list, exact_match, f1_score, normalize_squad
from search_env.trajectory import Trajectory

__all__ = ["EPISODE_METRICS", "cover_em", "episode_metrics", "mean_metrics"]

#: The per-episode figures, in the order tables show them.
EPISODE_METRICS = ("em", "f1", "cover_em", "judge", "reward", "searches", "failed_searches", "no_search", "agent_tokens",
                   "retrieved_tokens", "seconds", "gold_recall")


def cover_em(prediction: str, golden_answers: str | Iterable[str]) -> float:
    """1.0 if some SQuAD-normalised gold is a substring of the normalised prediction, else 0.0.

    A gold that normalises to nothing covers nothing (it would be a substring of every answer)."""
    answer = normalize_squad(prediction)
    return float(any(gold and gold in answer for gold in map(normalize_squad, as_gold_list(golden_answers))))


def episode_metrics(trajectory: Trajectory, answer: str, gold_passage_ids: Sequence[str], seconds: float) -> dict[str, float | None]:
    """The figures of one episode whose extracted answer is ``answer``, all but ``judge``, which needs a
    model (see the module docstring)."""
    golds = trajectory.golden_answers
    found = {pid for call in trajectory.tool_calls for pid in call.passage_ids}
    gold = set(gold_passage_ids)
    return {
        "em": exact_match(answer, golds),
        "f1": f1_score(answer, golds),
        "cover_em": cover_em(answer, golds),
        "reward": float(trajectory.reward),
        "searches": float(len(trajectory.tool_calls)),
        "failed_searches": search_failures([trajectory])["searches/failed"],
        "no_search": float(not trajectory.tool_calls),
        "agent_tokens": float(trajectory.agent_mask.sum()),
        "retrieved_tokens": float(sum(span.end - span.start for span in trajectory.spans if span.kind == "result")),
        "seconds": float(seconds),
        "gold_recall": len(gold & found) / len(gold) if gold else None,
    }


def mean_metrics(episodes: Sequence[Mapping[str, float | None]]) -> dict[str, float | None]:
    """Each metric's mean over the episodes that have it (None: no episode has it, e.g. no judge)."""
    means: dict[str, float | None] = {}
    for name in EPISODE_METRICS:
        values = [m[name] for m in episodes if m.get(name) is not None]
        means[name] = statistics.fmean(values) if values else None  # type: ignore[arg-type]
    return means
