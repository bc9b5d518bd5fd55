"""Invented, pronounceable names built from syllables.

Names are invented so that a language model's parametric knowledge cannot answer a question about the
synthetic world: the only way to the answer is to search. Every name is built from a small syllable
inventory, which keeps the language regular (a small BPE learns the syllables) while the combinations are
almost never real words.
"""
from __future__ import annotations

import random
from typing import Callable

_ONSETS = (
    "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "j", "x",
    "br", "dr", "gr", "kr", "tr", "vr", "zr", "th", "sk", "kh", "qu",
)
_VOWELS = ("a", "e", "i", "o", "u", "y", "ae", "ei", "ou")
_INNER_CODAS = ("", "", "n", "r", "l", "s")
_FINAL_CODAS = ("", "", "n", "r", "l", "s", "k", "x", "th", "sk", "rn", "v", "z")
# A word must hold one of these letters: English words built from the inventory above are far rarer
# among such words (figure in benchmarks/RESULTS.md).
_MARKERS = frozenset("zkvxqjy")

_COUNTRY_SUFFIXES = ("ia", "and", "ar", "esh")
COMPANY_SUFFIXES = ("Corp", "Labs", "Works", "Group", "Systems", "Holdings")
UNIVERSITY_FORMS = ("{} University", "University of {}", "{} Institute")
JOURNAL_FORMS = ("{} Review", "Journal of {} Studies", "{} Letters", "Annals of {}")


_FRAME_WORDS = frozenset(COMPANY_SUFFIXES) | {w for form in UNIVERSITY_FORMS + JOURNAL_FORMS for w in form.split() if w != "{}"}


def invented_words(name: str, entity_type: str) -> set[str]:
    """The invented words (stems, capitalised) that a name of ``entity_type`` is made of: the name
    without its frame words ("Corp", "University of", ...), and a country's without its suffix."""
    if entity_type == "country":
        for suffix in _COUNTRY_SUFFIXES:
            if name.endswith(suffix):
                return {name[: -len(suffix)]}
    return {word for word in name.split() if word not in _FRAME_WORDS}


class NameGenerator:
    """Draws unique invented names from a seeded ``random.Random``.

    Every stem (the invented word inside a name) is used once in a world, so that, say, a city and a
    university never share a stem and a name never leaks a fact. Near-duplicate names (``sibling``) are
    made on purpose only, as a difficulty knob.
    """

    def __init__(self, rng: random.Random, accept: Callable[[str], bool] | None = None) -> None:
        """``accept``, when given, must approve each capitalised stem (e.g. a limit on its tokens);
        a stem it refuses is never drawn again."""
        self._rng = rng
        self._accept = accept
        self._stems: set[str] = set()
        self._names: set[str] = set()

    def stem(self, syllables: int = 2) -> str:
        """A new capitalised invented word, never returned before by this generator."""
        tries = 10_000 if self._accept is None else 1_000_000
        for _ in range(tries):
            word = self._word(syllables)
            if word not in self._stems and _MARKERS & set(word):
                self._stems.add(word)
                if self._accept is None or self._accept(word.capitalize()):
                    return word.capitalize()
        raise RuntimeError("the syllable inventory is exhausted; ask for fewer entities")

    def _word(self, syllables: int) -> str:
        rng = self._rng
        parts = []
        for i in range(syllables):
            coda = rng.choice(_FINAL_CODAS if i == syllables - 1 else _INNER_CODAS)
            parts.append(rng.choice(_ONSETS) + rng.choice(_VOWELS) + coda)
        return "".join(parts)

    def claim(self, name: str) -> bool:
        """Reserve a full name; False when it is already taken in this world."""
        if name in self._names:
            return False
        self._names.add(name)
        return True

    def new_name(self, entity_type: str, first_names: list[str]) -> str:
        """A fresh name for an entity of ``entity_type`` (persons take a first name from the pool)."""
        for _ in range(1_000):
            name = self._fresh(entity_type, first_names)
            if self.claim(name):
                return name
        raise RuntimeError(f"could not find a free {entity_type} name")

    def _fresh(self, entity_type: str, first_names: list[str]) -> str:
        rng = self._rng
        if entity_type == "person":
            return f"{rng.choice(first_names)} {self.stem()}"
        if entity_type == "city":
            return self.stem()
        if entity_type == "country":
            stem = self.stem()
            return stem + rng.choice(_COUNTRY_SUFFIXES)
        if entity_type == "company":
            return f"{self.stem()} {rng.choice(COMPANY_SUFFIXES)}"
        if entity_type == "university":
            return rng.choice(UNIVERSITY_FORMS).format(self.stem())
        if entity_type == "journal":
            return rng.choice(JOURNAL_FORMS).format(self.stem())
        raise ValueError(f"unknown entity type {entity_type!r}")

    def sibling(self, entity_type: str, name: str, first_names: list[str]) -> str | None:
        """A near-duplicate of ``name``: same surname or stem with another first name, suffix or form,
        or (for one-word place names) one vowel changed. None when no free variant is found."""
        for _ in range(50):
            candidate = self._variant(entity_type, name, first_names)
            if candidate is None or candidate == name or candidate.lower() in self._stems:
                continue
            if self.claim(candidate):
                if entity_type in ("city", "country"):
                    self._stems.add(candidate.lower())
                return candidate
        return None

    def _variant(self, entity_type: str, name: str, first_names: list[str]) -> str | None:
        rng = self._rng
        if entity_type == "person":
            return f"{rng.choice(first_names)} {name.split(' ', 1)[1]}"
        if entity_type in ("city", "country"):
            vowel_positions = [i for i, ch in enumerate(name) if ch in "aeiouy"]
            i = rng.choice(vowel_positions)
            return name[:i] + rng.choice([v for v in "aeiou" if v != name[i]]) + name[i + 1:]
        if entity_type == "company":
            stem = name.rsplit(" ", 1)[0]
            return f"{stem} {rng.choice(COMPANY_SUFFIXES)}"
        forms = UNIVERSITY_FORMS if entity_type == "university" else JOURNAL_FORMS
        for form in forms:
            prefix, _, suffix = form.partition("{}")
            if name.startswith(prefix) and name.endswith(suffix):
                stem = name[len(prefix):len(name) - len(suffix)]
                return rng.choice(forms).format(stem)
        return None
