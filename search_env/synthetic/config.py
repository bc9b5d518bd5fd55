"""The knobs of the synthetic world and the presets that the ``difficulty`` level stands for."""
from __future__ import annotations

from dataclasses import dataclass, replace

MAX_HOPS = 4
_COUNTS = ("n_people", "n_companies", "n_cities", "n_countries", "n_universities", "n_journals")


@dataclass(frozen=True)
class WorldConfig:
    """Size and difficulty of a synthetic world.

    ``max_hops`` caps chain questions (1..4 lookups); the ``n_*`` counts set the number of entities
    (hence passages and how many entities share a first name); ``near_duplicate_rate`` is the chance
    that an entity gets a near-duplicate sibling (same surname or stem, one vowel apart), which yes/no
    questions also use as their wrong candidate; ``distractor_rate`` is the chance that an entity gets an
    extra passage that names it but answers nothing. ``comparison_fraction`` and ``yes_no_fraction``
    set the question mix; the rest are chain questions, with hop counts spread evenly over
    1..``max_hops``. ``stem_tokens``, when set, draws only the invented words (stems of every name)
    that the built-in tokenizer writes in exactly that many tokens after a space: names a small model
    copies more exactly (most stems take 3 or 4 tokens and few take 2; a one-token stem is a rare token,
    whose embedding a small model barely learns). ``excluded_stems`` are invented words (as
    capitalised in names) this world must not use, e.g. those of a world a model was trained on, so that
    every name of a held-out world is new.
    """

    max_hops: int = 2
    n_people: int = 60
    n_companies: int = 20
    n_cities: int = 16
    n_countries: int = 5
    n_universities: int = 8
    n_journals: int = 6
    near_duplicate_rate: float = 0.0
    distractor_rate: float = 0.0
    comparison_fraction: float = 0.2
    yes_no_fraction: float = 0.2
    stem_tokens: int | None = None
    excluded_stems: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not 1 <= self.max_hops <= MAX_HOPS:
            raise ValueError(f"max_hops must be in 1..{MAX_HOPS}, got {self.max_hops}")
        for name in ("n_people", "n_companies", "n_cities", "n_universities", "n_journals"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name} must be at least 2 (comparisons need two entities)")
        if not 2 <= self.n_countries <= self.n_cities:
            raise ValueError("n_countries must be in 2..n_cities (every country needs a capital city)")
        for name in ("near_duplicate_rate", "distractor_rate", "comparison_fraction", "yes_no_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.stem_tokens is not None and self.stem_tokens < 2:
            raise ValueError(f"stem_tokens must be >= 2 (a one-token stem is a rare token), got {self.stem_tokens}")
        if self.comparison_fraction + self.yes_no_fraction > 1.0:
            raise ValueError("comparison_fraction + yes_no_fraction must not exceed 1")

    def scaled(self, factor: int) -> WorldConfig:
        """This config with every entity count multiplied by ``factor`` (a larger world of the same kind)."""
        if factor < 1:
            raise ValueError(f"a world's scale must be >= 1, got {factor}")
        return replace(self, **{name: getattr(self, name) * factor for name in _COUNTS})

    @classmethod
    def for_difficulty(cls, difficulty: int) -> WorldConfig:
        """The preset for a difficulty level: 1 (default; 1-2 hops, small world, distinct names),
        2 (up to 3 hops, twice the entities, some near-duplicate names and distractor passages),
        3 (up to 4 hops, three times the entities, many near-duplicates and distractors)."""
        base = cls()
        if difficulty == 1:
            return base
        if difficulty == 2:
            return replace(base, max_hops=3, n_people=120, n_companies=40, n_cities=32, n_countries=8,
                           n_universities=16, n_journals=12, near_duplicate_rate=0.2, distractor_rate=0.2)
        if difficulty == 3:
            return replace(base, max_hops=4, n_people=180, n_companies=60, n_cities=48, n_countries=10,
                           n_universities=24, n_journals=18, near_duplicate_rate=0.35, distractor_rate=0.5)
        raise ValueError(f"difficulty must be 1, 2 or 3, got {difficulty!r} (or pass a WorldConfig)")

    def count(self, entity_type: str) -> int:
        """How many entities of ``entity_type`` the world has (near-duplicate siblings included)."""
        return {
            "person": self.n_people, "company": self.n_companies, "city": self.n_cities,
            "country": self.n_countries, "university": self.n_universities, "journal": self.n_journals,
        }[entity_type]
