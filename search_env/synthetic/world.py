"""The seeded synthetic world: entities, their facts, and the passages of each named source.

``generate_world`` is the one entry point. The same seed (and config) gives the same world in any
process: every random draw comes from ``random.Random`` seeded by a string (hashed with SHA-512 by the
standard library, not by ``hash()``), and nothing iterates over a set.
"""
from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

from search_env.data.example import QAExample
from search_env.synthetic.config import WorldConfig
from search_env.synthetic.names import NameGenerator, invented_words
from search_env.synthetic.questions import generate_questions
from search_env.synthetic.schema import (
    DISTRACTOR_TEMPLATES,
    ENTITY_TYPES,
    PASSAGE_TEMPLATES,
    SOURCES,
)

FactValue = str | int


@dataclass
class SyntheticWorld:
    """A generated world and its questions.

    ``entities`` maps each name to its type; ``facts[name][relation]`` holds an entity name or an
    integer; ``sources`` maps "wiki", "news" and "papers" to passages ``{"id", "title", "text"}`` (ids
    like "wiki-00042", titles are entity names); ``fact_passages[(name, source)]`` is the id of the
    passage that states ``name``'s facts of that source; ``siblings[name]`` lists the near-duplicate
    names made for ``name`` (difficulty knob).
    """

    seed: int
    difficulty: int
    config: WorldConfig
    entities: dict[str, str]
    facts: dict[str, dict[str, FactValue]]
    sources: dict[str, list[dict[str, str]]]
    fact_passages: dict[tuple[str, str], str]
    siblings: dict[str, list[str]]
    questions: list[QAExample] = field(default_factory=list)

    def passages(self) -> list[dict[str, str]]:
        """All passages of all sources, source by source (one corpus for a single-source setup)."""
        return [p for source in SOURCES for p in self.sources[source]]

    def passage(self, passage_id: str) -> dict[str, str]:
        """The passage with this id; KeyError names the id when there is none."""
        try:
            return self._passages_by_id[passage_id]
        except KeyError:
            raise KeyError(f"no passage with id {passage_id!r} in this world") from None

    @cached_property
    def _passages_by_id(self) -> dict[str, dict[str, str]]:
        return {p["id"]: p for p in self.passages()}

    def invented_words(self) -> frozenset[str]:
        """Every invented word (stem) the world's names are made of, e.g. to keep them out of a held-out
        world (``WorldConfig.excluded_stems``)."""
        return frozenset(word for name, kind in self.entities.items() for word in invented_words(name, kind))

    def entities_of(self, entity_type: str) -> list[str]:
        """Names of the entities of one type, in generation order."""
        return [name for name, kind in self.entities.items() if kind == entity_type]

    def split(self, train_fraction: float = 0.8) -> tuple[list[QAExample], list[QAExample]]:
        """Deterministic train/test split of the questions (a seeded shuffle, then a cut), so that a
        training run and its evaluation agree on which questions were held out."""
        if not 0.0 < train_fraction < 1.0:
            raise ValueError(f"train_fraction must be strictly between 0 and 1, got {train_fraction}")
        order = list(self.questions)
        random.Random(f"searchqa-world/{self.seed}/split").shuffle(order)
        cut = round(len(order) * train_fraction)
        return order[:cut], order[cut:]


def generate_world(
    seed: int = 0,
    n_questions: int = 500,
    difficulty: int = 1,
    config: WorldConfig | None = None,
) -> SyntheticWorld:
    """Generate the world for ``seed`` with ``n_questions`` questions.

    ``difficulty`` picks a preset (see ``WorldConfig.for_difficulty``); ``config`` replaces the preset
    when given (``difficulty`` is then only recorded in the questions' metadata). The entities and
    passages depend on the seed and config only, not on ``n_questions``.
    """
    if n_questions < 0:
        raise ValueError(f"n_questions must be >= 0, got {n_questions}")
    config = config if config is not None else WorldConfig.for_difficulty(difficulty)
    rng = random.Random(f"searchqa-world/{seed}/entities")
    entities, siblings = _make_entities(rng, config)
    facts = _make_facts(rng, entities)
    sources, fact_passages = _make_passages(rng, entities, facts, config)
    world = SyntheticWorld(seed, difficulty, config, entities, facts, sources, fact_passages, siblings)
    world.questions = generate_questions(world, n_questions, random.Random(f"searchqa-world/{seed}/questions"))
    return world


