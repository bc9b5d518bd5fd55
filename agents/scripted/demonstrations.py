"""Scripted demonstrations for the supervised warm start, with an injected systematic mistake.

A demonstration follows a question's gold decomposition (one search per lookup, the parent's answer
substituted into the next query, then the gold answer) - or, for a multi-hop question not chosen to
take the second hop, it makes the *same* mistake every time: it answers right after the first search,
with that search's answer (the bridge entity). A question without a gold decomposition (real datasets
such as HotpotQA have none) is demonstrated by one search for the question itself, then the gold
answer. The mistake is systematic on purpose: a policy cloned
from such demonstrations answers 2-hop questions wrongly under greedy decoding, while the few
demonstrations that do search again keep that behaviour in its sampling distribution for RL to find.
Random noise instead would be averaged away by greedy decoding and show nothing RL adds.

Every demonstration is played through the environment (:func:`agents.scripted.agents.run_episode`): the
scripted text is encoded once per chunk and stepped as token ids, so a demonstration's ids, producers
and trained-on mask are the environment's own trajectory (token-in/token-out), observations included.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from agents.scripted.agents import DialectWriter, run_episode
from rewards.metrics import answer_in_text
from search_env.data.example import QAExample, SubQuestion
from search_env.trajectory import Trajectory

__all__ = ["DemonstrationAgent", "Demonstrations", "gold_in_results", "make_demonstrations"]


@dataclass
class Demonstrations:
    """Demonstration episodes and what they show.

    Attributes:
        trajectories: the environment's records, one per demonstration.
        lookups: per trajectory, how many searches its question's decomposition has.
        full: per trajectory, whether it followed the whole decomposition (False: it stopped after the
            first lookup and answered with the bridge entity).
    """

    trajectories: list[Trajectory]
    lookups: list[int]
    full: list[bool]

    @property
    def second_hop_share(self) -> float:
        """Share of the multi-hop demonstrations that searched past the first lookup (NaN when none)."""
        multi = [full for full, n in zip(self.full, self.lookups) if n > 1]
        return sum(multi) / len(multi) if multi else float("nan")

    def kept(self, keep: Callable[[Trajectory], bool]) -> Demonstrations:
        """The demonstrations ``keep`` accepts, with their make-up.

        Raises:
            ValueError: it accepts none (a warm start would have nothing to clone).
        """
        chosen = [i for i, trajectory in enumerate(self.trajectories) if keep(trajectory)]
        if self.trajectories and not chosen:
            raise ValueError(f"none of the {len(self.trajectories)} demonstrations was kept")
        return Demonstrations([self.trajectories[i] for i in chosen], [self.lookups[i] for i in chosen],
                              [self.full[i] for i in chosen])

    @property
    def mean_reward(self) -> float:
        """Mean episode reward (the share answered correctly under an exact-match reward)."""
        return sum(t.reward for t in self.trajectories) / max(len(self.trajectories), 1)


class DemonstrationAgent:
    """A scripted agent (see :class:`agents.scripted.agents.ScriptedAgent`) that writes only search calls and
    the answer, no reasoning text: the tiny demo policy is trained from scratch, so every token it must
    imitate costs rollout time and carries nothing for it.

    Args:
        full: follow every lookup of the decomposition; False stops after the first lookup and answers
            with its answer (the systematic mistake; a 1-hop question is answered correctly either way).
    """

    def __init__(self, full: bool) -> None:
        self.full = full

    def start(self, example: QAExample) -> None:
        lookups = _lookups(example)
        self._answers = {n.label: n.answer for n in example.decomposition}
        self._queue = lookups if self.full else lookups[:1]
        self._final = example.golden_answers[0] if self.full or len(lookups) == 1 else lookups[0].answer

    def next_text(self, writer: DialectWriter, observation_text: str) -> str | None:
        if self._queue:
            node = self._queue.pop(0)
            return writer.call(_substitute(node.query, self._answers))
        return writer.answer(self._final)


def make_demonstrations(
    env: Any,
    examples: Sequence[QAExample],
    n: int,
    *,
    second_hop_rate: float,
    seed: int = 0,
) -> Demonstrations:
    """Play ``n`` demonstrations in ``env`` (a :class:`search_env.SearchQAEnv`, wrapped or not).

    Questions are taken from ``examples`` in a seeded shuffled order (cycling when ``n`` is larger).
    Of the multi-hop ones, exactly ``round(second_hop_rate * count)`` - a seeded choice - follow the
    whole decomposition; the others stop after the first lookup. An example without a gold decomposition
    counts as one lookup: a search for its question, then its first gold answer.
    """
    if not 0.0 <= second_hop_rate <= 1.0:
        raise ValueError(f"second_hop_rate must be in [0, 1], got {second_hop_rate}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n and not examples:
        raise ValueError("no examples to demonstrate")
    for example in examples:
        if not _lookups(example):
            raise ValueError(f"example {example.id!r} has a gold decomposition without a search to demonstrate")
        if not example.golden_answers:
            raise ValueError(f"example {example.id!r} has no gold answer to demonstrate")
    rng = random.Random(f"searchqa-demonstrations/{seed}")
    order = list(examples)
    rng.shuffle(order)
    chosen = [order[i % len(order)] for i in range(n)]
    lookups = [len(_lookups(ex)) for ex in chosen]
    multi = [i for i in range(n) if lookups[i] > 1]
    searched = set(rng.sample(multi, round(second_hop_rate * len(multi))))
    full = [lookups[i] == 1 or i in searched for i in range(n)]
    trajectories = [
        run_episode(env, DemonstrationAgent(full=full[i]), options={"example": ex}) for i, ex in enumerate(chosen)
    ]
    return Demonstrations(trajectories, lookups, full)


def gold_in_results(trajectory: Trajectory, decode: Callable[[Sequence[int]], str]) -> bool:
    """Whether a gold answer (SQuAD-normalised) is in the search results the episode read, ``decode``
    turning their token ids into text: a demonstration that answers from its results teaches a pretrained
    model to copy the answer out of a passage, where one whose results lack it teaches it to answer from
    memory (what a small model does badly)."""
    results = " ".join(decode(trajectory.token_ids[span.start:span.end]) for span in trajectory.spans
                       if span.kind == "result")
    return answer_in_text(results, trajectory.golden_answers)


def _lookups(example: QAExample) -> list[SubQuestion]:
    """The decomposition's search nodes in order (a comparison's or yes/no check's final step is not one);
    without a decomposition, one search for the question itself."""
    if not example.decomposition:
        return [SubQuestion("A", example.question, example.golden_answers[0] if example.golden_answers else "")]
    return [node for node in example.decomposition if node.source is not None or not node.parents]


def _substitute(query: str, answers: dict[str, str]) -> str:
    for label, answer in answers.items():
        query = query.replace("{" + label + "}", answer)
    return query
