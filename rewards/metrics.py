"""Answer metrics shared by every reward preset: exact match, token F1 and cover exact match.

Two answer normalisations exist because the seed systems disagree on punctuation, and a preset must
score exactly as its reference does:

- ``"squad"`` (SQuAD / HotpotQA official evaluation, Search-R1, ReSearch, R-Search): lowercase,
  delete punctuation, drop the articles a/an/the, collapse whitespace;
- ``"r1"`` (R1-Searcher): a text that is exactly ``True``/``False`` becomes ``yes``/``no``; then
  ``_`` becomes a space, lowercase, every punctuation character (``string.punctuation`` plus the
  quote marks ‘ ’ ´ `) becomes a space, articles are dropped, whitespace collapsed.

Every metric takes one gold or several and returns the best score over the golds (0.0 for none).
"""
from __future__ import annotations

import re
import string
from collections import Counter
from functools import lru_cache
from typing import Callable, Iterable, Literal

__all__ = [
    "Normalization",
    "normalize_squad",
    "normalize_r1",
    "normalize",
    "as_gold_list",
    "exact_match",
    "f1_score",
    "cover_exact_match",
    "answer_in_text",
]

Normalization = Literal["squad", "r1"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SQUAD_DELETE_PUNCTUATION = str.maketrans("", "", string.punctuation)
_R1_PUNCTUATION_TO_SPACE = str.maketrans({ch: " " for ch in string.punctuation + "\u2018\u2019\u00b4`"})
_R1_BOOLEANS = {"True": "yes", "False": "no"}
# The official HotpotQA rule: a yes/no/noanswer prediction or gold only scores against the same word.
_YES_NO = frozenset({"yes", "no", "noanswer"})


#: Short texts (up to this many characters) have their normalisation remembered, in a cache of
#: :data:`MEMO_SIZE` texts per scheme. Answers and golds are short and recur (every sample of a group is
#: scored against the same golds; a policy repeats its answers), and normalising one takes several
#: string passes and a regex substitution, most of a search-r1 reward's time. Longer texts are
#: normalised each time, so the cache holds at most MEMO_SIZE * MEMO_CHARS characters per scheme.
MEMO_CHARS = 256
MEMO_SIZE = 4096


def _squad(text: str) -> str:
    text = text.lower().translate(_SQUAD_DELETE_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _r1(text: str) -> str:
    text = _R1_BOOLEANS.get(text, text).replace("_", " ").lower()
    text = text.translate(_R1_PUNCTUATION_TO_SPACE)
    return " ".join(_ARTICLES.sub(" ", text).split())


_squad_memo, _r1_memo = lru_cache(maxsize=MEMO_SIZE)(_squad), lru_cache(maxsize=MEMO_SIZE)(_r1)


def normalize_squad(text: str) -> str:
    """SQuAD-style normalisation: lowercase, punctuation deleted, articles dropped, spaces collapsed."""
    return _squad_memo(text) if type(text) is str and len(text) <= MEMO_CHARS else _squad(text)


def normalize_r1(text: str) -> str:
    """R1-Searcher normalisation: exact ``True``/``False`` → ``yes``/``no``; ``_`` and punctuation
    become spaces (so ``"New_York"`` and ``"new-york"`` both give ``"new york"``); articles dropped."""
    return _r1_memo(text) if type(text) is str and len(text) <= MEMO_CHARS else _r1(text)


_NORMALIZERS: dict[str, Callable[[str], str]] = {"squad": normalize_squad, "r1": normalize_r1}


def _normalizer(normalization: Normalization) -> Callable[[str], str]:
    try:
        return _NORMALIZERS[normalization]
    except KeyError:
        raise ValueError(f"unknown normalization {normalization!r}; expected one of {sorted(_NORMALIZERS)}") from None


def normalize(text: str, normalization: Normalization = "squad") -> str:
    """Normalise ``text`` with the named scheme ("squad" or "r1")."""
    return _normalizer(normalization)(text)


def as_gold_list(golden_answers: str | Iterable[str]) -> list[str]:
    """Accept one gold string or any iterable of golds (list, tuple, numpy array) as a list of str."""
    if isinstance(golden_answers, str):
        return [golden_answers]
    return [str(gold) for gold in golden_answers]


def exact_match(prediction: str, golden_answers: str | Iterable[str], *, normalization: Normalization = "squad") -> float:
    """1.0 if the normalised prediction equals any normalised gold, else 0.0."""
    normalizer = _NORMALIZERS.get(normalization) or _normalizer(normalization)  # _normalizer raises, naming the schemes
    return float(normalizer(prediction) in map(normalizer, as_gold_list(golden_answers)))


def _token_f1(pred: str, gold: str, yes_no_rule: bool) -> float:
    if yes_no_rule and (pred in _YES_NO or gold in _YES_NO) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(
    prediction: str,
    golden_answers: str | Iterable[str],
    *,
    normalization: Normalization = "squad",
    yes_no_rule: bool = True,
    ndigits: int | None = None,
) -> float:
    """Token-overlap F1 (bag of normalised tokens), max over golds.

    With ``yes_no_rule`` a prediction or gold that normalises to yes/no/noanswer scores 0 unless both
    normalise to the same text (HotpotQA's official rule). ``ndigits`` rounds the result, as R-Search
    does with 2. Two empty texts score 0, as in the official SQuAD v1.1 / HotpotQA scripts.
    """
    pred = normalize(prediction, normalization)
    best = max((_token_f1(pred, normalize(gold, normalization), yes_no_rule) for gold in as_gold_list(golden_answers)), default=0.0)
    return round(best, ndigits) if ndigits is not None else best


def cover_exact_match(prediction: str, golden_answers: str | Iterable[str], *, normalization: Normalization = "squad") -> float:
    """1.0 if every token of some normalised gold occurs among the prediction's tokens (any order).

    A gold that normalises to nothing is covered only by a prediction that also normalises to nothing
    (R1-Searcher compares ``split(" ")`` lists, where an empty text is the one-element list ``[""]``).
    """
    pred = normalize(prediction, normalization)
    pred_tokens = set(pred.split())
    for gold in as_gold_list(golden_answers):
        gold_tokens = normalize(gold, normalization).split()
        if (all(token in pred_tokens for token in gold_tokens) if gold_tokens else not pred):
            return 1.0
    return 0.0


def answer_in_text(text: str, golden_answers: str | Iterable[str]) -> bool:
    """Whether some gold answer, SQuAD-normalised and not empty, occurs in the normalised ``text`` as whole
    words in order: the test that retrieved passages hold an answer a policy can copy out of them."""
    padded = f" {normalize(text)} "
    return any(gold and f" {gold} " in padded for gold in map(normalize, as_gold_list(golden_answers)))
