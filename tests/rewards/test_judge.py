"""The model-free parts of the model-based rewards: the judge's reply parsing, the F1 stand-in, and the
answer model and judge over any chat backend (a scripted one here). Pure Python: no extra needed."""
from __future__ import annotations

from typing import Callable

import pytest

from rewards.models import (
    JUDGE_PROMPT,
    AnswerModel,
    LLMJudge,
    batch_answer,
    batch_judge,
    f1_judge,
    parse_judgement,
)
from rewards.models.remote import chat_completions_url

SPEC_EVIDENCE_PROMPT = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other "
    "words.\n\nThe following are given passages:\n{evidence}\n\nQuestion: {question}\nAnswer:"
)


# --------------------------------------------------------------------------------------------
# Judge reply parsing and the model-free parts


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("Yes", (1.0, True)),
        ("yes.", (1.0, True)),
        ("No", (0.0, True)),
        ("NO, it is a different city.", (0.0, True)),
        ("The predicted answer is correct.", (1.0, True)),
        ("The predicted answer is incorrect.", (0.0, True)),
        ("It is not correct", (0.0, True)),
        ("That isn't quite right", (0.0, True)),
        ("Wrong answer", (0.0, True)),
        ("True", (1.0, True)),
        ("false", (0.0, True)),
        ("Correct, although no units are given", (1.0, True)),  # the earliest verdict word decides
        ("0.7", (0.7, True)),
        ("Score: 1", (1.0, True)),
        ("7/10", (0.7, True)),
        ("80 %", (0.8, True)),
        ("Score: 8", (0.0, False)),  # out of [0, 1] with no scale given
        ("3/0", (0.0, False)),
        ("I cannot tell.", (0.0, False)),
        ("", (0.0, False)),
        ("Paris", (0.0, False)),
        ("nothing known", (0.0, False)),  # "no" only as a whole word
    ],
)
def test_parse_judgement(reply: str, expected: tuple[float, bool]) -> None:
    score, parsed = parse_judgement(reply)
    assert (score, parsed) == pytest.approx(expected)


def test_f1_judge_is_token_f1() -> None:
    # "the eiffel tower" -> [eiffel, tower]; gold -> [eiffel, tower, in, paris]: P=1, R=1/2, F1=2/3.
    assert f1_judge("Where?", ["Eiffel Tower in Paris"], "The Eiffel Tower") == pytest.approx(2 / 3)
    assert f1_judge("Where?", ["London", "Eiffel Tower"], "eiffel tower!") == 1.0
    assert f1_judge("Where?", ["London"], "Paris") == 0.0


class FakeChat:
    """A ChatModel that records every batch and answers from a script (or echoes)."""

    def __init__(self, reply: Callable[[str], str] = lambda prompt: f"echo:{prompt}") -> None:
        self.reply = reply
        self.batches: list[list[str]] = []

    def generate(self, prompts):
        self.batches.append(list(prompts))
        return [self.reply(p) for p in prompts]


def test_answer_model_prompts_with_the_r_search_template() -> None:
    chat = FakeChat()
    model = AnswerModel(chat)
    answer = model("Who wrote Hamlet?", "(Title: Hamlet) Hamlet is a play by William Shakespeare.")
    expected_prompt = SPEC_EVIDENCE_PROMPT.format(
        evidence="(Title: Hamlet) Hamlet is a play by William Shakespeare.", question="Who wrote Hamlet?"
    )
    assert chat.batches == [[expected_prompt]]
    assert answer == f"echo:{expected_prompt}"


def test_answer_batch_is_one_backend_batch_in_order() -> None:
    chat = FakeChat()
    model = AnswerModel(chat, template="{question}|{evidence}")
    assert model.answer_batch(["q1", "q2", "q3"], ["e1", "e2", "e3"]) == ["echo:q1|e1", "echo:q2|e2", "echo:q3|e3"]
    assert len(chat.batches) == 1
    with pytest.raises(ValueError, match="differ in length"):
        model.answer_batch(["q1", "q2"], ["e1"])


def test_llm_judge_scores_and_flags() -> None:
    replies = {"Paris": "Yes.", "Lyon": "No, the capital is Paris.", "Nice": "Hmm, maybe."}
    chat = FakeChat(lambda prompt: next(v for k, v in replies.items() if f"Predicted answer: {k}\n" in prompt))
    judge = LLMJudge(chat)
    questions = ["Capital of France?"] * 4
    golds = [["Paris", "City of Paris"]] * 4
    judgements = judge.assess_batch(questions, golds, ["Paris", "Lyon", "Nice", "   "])
    assert [j.score for j in judgements] == [1.0, 0.0, 0.0, 0.0]
    assert [j.parsed for j in judgements] == [True, True, False, True]
    assert [j.reply for j in judgements] == ["Yes.", "No, the capital is Paris.", "Hmm, maybe.", None]
    # the blank prediction was never sent; the three others went as one batch
    assert len(chat.batches) == 1 and len(chat.batches[0]) == 3
    assert chat.batches[0][0] == JUDGE_PROMPT.format(
        question="Capital of France?", golden_answers="Paris; City of Paris", prediction="Paris"
    )
    assert judge("Capital of France?", ["Paris"], "Lyon") == 0.0
    assert judge.judge_batch(questions[:2], golds[:2], ["Lyon", "Paris"]) == [0.0, 1.0]


def test_batch_helpers_accept_plain_functions_and_objects() -> None:
    calls = []

    def judge(question, golden_answers, prediction):
        calls.append(golden_answers)
        return 1.0 if prediction in golden_answers else 0.0

    assert batch_judge(judge, ["q", "q"], ["a", ["b", "c"]], ["a", "x"]) == [1.0, 0.0]
    assert calls == [["a"], ["b", "c"]]  # a single gold string arrives as a list, as rewards.score does
    assert batch_answer(lambda q, e: e.upper(), ["q1", "q2"], ["x", "y"]) == ["X", "Y"]
    chat = FakeChat(lambda prompt: "yes")
    assert batch_judge(LLMJudge(chat), ["q", "q"], [["a"], ["b"]], ["a", "b"]) == [1.0, 1.0]
    assert len(chat.batches) == 1
    with pytest.raises(ValueError, match="differ in length"):
        batch_judge(judge, ["q"], ["a", "b"], ["a"])


def test_chat_completions_url() -> None:
    assert chat_completions_url("http://h:8000") == "http://h:8000/v1/chat/completions"
    assert chat_completions_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"
    assert chat_completions_url("https://api.x.com/v1/chat/completions") == "https://api.x.com/v1/chat/completions"
