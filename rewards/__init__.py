"""Rewards for search agents: answer metrics, format checks and the seed systems' reward presets.

``rewards.score("search-r1", response, golden_answers)`` scores one episode; ``rewards.available()``
lists the presets and ``rewards.register(name, fn)`` adds one. This package depends on nothing else in
the project, so a trainer or an evaluation script can use it alone.
"""
from .metrics import cover_exact_match, exact_match, f1_score, normalize_r1, normalize_squad
from .presets import BUILTIN_PRESETS, BUILTIN_RANGES, EVIDENCE_PROMPT
from .name_registry import Registry
from .registry import UnknownNameError, UnknownPresetError, available, register, score, value_range
from .result import RewardResult
from .schedule import ComponentMix, LinearSchedule, Preset, RewardMix, StagedReward, StepReward
from .models import (
    JUDGE_PROMPT,
    AnswerModel,
    Judgement,
    LLMJudge,
    LocalChatModel,
    ModelCallError,
    OpenAIChatModel,
    batch_answer,
    batch_judge,
    f1_judge,
)

for _name, _fn in BUILTIN_PRESETS.items():
    register(_name, _fn, value_range=BUILTIN_RANGES[_name])
del _name, _fn

__all__ = [
    "RewardResult",
    "score",
    "register",
    "available",
    "value_range",
    "UnknownNameError",
    "Registry",
    "UnknownPresetError",
    "EVIDENCE_PROMPT",
    "exact_match",
    "f1_score",
    "cover_exact_match",
    "normalize_squad",
    "normalize_r1",
    "StepReward",
    "Preset",
    "StagedReward",
    "LinearSchedule",
    "ComponentMix",
    "RewardMix",
    "AnswerModel",
    "LLMJudge",
    "Judgement",
    "JUDGE_PROMPT",
    "f1_judge",
    "batch_answer",
    "batch_judge",
    "LocalChatModel",
    "OpenAIChatModel",
    "ModelCallError",
]
