"""LLM-as-judge: is a predicted answer correct given the gold answers? A score in [0, 1].

Reasoning-search rewards the answer by a judge model rather than string overlap, since its questions
(news, papers) have free-form answers. The judge is any callable
``(question, golden_answers, prediction) -> float``; ``LLMJudge`` asks a chat model with
``JUDGE_PROMPT`` and reads its reply with ``parse_judgement``, and ``f1_judge`` is the model-free
stand-in (token F1).

How a reply becomes a score (``parse_judgement``), case-insensitively:

1. the earliest verdict word decides: ``yes``, ``correct``, ``right``, ``true``, ``accurate`` give
   1.0; ``no``, ``incorrect``, ``wrong``, ``false``, ``inaccurate`` and ``not`` followed (at most
   one word between) by a positive word give 0.0 (``"not correct"``, ``"isn't fully right"``);
2. else the first number, if it denotes a value in [0, 1]: ``0.7``, ``7/10`` (→ 0.7), ``70%`` (→ 0.7);
3. else the reply is unparseable: score 0.0 and ``Judgement.parsed`` is False.

A blank prediction scores 0.0 without asking the model, so a weak judge cannot reward an empty answer.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from rewards.metrics import as_gold_list, f1_score
from rewards.models.chat import ChatModel, check_same_length

__all__ = ["JUDGE_PROMPT", "Judgement", "parse_judgement", "LLMJudge", "f1_judge", "batch_judge"]

JUDGE_PROMPT = (
    "Decide whether a predicted answer to a question is correct. It is correct if it means the same "
    "as at least one of the gold answers; ignore differences in case, punctuation, articles and "
    "wording that keep the meaning.\n\n"
    "Question: {question}\nGold answers: {golden_answers}\nPredicted answer: {prediction}\n\n"
    "Is the predicted answer correct? Reply with yes or no."
)
"""The judge's user message; a ``str.format`` template with {question}, {golden_answers}, {prediction}."""

_POSITIVE = r"yes|correct|right|true|accurate"
_VERDICT = re.compile(
    rf"\b(?:(?P<neg>no|incorrect|wrong|false|inaccurate|(?:not|isn't|isnt)\s+(?:\w+\s+)?(?:{_POSITIVE}))"
    rf"|(?P<pos>{_POSITIVE}))\b"
)
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?|\.\d+)(?:\s*(%)|\s*/\s*(\d+(?:\.\d+)?))?")


@dataclass(frozen=True)
class Judgement:
    """A judge's score with the evidence for it.

    ``parsed`` is False when the reply matched no rule (the score is then 0.0); ``reply`` is the
    model's raw reply, or None when the model was not asked (blank prediction).
    """

    score: float
    parsed: bool
    reply: str | None


def parse_judgement(reply: str) -> tuple[float, bool]:
    """Map a judge model's reply to ``(score in [0, 1], parsed)`` by the rules in the module docstring."""
    text = reply.lower()
    verdict = _VERDICT.search(text)
    if verdict is not None:
        return (0.0 if verdict.group("neg") else 1.0), True
    number = _NUMBER.search(text)
    if number is not None:
        value, percent, denominator = number.groups()
        score = float(value)
        if percent:
            score /= 100.0
        elif denominator:
            score = score / float(denominator) if float(denominator) > 0 else -1.0
        if 0.0 <= score <= 1.0:
            return score, True
    return 0.0, False


class LLMJudge:
    """A judge backed by a chat model: ``judge(question, golden_answers, prediction) -> float``.

    Use ``LLMJudge.local()`` for the offline default (SmolLM2-135M-Instruct; weak, fine for smoke
    runs), ``LLMJudge.local(path)`` for a local checkpoint, ``LLMJudge.http(base_url, model)`` for a
    vLLM/OpenAI-compatible server, or wrap any ``ChatModel``. ``assess``/``assess_batch`` also return
    the raw reply and whether it was understood, for logging.
    """

    def __init__(self, chat: ChatModel, *, template: str = JUDGE_PROMPT) -> None:
        self.chat = chat
        self.template = template

    @classmethod
    def local(cls, path: str | Path | None = None, *, max_new_tokens: int = 16, **options: Any) -> LLMJudge:
        """A local ``transformers`` model (``LocalChatModel.from_pretrained`` options); SmolLM2 by default."""
        from rewards.models.local import LocalChatModel

        return cls(LocalChatModel.from_pretrained(path, max_new_tokens=max_new_tokens, **options))

    @classmethod
    def http(cls, base_url: str, model: str, *, max_tokens: int = 16, **options: Any) -> LLMJudge:
        """A model behind an OpenAI-compatible server (``OpenAIChatModel`` options)."""
        from rewards.models.remote import OpenAIChatModel

        return cls(OpenAIChatModel(base_url, model, max_tokens=max_tokens, **options))

    def prompt(self, question: str, golden_answers: str | Iterable[str], prediction: str) -> str:
        """The user message the judge model answers."""
        golds = "; ".join(as_gold_list(golden_answers))
        return self.template.format(question=question, golden_answers=golds, prediction=prediction)

    def __call__(self, question: str, golden_answers: str | Iterable[str], prediction: str) -> float:
        return self.assess(question, golden_answers, prediction).score

    def judge_batch(
        self, questions: Sequence[str], golden_answers: Sequence[str | Iterable[str]], predictions: Sequence[str]
    ) -> list[float]:
        """Scores for a whole batch, asked of the backend in one batch."""
        return [j.score for j in self.assess_batch(questions, golden_answers, predictions)]

    def assess(self, question: str, golden_answers: str | Iterable[str], prediction: str) -> Judgement:
        """One judgement with its raw reply."""
        return self.assess_batch([question], [golden_answers], [prediction])[0]

    def assess_batch(
        self, questions: Sequence[str], golden_answers: Sequence[str | Iterable[str]], predictions: Sequence[str]
    ) -> list[Judgement]:
        """Judgements for a batch; blank predictions are scored 0.0 without a model call."""
        check_same_length(questions=questions, golden_answers=golden_answers, predictions=predictions)
        asked = [i for i, prediction in enumerate(predictions) if prediction.strip()]
        replies = self.chat.generate([self.prompt(questions[i], golden_answers[i], predictions[i]) for i in asked])
        judgements = [Judgement(0.0, True, None)] * len(predictions)
        for i, reply in zip(asked, replies):
            score, parsed = parse_judgement(reply)
            judgements[i] = Judgement(score, parsed, reply)
        return judgements


def f1_judge(question: str, golden_answers: str | Iterable[str], prediction: str) -> float:
    """The model-free stand-in judge: SQuAD token F1 of the prediction, max over golds (question unused)."""
    return f1_score(prediction, golden_answers)


def batch_judge(
    judge: Callable[[str, list[str], str], float],
    questions: Sequence[str],
    golden_answers: Sequence[str | Iterable[str]],
    predictions: Sequence[str],
) -> list[float]:
    """Scores for a batch from any judge: its ``judge_batch`` when it has one, else one call per item."""
    check_same_length(questions=questions, golden_answers=golden_answers, predictions=predictions)
    judge_batch = getattr(judge, "judge_batch", None)
    if judge_batch is not None:
        return [float(s) for s in judge_batch(questions, golden_answers, predictions)]
    return [float(judge(q, as_gold_list(g), p)) for q, g, p in zip(questions, golden_answers, predictions)]
