"""Questions over a synthetic world, each with gold answers, gold passages and a gold decomposition.

Three kinds, recorded as ``metadata["type"]``:

- ``"chain"``: 1..4 lookups, each on the previous answer ("Where was the founder of Zarbo Corp
  born?"). Decomposition: one node per lookup, node i+1 refers to node i's answer as ``{A}``.
- ``"comparison"``: two independent lookups of the same attribute and a final compare step ("Which
  was founded earlier, X or Y?"). Decomposition: A and B (no parents), then C with parents A and B.
- ``"yes_no"``: a chain whose last fact is checked against a candidate value ("Was the founder of
  Zarbo Corp born in Tarsk?"); the candidate is right half of the time, otherwise mostly a
  near-duplicate of the right value when the world has one. Decomposition: the chain's lookups, then a
  final check step.

Lookup nodes name the source that holds their fact; the final compare and check steps are reasoning
over the parents' answers, not searches, so their ``source`` is None. ``gold_passage_ids[i]`` is the
passage that answers the i-th lookup node, in decomposition order. Metadata: ``hops`` (the number of
lookups; 2 for comparisons), ``type``, ``seed``, ``difficulty`` and ``relations`` (the relation of each
lookup, e.g. "company.founded_by").
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from search_env.data.example import QAExample, SubQuestion
from search_env.synthetic.schema import RELATIONS, RELATIONS_BY_SUBJECT, Relation

if TYPE_CHECKING:
    from search_env.synthetic.world import FactValue, SyntheticWorld

LABELS = "ABCDEFGH"
_TRIES_PER_QUESTION = 200


@dataclass
class _Draft:
    question: str
    answer: str
    kind: str
    hops: int
    nodes: list[SubQuestion] = field(default_factory=list)
    passage_ids: list[str] = field(default_factory=list)
    relations: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Step:
    subject: str
    relation: Relation
    value: FactValue


def generate_questions(world: SyntheticWorld, n_questions: int, rng: random.Random) -> list[QAExample]:
    """Draw ``n_questions`` distinct questions: the mix of kinds and the spread of hop counts follow the
    world's config exactly (rounded), the order is shuffled. Raises ValueError when the world is too
    small to hold that many distinct questions."""
    config = world.config
    n_comparison = round(n_questions * config.comparison_fraction)
    n_yes_no = round(n_questions * config.yes_no_fraction)
    n_chain = n_questions - n_comparison - n_yes_no
    plan = (
        [("chain", 1 + i % config.max_hops) for i in range(n_chain)]
        + [("yes_no", 1 + i % config.max_hops) for i in range(n_yes_no)]
        + [("comparison", 2)] * n_comparison
    )
    maker = _QuestionMaker(world, rng)
    seen: set[str] = set()
    drafts: list[_Draft] = []
    for kind, hops in plan:
        for _ in range(_TRIES_PER_QUESTION):
            draft = maker.comparison() if kind == "comparison" else maker.chain(hops, yes_no=kind == "yes_no")
            if draft is not None and draft.question not in seen:
                seen.add(draft.question)
                drafts.append(draft)
                break
        else:
            raise ValueError(
                f"could not draw {n_questions} distinct questions ({kind}, {hops} hops) from this world; "
                "raise the entity counts in WorldConfig or ask for fewer questions"
            )
    rng.shuffle(drafts)
    return [
        QAExample(
            id=f"synth-{world.seed}-d{world.difficulty}-{i:05d}",
            question=d.question,
            golden_answers=[d.answer],
            gold_passage_ids=d.passage_ids,
            decomposition=d.nodes,
            metadata={"hops": d.hops, "type": d.kind, "seed": world.seed, "difficulty": world.difficulty,
                      "relations": d.relations},
        )
        for i, d in enumerate(drafts)
    ]


class _QuestionMaker:
    """Draws one question at a time; returns None when a draw hits a dead end (the caller retries)."""

    def __init__(self, world: SyntheticWorld, rng: random.Random) -> None:
        self.world = world
        self.rng = rng
        self.names = list(world.entities)
        self.by_type = {t: world.entities_of(t) for t in RELATIONS_BY_SUBJECT}
        self.comparable = [r for r in RELATIONS if r.compare is not None]

    def _walk(self, hops: int) -> list[_Step] | None:
        """A random path of ``hops`` facts that never revisits an entity (else "the capital of the
        country where X lies" could be X itself)."""
        subject = self.rng.choice(self.names)
        visited = {subject}
        steps: list[_Step] = []
        for i in range(hops):
            relations = RELATIONS_BY_SUBJECT[self.world.entities[subject]]
            if i < hops - 1:
                relations = tuple(r for r in relations if r.target is not None)
            relation = self.rng.choice(relations)
            value = self.world.facts[subject][relation.name]
            if relation.target is not None:
                if value in visited:
                    return None
                visited.add(str(value))
            steps.append(_Step(subject, relation, value))
            subject = str(value)
        return steps

    def chain(self, hops: int, yes_no: bool) -> _Draft | None:
        steps = self._walk(hops)
        if steps is None:
            return None
        described = steps[0].subject
        for step in steps[:-1]:
            assert step.relation.phrase is not None  # _walk only takes entity relations before the last
            described = step.relation.phrase.format(x=described)
        last = steps[-1]
        draft = _Draft(question="", answer="", kind="yes_no" if yes_no else "chain", hops=hops)
        for i, step in enumerate(steps):
            subject = step.subject if i == 0 else "{" + LABELS[i - 1] + "}"
            parents = [] if i == 0 else [LABELS[i - 1]]
            draft.nodes.append(SubQuestion(LABELS[i], step.relation.ask.format(x=subject), str(step.value),
                                           step.relation.source, parents))
            draft.passage_ids.append(self.world.fact_passages[(step.subject, step.relation.source)])
            draft.relations.append(step.relation.key)
        if not yes_no:
            draft.question = last.relation.ask.format(x=described)
            draft.answer = str(last.value)
            return draft
        candidate = last.value if self.rng.random() < 0.5 else self._wrong_value(last)
        draft.question = last.relation.check.format(x=described, y=candidate)
        draft.answer = "yes" if candidate == last.value else "no"
        draft.nodes.append(SubQuestion(LABELS[hops], f"Is {{{LABELS[hops - 1]}}} the same as {candidate}?",
                                       draft.answer, None, [LABELS[hops - 1]]))
        return draft

    def _wrong_value(self, step: _Step) -> FactValue:
        """A plausible wrong value: a near-duplicate name when there is one, else another entity of the
        same type, or a nearby number."""
        value, rng = step.value, self.rng
        if isinstance(value, int):
            scale = 1000 if step.relation.name == "population" else 1
            delta = rng.randint(1, 40) * rng.choice((-1, 1)) * scale
            return value + delta if value + delta > 0 else value - delta
        siblings = self.world.siblings.get(value, [])
        if siblings and rng.random() < 0.7:
            return rng.choice(siblings)
        assert step.relation.target is not None
        return rng.choice([n for n in self.by_type[step.relation.target] if n != value])

    def comparison(self) -> _Draft | None:
        relation = self.rng.choice(self.comparable)
        assert relation.compare is not None
        x, y = self.rng.sample(self.by_type[relation.subject], 2)
        vx, vy = int(self.world.facts[x][relation.name]), int(self.world.facts[y][relation.name])
        if vx == vy:
            return None
        winner = x if (vx > vy) == relation.compare_larger else y
        draft = _Draft(relation.compare.format(x=x, y=y), winner, "comparison", hops=2)
        for label, subject, value in (("A", x, vx), ("B", y, vy)):
            draft.nodes.append(SubQuestion(label, relation.ask.format(x=subject), str(value), relation.source, []))
            draft.passage_ids.append(self.world.fact_passages[(subject, relation.source)])
            draft.relations.append(relation.key)
        draft.nodes.append(SubQuestion("C", relation.compare.format(x=f"{x} ({{A}})", y=f"{y} ({{B}})"),
                                       winner, None, ["A", "B"]))
        return draft
