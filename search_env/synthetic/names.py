"""Invented, pronounceable names built from syllables.

Names are invented so that a language model's parametric knowledge cannot answer a question about the
synthetic world: the only way to the answer is to search. Every name is built from a small syllable
inventory, which keeps the language regular (a small BPE learns the syllables) while the combinations are
almost never real words.
"""
from __future__ import annotations

import random
from functools import lru_cache
from typing import Callable, Sequence

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
        self._drawers: dict[int, Callable[[], str]] = {}

    def stem(self, syllables: int = 2) -> str:
        """A new capitalised invented word, never returned before by this generator."""
        tries = 10_000 if self._accept is None else 1_000_000
        # The hot loop of a large world (with two-token stems, some 25 words are drawn per stem): the draws
        # are inlined (``_drawer``), and a word that fails the cheap checks never reaches ``accept``.
        draw = self._drawers.get(syllables) or self._drawers.setdefault(syllables, _drawer(self._rng, syllables))
        stems, accept, markers = self._stems, self._accept, _MARKERS
        for _ in range(tries):
            word = draw()
            if word not in stems and not markers.isdisjoint(word):
                stems.add(word)
                if accept is None or accept(word.capitalize()):
                    return word.capitalize()
        raise RuntimeError("the syllable inventory is exhausted; ask for fewer entities")

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


def _word(rng: random.Random, syllables: int) -> str:
    """A word of ``syllables`` syllables drawn with ``rng.choice`` (the definition; :func:`_drawer` makes
    the same draws faster)."""
    parts = []
    for i in range(syllables):
        coda = rng.choice(_FINAL_CODAS if i == syllables - 1 else _INNER_CODAS)
        parts.append(rng.choice(_ONSETS) + rng.choice(_VOWELS) + coda)
    return "".join(parts)


def _drawer(rng: random.Random, syllables: int) -> Callable[[], str]:
    """A function drawing words as :func:`_word` does: the same words from the same random numbers, about
    three times as fast. ``random.Random.choice(seq)`` is ``seq[r]`` for the first ``r =
    rng.getrandbits(len(seq).bit_length())`` below ``len(seq)``; here that loop is inlined, for the
    two-syllable stems every name uses, when this Python's ``Random`` is checked to draw that way
    (:func:`_inlined_choice_matches`); otherwise the words come from :func:`_word` itself."""
    if syllables != 2 or type(rng) is not random.Random or not _inlined_choice_matches():
        return lambda: _word(rng, syllables)
    getrandbits = rng.getrandbits
    onsets, vowels, inner, final = _ONSETS, _VOWELS, _INNER_CODAS, _FINAL_CODAS
    n_onsets, k_onsets = len(onsets), len(onsets).bit_length()
    n_vowels, k_vowels = len(vowels), len(vowels).bit_length()
    n_inner, k_inner = len(inner), len(inner).bit_length()
    n_final, k_final = len(final), len(final).bit_length()

    def draw() -> str:
        # _word's order of draws: per syllable its coda, then its onset, then its vowel
        r = getrandbits(k_inner)
        while r >= n_inner:
            r = getrandbits(k_inner)
        coda = inner[r]
        r = getrandbits(k_onsets)
        while r >= n_onsets:
            r = getrandbits(k_onsets)
        first = onsets[r]
        r = getrandbits(k_vowels)
        while r >= n_vowels:
            r = getrandbits(k_vowels)
        first += vowels[r] + coda
        r = getrandbits(k_final)
        while r >= n_final:
            r = getrandbits(k_final)
        coda = final[r]
        r = getrandbits(k_onsets)
        while r >= n_onsets:
            r = getrandbits(k_onsets)
        second = onsets[r]
        r = getrandbits(k_vowels)
        while r >= n_vowels:
            r = getrandbits(k_vowels)
        return first + second + vowels[r] + coda

    return draw


@lru_cache(maxsize=1)
def _inlined_choice_matches() -> bool:
    """Whether ``random.Random.choice`` draws as :func:`_drawer` inlines it (as CPython's does), checked
    once on draws from a fixed seed over the sizes of the syllable tables."""
    probe, reference = random.Random("searchqa-names/choice-check"), random.Random("searchqa-names/choice-check")
    sizes: Sequence[int] = (len(_ONSETS), len(_VOWELS), len(_INNER_CODAS), len(_FINAL_CODAS), 1, 2, 3, 4, 5, 8, 9)
    for i in range(2_000):
        n = sizes[i % len(sizes)]
        k = n.bit_length()
        r = probe.getrandbits(k)
        while r >= n:
            r = probe.getrandbits(k)
        if r != reference.choice(range(n)):
            return False
    return True
