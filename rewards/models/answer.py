"""R-Search's evidence answer model: answer a question from the agent's quoted evidence alone.

The evidence reward asks whether the evidence the agent copied out is enough for a *different* model
to find the answer; that model is prompted with ``rewards.EVIDENCE_PROMPT``. ``AnswerModel`` is the
callable ``(question, evidence) -> answer`` that ``rewards.score("r-search", ...)`` accepts as
``evidence_model``, with ``answer_batch`` for a whole rollout batch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from rewards.models.chat import ChatModel, check_same_length
from rewards.presets import EVIDENCE_PROMPT

__all__ = ["AnswerModel", "batch_answer"]


class AnswerModel:
    """Answers ``template.format(evidence=..., question=...)`` with a chat backend.

    Use ``AnswerModel.local()`` for the offline default (SmolLM2-135M-Instruct), ``AnswerModel.local(path)``
    for another local checkpoint, ``AnswerModel.http(base_url, model)`` for a vLLM/OpenAI-compatible
    server, or wrap any ``ChatModel``. Choose a model of another family than the policy, as R-Search does.
    """

    def __init__(self, chat: ChatModel, *, template: str = EVIDENCE_PROMPT) -> None:
        self.chat = chat
        self.template = template

    @classmethod
    def local(cls, path: str | Path | None = None, *, max_new_tokens: int = 32, **options: Any) -> AnswerModel:
        """A local ``transformers`` model (``LocalChatModel.from_pretrained`` options); SmolLM2 by default."""
        from rewards.models.local import LocalChatModel

        return cls(LocalChatModel.from_pretrained(path, max_new_tokens=max_new_tokens, **options))

    @classmethod
    def http(cls, base_url: str, model: str, *, max_tokens: int = 32, **options: Any) -> AnswerModel:
        """A model behind an OpenAI-compatible server (``OpenAIChatModel`` options)."""
        from rewards.models.remote import OpenAIChatModel

        return cls(OpenAIChatModel(base_url, model, max_tokens=max_tokens, **options))

    def prompt(self, question: str, evidence: str) -> str:
        """The user message the model answers."""
        return self.template.format(evidence=evidence, question=question)

    def __call__(self, question: str, evidence: str) -> str:
        return self.answer_batch([question], [evidence])[0]

    def answer_batch(self, questions: Sequence[str], evidences: Sequence[str]) -> list[str]:
        """One answer per (question, evidence) pair, generated as one batch by the backend."""
        check_same_length(questions=questions, evidences=evidences)
        return self.chat.generate([self.prompt(q, e) for q, e in zip(questions, evidences)])


def batch_answer(
    model: Callable[[str, str], str], questions: Sequence[str], evidences: Sequence[str]
) -> list[str]:
    """Answers for a batch from any answer model: its ``answer_batch`` when it has one, else one call per pair."""
    check_same_length(questions=questions, evidences=evidences)
    answer_batch = getattr(model, "answer_batch", None)
    if answer_batch is not None:
        return list(answer_batch(questions, evidences))
    return [model(q, e) for q, e in zip(questions, evidences)]
