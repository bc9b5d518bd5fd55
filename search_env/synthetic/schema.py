"""The schema of the synthetic world: entity types, sources, and every relation with its wording.

One table drives both halves of the generator: the passage sentences that state a fact and the question
templates that ask for it. Each relation belongs to exactly one source, so the source a fact is stated
in is the source a search for it must hit (biographies and geography in "wiki", companies and jobs in
"news", universities, journals and education in "papers"), and multi-hop chains cross sources.
"""
from __future__ import annotations

from dataclasses import dataclass

SOURCES: tuple[str, ...] = ("wiki", "news", "papers")
ENTITY_TYPES: tuple[str, ...] = ("person", "city", "country", "company", "university", "journal")


@dataclass(frozen=True)
class Relation:
    """A functional fact ``subject -> value``: the value is an entity of type ``target`` or, when
    ``target`` is None, an integer attribute.

    Templates use ``{x}`` for the subject (a name or a nested noun phrase) and ``{y}`` for a value:
    ``ask`` asks for the value; ``phrase`` names the value as a noun phrase ending with the subject, so
    that chains nest to the right ("the capital of the country containing the birthplace of {x}");
    ``check`` is the yes/no form; ``compare`` (attributes only) asks which of two subjects has the
    smaller value, or the larger when ``compare_larger``.
    """

    subject: str
    name: str
    target: str | None
    source: str
    ask: str
    check: str
    phrase: str | None = None
    compare: str | None = None
    compare_larger: bool = False

    @property
    def key(self) -> str:
        """Unique name across the schema, e.g. ``"person.born_in"``."""
        return f"{self.subject}.{self.name}"


RELATIONS: tuple[Relation, ...] = (
    Relation("person", "born_in", "city", "wiki", ask="Where was {x} born?",
             check="Was {x} born in {y}?", phrase="the birthplace of {x}"),
    Relation("person", "birth_year", None, "wiki", ask="In what year was {x} born?",
             check="Was {x} born in {y}?", compare="Who was born earlier, {x} or {y}?"),
    Relation("person", "works_for", "company", "news", ask="Which company does {x} work for?",
             check="Does {x} work for {y}?", phrase="the employer of {x}"),
    Relation("person", "studied_at", "university", "papers", ask="Where did {x} study?",
             check="Did {x} study at {y}?", phrase="the university attended by {x}"),
    Relation("person", "publishes_in", "journal", "papers", ask="In which journal does {x} publish?",
             check="Does {x} publish in {y}?", phrase="the journal publishing the work of {x}"),
    Relation("company", "founded_by", "person", "news", ask="Who founded {x}?",
             check="Was {x} founded by {y}?", phrase="the founder of {x}"),
    Relation("company", "headquartered_in", "city", "news", ask="Where is {x} headquartered?",
             check="Is {x} headquartered in {y}?", phrase="the headquarters city of {x}"),
    Relation("company", "founding_year", None, "news", ask="In what year was {x} founded?",
             check="Was {x} founded in {y}?", compare="Which was founded earlier, {x} or {y}?"),
    Relation("city", "located_in", "country", "wiki", ask="In which country is {x}?",
             check="Is {x} located in {y}?", phrase="the country containing {x}"),
    Relation("city", "population", None, "wiki", ask="What is the population of {x}?",
             check="Does {x} have a population of {y}?",
             compare="Which has a larger population, {x} or {y}?", compare_larger=True),
    Relation("country", "capital", "city", "wiki", ask="What is the capital of {x}?",
             check="Is {y} the capital of {x}?", phrase="the capital of {x}"),
    Relation("country", "founding_year", None, "wiki", ask="In what year was {x} founded?",
             check="Was {x} founded in {y}?", compare="Which was founded earlier, {x} or {y}?"),
    Relation("university", "located_in", "city", "papers", ask="In which city is {x}?",
             check="Is {x} located in {y}?", phrase="the city hosting {x}"),
    Relation("university", "founding_year", None, "papers", ask="In what year was {x} founded?",
             check="Was {x} founded in {y}?", compare="Which was founded earlier, {x} or {y}?"),
    Relation("journal", "published_by", "university", "papers", ask="Which university publishes {x}?",
             check="Is {x} published by {y}?", phrase="the publisher of {x}"),
    Relation("journal", "founding_year", None, "papers", ask="In what year was {x} founded?",
             check="Was {x} founded in {y}?", compare="Which was founded earlier, {x} or {y}?"),
)

RELATIONS_BY_SUBJECT: dict[str, tuple[Relation, ...]] = {
    entity_type: tuple(r for r in RELATIONS if r.subject == entity_type) for entity_type in ENTITY_TYPES
}

# The sentences that state an entity's facts, one passage per (entity type, source). Every relation's
# value appears verbatim in the passage of its subject in its source.
PASSAGE_TEMPLATES: dict[tuple[str, str], str] = {
    ("person", "wiki"): "{name} was born in {born_in} in {birth_year}.",
    ("person", "news"): "{name} works for {works_for}.",
    ("person", "papers"): "{name} studied at {studied_at}. {name} publishes in {publishes_in}.",
    ("company", "news"): "{name} is a company founded by {founded_by} in {founding_year}. "
                         "It is headquartered in {headquartered_in}.",
    ("city", "wiki"): "{name} is a city in {located_in}. It has a population of {population}.",
    ("country", "wiki"): "{name} is a country founded in {founding_year}. Its capital is {capital}.",
    ("university", "papers"): "{name} is a university in {located_in}. It was founded in {founding_year}.",
    ("journal", "papers"): "{name} is a journal published by {published_by}. "
                           "It was founded in {founding_year}.",
}

# Distractor passages (a difficulty knob): they name an entity next to other entities of the world but
# state none of the asked relations, so they compete for retrieval without changing any answer. The
# placeholder names the type of the mentioned entity; ``{year}`` is a random year.
DISTRACTOR_TEMPLATES: dict[tuple[str, str], str] = {
    ("person", "wiki"): "{name} once travelled to {country}.",
    ("person", "news"): "{name} spoke at a conference in {city} in {year}.",
    ("person", "papers"): "{name} reviewed a paper for {journal}.",
    ("company", "wiki"): "{name} sponsored a festival in {city}.",
    ("company", "papers"): "{name} funded a study at {university}.",
    ("city", "news"): "{name} hosted a trade fair for {company} in {year}.",
    ("city", "papers"): "A survey of {name} appeared in {journal}.",
    ("country", "news"): "{name} signed a trade deal with {country} in {year}.",
    ("university", "news"): "{name} signed an agreement with {company}.",
    ("journal", "news"): "{name} printed a report on {company}.",
}
