"""The synthetic world's fast paths build exactly the world of the straightforward code: the same entities,
facts, passages and questions, bit for bit. Digests pinned from the code before the fast paths (a change
to any world fails here), the same worlds built with the fast paths switched off, and each fast path
against what it replaces."""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, replace

import pytest

from search_env.synthetic import WorldConfig, generate_world
from search_env.synthetic import names as names_module
from search_env.synthetic import world as world_module
from search_env.synthetic.names import NameGenerator, _drawer, _inlined_choice_matches, _word
from search_env.synthetic.world import SyntheticWorld


def _digest(world: SyntheticWorld) -> str:
    payload = {"entities": list(world.entities.items()), "facts": list(world.facts.items()),
               "sources": world.sources, "fact_passages": sorted([*k, v] for k, v in world.fact_passages.items()),
               "siblings": list(world.siblings.items()), "questions": [asdict(q) for q in world.questions]}
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:20]


_TWO_TOKENS = WorldConfig(stem_tokens=2, near_duplicate_rate=0.3, distractor_rate=0.4).scaled(3)


def _worlds() -> dict[str, SyntheticWorld]:
    """Worlds of every kind of draw: the difficulty presets (near-duplicates, distractors, comparisons,
    yes/no), two- and three-token stems, excluded stems, and the demo's kind (chain questions only)."""
    worlds = {f"difficulty{d}": generate_world(seed=3, n_questions=300, difficulty=d) for d in (1, 2, 3)}
    worlds["stem2"] = generate_world(seed=5, n_questions=200, config=_TWO_TOKENS)
    excluded = replace(_TWO_TOKENS, excluded_stems=worlds["stem2"].invented_words())
    worlds["stem2_excluded"] = generate_world(seed=6, n_questions=200, config=excluded)
    worlds["stem3_hops3"] = generate_world(seed=7, n_questions=100, config=WorldConfig(stem_tokens=3, max_hops=3).scaled(2))
    demo_kind = WorldConfig(stem_tokens=2, comparison_fraction=0.0, yes_no_fraction=0.0).scaled(4)
    worlds["chain_only"] = generate_world(seed=10, n_questions=400, config=demo_kind)
    return worlds


#: ``_digest`` of each of ``_worlds()``, from the code before the fast paths (random.choice word by word,
#: tokenizer.encode per candidate stem, linear scans for capitals and distractor entities).
PINNED = {
    "difficulty1": "ca701f4b2008938e9b69",
    "difficulty2": "735514348f67867ecab2",
    "difficulty3": "d437a25844536e2fed3a",
    "stem2": "fcbbf82394ee8bd3af45",
    "stem2_excluded": "a166e53f8d479fb86fbc",
    "stem3_hops3": "4889feeadde6aabc4280",
    "chain_only": "dc12c637a628498847a1",
}


def _straightforward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch the fast paths off: words drawn with ``random.choice``, stems counted with ``encode``."""
    monkeypatch.setattr(names_module, "_drawer", lambda rng, syllables: lambda: _word(rng, syllables))

    def encode_test(tokenizer, tokens, excluded):
        return lambda stem: stem not in excluded and len(tokenizer.encode(" " + stem).ids) == tokens

    monkeypatch.setattr(world_module, "_token_test", encode_test)


def test_worlds_are_the_pinned_worlds_and_those_of_the_straightforward_code(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _worlds()
    assert {name: _digest(world) for name, world in fast.items()} == PINNED
    _straightforward(monkeypatch)
    slow = _worlds()
    for name, world in fast.items():
        assert (world.entities, world.facts, world.sources, world.fact_passages, world.siblings, world.questions) == (
            slow[name].entities, slow[name].facts, slow[name].sources, slow[name].fact_passages, slow[name].siblings,
            slow[name].questions), name


def test_the_inlined_draws_are_random_choices_draws() -> None:
    assert _inlined_choice_matches()
    fast, plain = random.Random("words"), random.Random("words")
    draw = _drawer(fast, 2)
    assert [draw() for _ in range(20_000)] == [_word(plain, 2) for _ in range(20_000)]
    assert fast.getstate() == plain.getstate()  # the same random numbers used, no more
    other, reference = random.Random(1), random.Random(1)
    draw3 = _drawer(other, 3)  # three syllables: no inlined form, random.choice itself
    assert [draw3() for _ in range(100)] == [_word(reference, 3) for _ in range(100)]


def test_a_name_generator_draws_the_same_stems_with_the_fast_path_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def stems() -> list[str]:
        names = NameGenerator(random.Random(4), accept=lambda stem: len(stem) % 3 != 0)
        return [names.stem(syllables) for syllables in (2, 2, 3, 2, 1) * 200]

    fast = stems()
    monkeypatch.setattr(names_module, "_drawer", lambda rng, syllables: lambda: _word(rng, syllables))
    assert stems() == fast


def test_the_stem_token_test_counts_as_encode_does() -> None:
    from tokenizers import Tokenizer

    from search_env.synthetic.tokenizer import load_builtin_tokenizer

    tokenizer = load_builtin_tokenizer()
    rng = random.Random(0)
    stems = [_word(rng, rng.choice((1, 2, 3))).capitalize() for _ in range(20_000)]
    stems += ["Zürich", "Ab", "A", "Search", "Endoftext", "X" * 40]  # a non-ASCII stem goes through encode
    excluded = frozenset(stems[:50])
    for tokens in (2, 3):
        test = world_module._token_test(tokenizer, tokens, excluded)
        expected = [s not in excluded and len(tokenizer.encode(" " + s).ids) == tokens for s in stems]
        assert [test(s) for s in stems] == expected
        assert sum(expected) > 100
    # a tokenizer with more around its model than the built-in one: every stem goes through encode
    from tokenizers import AddedToken, normalizers

    lowered, truncated, added = (Tokenizer.from_str(tokenizer.to_str()) for _ in range(3))
    lowered.normalizer = normalizers.Lowercase()
    truncated.enable_truncation(max_length=2)
    added.add_tokens([AddedToken(" Za", normalized=False)])
    for other in (lowered, truncated, added):
        test = world_module._token_test(other, 2, frozenset())
        assert [test(s) for s in stems[:3000]] == [len(other.encode(" " + s).ids) == 2 for s in stems[:3000]]
