"""Model-based reward parts: R-Search's evidence answer model and the LLM judge, on two backends.

Backends (``ChatModel``): ``LocalChatModel`` (a ``transformers`` causal LM, SmolLM2-135M-Instruct by
default, loaded lazily) and ``OpenAIChatModel`` (``/v1/chat/completions`` of vLLM or any provider).
Roles: ``AnswerModel`` (``(question, evidence) -> answer``) and ``LLMJudge``
(``(question, golden_answers, prediction) -> score``), plus ``f1_judge``, the model-free stand-in.
Plain functions with those signatures are accepted wherever these objects are; ``batch_answer`` and
``batch_judge`` score a batch with either.
"""
from .answer import AnswerModel, batch_answer
from .chat import ChatModel, ModelCallError
from .judge import JUDGE_PROMPT, Judgement, LLMJudge, batch_judge, f1_judge, parse_judgement
from .local import LocalChatModel, default_model_path
from .remote import OpenAIChatModel

__all__ = [
    "AnswerModel",
    "LLMJudge",
    "Judgement",
    "JUDGE_PROMPT",
    "parse_judgement",
    "f1_judge",
    "batch_answer",
    "batch_judge",
    "ChatModel",
    "ModelCallError",
    "LocalChatModel",
    "OpenAIChatModel",
    "default_model_path",
]
