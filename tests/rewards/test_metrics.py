"""Answer metrics: hand-worked values, agreement with the official SQuAD v1.1 / HotpotQA definitions
on real golds, and invariants."""
from __future__ import annotations

import json
import re
import string
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards.metrics import (
    cover_exact_match,
    exact_match,
    f1_score,
    normalize,
    normalize_r1,
    normalize_squad,
)

# ---------------------------------------------------------------------------------------------
# An independent, literal reading of the official definitions (SQuAD v1.1 evaluate-v1.1.py for the
# normalisation and EM, HotpotQA hotpot_evaluate_v1.py for F1 with its yes/no/noanswer rule).


def official_normalize(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def official_em(prediction: str, gold: str) -> float:
    return float(official_normalize(prediction) == official_normalize(gold))


def official_f1(prediction: str, gold: str) -> float:
    p, g = official_normalize(prediction), official_normalize(gold)
    if p in ("yes", "no", "noanswer") and p != g:
        return 0.0
    if g in ("yes", "no", "noanswer") and p != g:
        return 0.0
    p_toks, g_toks = p.split(), g.split()
    same = sum((Counter(p_toks) & Counter(g_toks)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p_toks), same / len(g_toks)
    return 2 * precision * recall / (precision + recall)


def perturbations(gold: str, other: str) -> list[str]:
    """Predictions a model might give for ``gold``: exact, re-cased, re-punctuated, partial, padded,
    another question's answer, yes/no, empty."""
    words = gold.split()
    return [
        gold,
        gold.upper(),
        f"The {gold}.",
        f"  {gold.lower()}!!  ",
        gold.replace(" ", "-"),
        " ".join(words[:-1]),
        " ".join(words[1:]),
        f"{gold} and {other}",
        f"it is {gold} (probably)",
        other,
        "yes",
        "no",
        "",
        "?!",
    ]


@pytest.fixture(scope="module")
def hotpot_table(shared_data) -> list[tuple[str, list[str]]]:
    rows = [json.loads(line) for line in (shared_data / "hotpotqa_dev.jsonl").read_text(encoding="utf-8").splitlines()]
    golds = [row["golden_answers"] for row in rows]
    table = []
    for index, answers in enumerate(golds):
        other = golds[(index + 7) % len(golds)][0]
        for prediction in perturbations(answers[0], other):
            table.append((prediction, answers))
    return table


def test_agrees_with_official_definitions_on_hotpotqa_golds(hotpot_table):
    assert len(hotpot_table) > 5000
    for prediction, golds in hotpot_table:
        assert exact_match(prediction, golds) == max(official_em(prediction, g) for g in golds), (prediction, golds)
        assert f1_score(prediction, golds) == pytest.approx(max(official_f1(prediction, g) for g in golds)), (prediction, golds)
        assert normalize_squad(prediction) == official_normalize(prediction)
        for gold in golds:
            assert normalize_squad(gold) == official_normalize(gold)
            assert f1_score(prediction, gold) == pytest.approx(official_f1(prediction, gold))


def test_table_is_not_trivial(hotpot_table):
    """The perturbation table exercises every score regime (so agreement above means something)."""
    f1s = [max(official_f1(p, g) for g in golds) for p, golds in hotpot_table]
    assert any(v == 1.0 for v in f1s) and any(v == 0.0 for v in f1s) and any(0.0 < v < 1.0 for v in f1s)


# ---------------------------------------------------------------------------------------------
# Hand-worked values


@pytest.mark.parametrize(
    "text, squad, r1",
    [
        ("The  Eiffel-Tower!", "eiffeltower", "eiffel tower"),
        ("New_York", "newyork", "new york"),
        ("an apple a day", "apple day", "apple day"),
        ("Theatre of the Absurd", "theatre of absurd", "theatre of absurd"),
        ("‘Hello’ `world´", "‘hello’ world´", "hello world"),
        ("True", "true", "yes"),
        ("False", "false", "no"),
        ("true", "true", "true"),
        (" True", "true", "true"),
        ("北京，中国", "北京，中国", "北京，中国"),
        ("", "", ""),
    ],
)
def test_normalizations(text, squad, r1):
    assert normalize_squad(text) == squad
    assert normalize_r1(text) == r1
    assert normalize(text, "squad") == squad and normalize(text, "r1") == r1


def test_unknown_normalization_is_a_clear_error():
    with pytest.raises(ValueError, match="squad"):
        exact_match("a", "a", normalization="lower")


@pytest.mark.parametrize(
    "prediction, golds, expected",
    [
        ("the cat sat", "cat sat down", 0.8),  # p = 2/2, r = 2/3
        ("cat cat", "cat", 2 / 3),  # p = 1/2, r = 1/1
        ("cat", "cat cat", 2 / 3),
        ("Paris", ["London", "paris."], 1.0),  # best gold
        ("Paris", [], 0.0),
        ("", "", 0.0),  # official scripts: no common token → 0
        ("yes", "yes sir", 0.0),  # yes/no rule (prediction side)
        ("no way", "no", 0.0),  # yes/no rule (gold side)
        ("Yes.", "yes", 1.0),
        ("noanswer", "no answer", 0.0),
        ("北京 上海", "北京", 2 / 3),  # CJK: whitespace tokens
    ],
)
def test_f1_hand_values(prediction, golds, expected):
    assert f1_score(prediction, golds) == pytest.approx(expected)


def test_f1_yes_no_rule_can_be_turned_off():
    assert f1_score("yes", "yes sir") == 0.0
    assert f1_score("yes", "yes sir", yes_no_rule=False) == pytest.approx(2 / 3)


def test_f1_rounding():
    assert f1_score("cat", "cat cat", ndigits=2) == 0.67
    assert f1_score("a b c d e f", "a b c", ndigits=2) == 0.57  # "b c d e f" vs "b c": 0.8 / 1.4


def test_r1_normalisation_in_f1_and_em():
    assert f1_score("New_York City", "new york", normalization="r1") == pytest.approx(0.8)
    assert f1_score("New_York City", "new york", normalization="squad") == 0.0
    assert exact_match("True", "yes", normalization="r1") == 1.0
    assert exact_match("True", "yes", normalization="squad") == 0.0
    assert f1_score("False", "no", normalization="r1") == 1.0


@pytest.mark.parametrize(
    "prediction, golds, normalization, expected",
    [
        ("Paris, France", "Paris", "squad", 1.0),
        ("France, Paris", "paris france", "squad", 1.0),  # any order
        ("Paris", "Paris France", "squad", 0.0),
        ("it was the Eiffel-Tower", "Eiffel Tower", "r1", 1.0),
        ("it was the Eiffel-Tower", "Eiffel Tower", "squad", 0.0),
        ("the", "a", "squad", 1.0),  # both normalise to nothing
        ("Paris", "the", "squad", 0.0),  # an empty gold is covered only by an empty answer
        ("London", ["Paris", "London"], "squad", 1.0),
        ("True", "yes", "r1", 1.0),
        ("yes it is", "yes", "squad", 1.0),  # no yes/no rule in cover-EM
    ],
)
def test_cover_exact_match(prediction, golds, normalization, expected):
    assert cover_exact_match(prediction, golds, normalization=normalization) == expected


def test_golds_may_be_a_tuple():
    assert exact_match("b", ("a", "b")) == 1.0


# ---------------------------------------------------------------------------------------------
# Invariants

texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
words = st.lists(st.sampled_from(["paris", "the", "a", "yes", "no", "City", "new_york", "北京", "!", "A.B"]), max_size=6).map(" ".join)


@settings(max_examples=150, deadline=None)
@given(prediction=texts | words, gold=texts | words, normalization=st.sampled_from(["squad", "r1"]))
def test_metric_invariants(prediction, gold, normalization):
    f1 = f1_score(prediction, gold, normalization=normalization)
    em = exact_match(prediction, gold, normalization=normalization)
    cem = cover_exact_match(prediction, gold, normalization=normalization)
    assert 0.0 <= f1 <= 1.0
    assert em in (0.0, 1.0) and cem in (0.0, 1.0)
    assert f1 == pytest.approx(f1_score(gold, prediction, normalization=normalization))  # symmetric
    if em and normalize(gold, normalization):
        assert f1 == pytest.approx(1.0) and cem == 1.0
    assert exact_match(prediction, prediction, normalization=normalization) == 1.0
    assert cover_exact_match(prediction, prediction, normalization=normalization) == 1.0


@settings(max_examples=100, deadline=None)
@given(prediction=words, golds=st.lists(words, max_size=4))
def test_best_over_golds(prediction, golds):
    assert f1_score(prediction, golds) == max((f1_score(prediction, g) for g in golds), default=0.0)
    assert exact_match(prediction, golds) == max((exact_match(prediction, g) for g in golds), default=0.0)
    assert cover_exact_match(prediction, golds) == max((cover_exact_match(prediction, g) for g in golds), default=0.0)


@settings(max_examples=100, deadline=None)
@given(text=texts | words)
def test_squad_normalisation_matches_official(text):
    assert normalize_squad(text) == official_normalize(text)


@pytest.mark.parametrize(("text", "golds", "expected"), [
    ("Zarbo is a company founded by Bob Smith.", ["zarbo."], True),  # normalised on both sides
    ("Zarbo is a company founded by Bob Smith.", ["Old Zarbo", "Bob Smith"], True),  # any gold, whole words
    ("Zarbo is a company founded by Bob Smith.", ["Smith Bob"], False),  # in order
    ("Zarbo is a company founded by Bob Smithers.", ["Smith"], False),  # not inside a word
    ("The Zarbo company", ["the"], False),  # a gold that normalises to nothing is never found
    ("anything", [], False),
])
def test_answer_in_text_hand_values(text, golds, expected):
    from rewards.metrics import answer_in_text

    assert answer_in_text(text, golds) is expected