def _make_entities(rng: random.Random, config: WorldConfig) -> tuple[dict[str, str], dict[str, list[str]]]:
    names = NameGenerator(rng, _stem_test(config.stem_tokens, config.excluded_stems))
    first_names = [names.stem() for _ in range(max(6, config.n_people // 4))]
    entities: dict[str, str] = {}
    siblings: dict[str, list[str]] = {}
    for entity_type in ENTITY_TYPES:
        made: list[str] = []
        for _ in range(config.count(entity_type)):
            name = None
            if made and rng.random() < config.near_duplicate_rate:
                original = rng.choice(made)
                name = names.sibling(entity_type, original, first_names)
                if name is not None:
                    siblings.setdefault(original, []).append(name)
                    siblings.setdefault(name, []).append(original)
            if name is None:
                name = names.new_name(entity_type, first_names)
            made.append(name)
            entities[name] = entity_type
    return entities, siblings


def _stem_test(tokens: int | None, excluded: frozenset[str]) -> Callable[[str], bool] | None:
    """A test that a stem is not ``excluded`` and takes ``tokens`` tokens of the built-in tokenizer after
    a space (any number when None); None when there is nothing to test."""
    if tokens is None:
        return (lambda stem: stem not in excluded) if excluded else None
    from search_env.synthetic.tokenizer import load_builtin_tokenizer  # it trains on worlds: imported late

    return _token_test(load_builtin_tokenizer(), tokens, excluded)


def _token_test(tokenizer: Any, tokens: int, excluded: frozenset[str]) -> Callable[[str], bool]:
    """``stem -> stem not in excluded and len(tokenizer.encode(" " + stem).ids) == tokens``. A large world
    tests a million candidate stems, so for a byte-level BPE with nothing around its model (the built-in
    tokenizer) a stem of ASCII letters goes straight to the BPE model as the one pre-token, ``"Ġ" +
    stem``, that ``encode`` would hand it: the same tokens, several times faster. Anything else goes
    through ``encode``."""
    from tokenizers import models, pre_tokenizers

    def encoded(stem: str) -> bool:
        return stem not in excluded and len(tokenizer.encode(" " + stem).ids) == tokens

    def plain(char: str) -> bool:  # what " " + stem is made of
        return char == " " or (char.isascii() and char.isalpha())

    pre = tokenizer.pre_tokenizer
    direct = (
        tokenizer.normalizer is None and tokenizer.post_processor is None
        and tokenizer.truncation is None and tokenizer.padding is None
        and isinstance(tokenizer.model, models.BPE) and tokenizer.model.dropout is None
        and isinstance(pre, pre_tokenizers.ByteLevel) and pre.pre_tokenize_str(" Ab") == [("\u0120Ab", (0, 3))]
        # an added token is matched in the text before the model sees it: none may fit inside " " + stem
        and not any(all(map(plain, token.content)) for token in tokenizer.get_added_tokens_decoder().values())
    )
    if not direct:
        return encoded
    tokenize = tokenizer.model.tokenize

    def test(stem: str) -> bool:
        if not (stem.isascii() and stem.isalpha()):
            return encoded(stem)
        return stem not in excluded and len(tokenize("\u0120" + stem)) == tokens

    return test


def _make_facts(rng: random.Random, entities: dict[str, str]) -> dict[str, dict[str, FactValue]]:
    of = {t: [n for n, kind in entities.items() if kind == t] for t in ENTITY_TYPES}
    facts: dict[str, dict[str, FactValue]] = {name: {} for name in entities}
    countries, cities = of["country"], of["city"]
    for country in countries:
        facts[country]["founding_year"] = rng.randint(1500, 1950)
    for i, city in enumerate(cities):
        # The first cities go one to each country, so that every country has a capital to name.
        facts[city]["located_in"] = countries[i] if i < len(countries) else rng.choice(countries)
        facts[city]["population"] = rng.randrange(20, 900) * 1000
    cities_in: dict[str, list[str]] = {country: [] for country in countries}
    for city in cities:
        cities_in[str(facts[city]["located_in"])].append(city)
    for country in countries:
        facts[country]["capital"] = rng.choice(cities_in[country])
    for university in of["university"]:
        facts[university]["located_in"] = rng.choice(cities)
        facts[university]["founding_year"] = rng.randint(1300, 1950)
    for journal in of["journal"]:
        publisher = rng.choice(of["university"])
        facts[journal]["published_by"] = publisher
        facts[journal]["founding_year"] = rng.randint(max(int(facts[publisher]["founding_year"]), 1700), 2015)
    for person in of["person"]:
        facts[person]["born_in"] = rng.choice(cities)
        facts[person]["birth_year"] = rng.randint(1900, 1995)
    founded: dict[str, str] = {}
    for company in of["company"]:
        founder = rng.choice(of["person"])
        founded.setdefault(founder, company)
        facts[company]["founded_by"] = founder
        facts[company]["headquartered_in"] = rng.choice(cities)
        facts[company]["founding_year"] = min(int(facts[founder]["birth_year"]) + rng.randint(22, 60), 2023)
    for person in of["person"]:
        # A founder works for (the first company) they founded; everyone else for a random company.
        facts[person]["works_for"] = founded.get(person) or rng.choice(of["company"])
        facts[person]["studied_at"] = rng.choice(of["university"])
        facts[person]["publishes_in"] = rng.choice(of["journal"])
    return facts


def _make_passages(
    rng: random.Random,
    entities: dict[str, str],
    facts: dict[str, dict[str, FactValue]],
    config: WorldConfig,
) -> tuple[dict[str, list[dict[str, str]]], dict[tuple[str, str], str]]:
    drafts: dict[str, list[tuple[str, str, bool]]] = {source: [] for source in SOURCES}
    of = {t: [n for n, kind in entities.items() if kind == t] for t in ENTITY_TYPES}
    for name, entity_type in entities.items():
        for source in SOURCES:
            template = PASSAGE_TEMPLATES.get((entity_type, source))
            if template is not None:
                drafts[source].append((name, template.format(name=name, **facts[name]), True))
    for name, entity_type in entities.items():
        if rng.random() < config.distractor_rate:
            options = [s for s in SOURCES if (entity_type, s) in DISTRACTOR_TEMPLATES]
            source = rng.choice(options)
            text = _fill_distractor(rng, DISTRACTOR_TEMPLATES[(entity_type, source)], name, of, facts)
            drafts[source].append((name, text, False))

    sources: dict[str, list[dict[str, str]]] = {}
    fact_passages: dict[tuple[str, str], str] = {}
    for source in SOURCES:
        rows = drafts[source]
        rng.shuffle(rows)
        sources[source] = []
        for i, (title, text, states_facts) in enumerate(rows):
            passage_id = f"{source}-{i:05d}"
            sources[source].append({"id": passage_id, "title": title, "text": text})
            if states_facts:
                fact_passages[(title, source)] = passage_id
    return sources, fact_passages


def _fill_distractor(
    rng: random.Random,
    template: str,
    name: str,
    of: dict[str, list[str]],
    facts: dict[str, dict[str, FactValue]],
) -> str:
    """Fill a distractor template with entities (``of[type]``: the names of a type, in generation order)
    that are neither ``name`` nor any of its fact values, so that the passage cannot be read as a second
    answer to a question about ``name``."""
    excluded = {name, *(str(v) for v in facts[name].values())}
    values: dict[str, FactValue] = {"name": name}
    for _, field_name, _, _ in string.Formatter().parse(template):
        if field_name is None or field_name in values:
            continue
        if field_name == "year":
            values["year"] = rng.randint(1950, 2023)
        else:
            pool = [n for n in of[field_name] if n not in excluded]
            values[field_name] = rng.choice(pool)
    return template.format(**values)
