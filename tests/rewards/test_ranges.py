"""Each built-in preset's declared range is what it can actually give: a hand-written worst and best
response reach the two ends (PROTOCOLS.md's rules), so a table that prints "out of 2.4" is right."""
from __future__ import annotations

import pytest

import rewards

GOLD = ["Paris"]
DOCS = "<|begin_of_query|> capital <|end_of_query|>\n\n<|begin_of_documents|>\n(1)France\nParis is its capital.\n<|end_of_documents|>\n\n"
PLAN = "<search>Nodes:\nA: capital of France (General)\nEdges:\n</search>"

# preset -> (worst response, best response); the model parts answer the gold
CASES = {
    "search-r1": ("", "<answer> Paris </answer>"),
    "search-r1-f1": ("", "<answer> Paris </answer>"),
    "search-r1-format": ("", "<think> x </think><answer> Paris </answer>"),
    "tool-calls-format": ("", '<tool_call>\n{"name": "wiki", "arguments": {"query": "capital"}}\n</tool_call><answer> Paris </answer>'),
    "tool-calls-llama3-format": ("", '{"name": "wiki", "parameters": {"query": "capital"}}<answer> Paris </answer>'),
    "tool-calls-mistral-format": ("", '[TOOL_CALLS] [{"name": "wiki", "arguments": {"query": "capital"}}]<answer> Paris </answer>'),
    "r1-searcher": ("", " x </think><answer> Paris </answer>"),
    "r1-searcher-stage1": ("", DOCS + "</think><answer> Paris </answer>"),
    "r1-searcher-stage2": ("", " x </think><answer> Paris </answer>"),
    "research": ("", "<think> x </think><answer> \\boxed{Paris} </answer>"),
    # worst: evidence without any observation is ill-formed, and there is no answer
    "r-search": ("<original_evidence> x </original_evidence>",
                 "<observation>Paris is the capital.</observation><original_evidence> Paris </original_evidence><answer> Paris </answer>"),
    "reasoning-search": ("", f"<think> x </think>{PLAN}<result> r </result><answer> Paris </answer>"),
}


@pytest.mark.parametrize("preset", sorted(CASES))
def test_the_declared_range_is_reached_at_both_ends(preset: str) -> None:
    worst, best = CASES[preset]
    low, high = rewards.value_range(preset)
    kwargs = {"question": "What is the capital of France?", "evidence_model": lambda q, e: "Paris", "judge": lambda q, g, p: 1.0}
    assert rewards.score(preset, worst, GOLD, **kwargs).total == pytest.approx(low)
    assert rewards.score(preset, best, GOLD, **kwargs).total == pytest.approx(high)


def test_every_builtin_declares_a_range() -> None:
    assert set(CASES) == set(rewards.BUILTIN_PRESETS)
    assert rewards.value_range("r-search") == (0.0, 2.4)


def test_a_user_preset_may_declare_a_range_or_not() -> None:
    rewards.register("test-range-declared", lambda response, golds, **_: 3.0, value_range=(0, 5), replace=True)
    rewards.register("test-range-undeclared", lambda response, golds, **_: 3.0, replace=True)
    assert rewards.value_range("test-range-declared") == (0.0, 5.0)
    assert rewards.value_range("test-range-undeclared") is None
    with pytest.raises(ValueError, match="value_range must be finite"):
        rewards.register("test-range-bad", lambda response, golds, **_: 0.0, value_range=(1, 0))
    with pytest.raises(rewards.UnknownPresetError, match="unknown reward preset 'nope'"):
        rewards.value_range("nope")
