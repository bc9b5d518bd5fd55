"""Staged and composite rewards: stage switching, linear weight schedules, weighted mixes.

Expected values are worked out by hand from PROTOCOLS.md (real presets) or from the recorded fake
rewards' fixed outputs."""
from __future__ import annotations

from typing import Any

import pytest

import rewards
from rewards.result import RewardResult
from rewards.schedule import ComponentMix, LinearSchedule, Preset, RewardMix, StagedReward, StepReward, accepts_option, as_step_reward


class Fixed(StepReward):
    """A fake reward with a fixed result that records how it was called."""

    def __init__(self, name: str, total: float, components: dict[str, Any] | None = None) -> None:
        self.name = name
        self.total = total
        self.components = components or {}
        self.calls: list[dict[str, Any]] = []

    def __call__(self, response, golden_answers, *, step, **kwargs):
        self.calls.append({"response": response, "golden_answers": golden_answers, "step": step, **kwargs})
        return RewardResult(self.total, dict(self.components))


# R1-Searcher response after the prompt's "<think>": one well-formed retrieval, one </think>, one answer.
R1_RESPONSE = (
    "I should look this up.<|begin_of_query|> capital France<|end_of_query|>\n\n<|begin_of_documents|>\n"
    "(1)Paris is the capital of France.\n<|end_of_documents|>\n\nThe documents say Paris.</think>\n"
    "<answer> {answer} </answer>"
)

RS_RESPONSE = (
    "<think>one lookup is enough</think>\n<search>\nNodes:\nA: capital of France (General)\nEdges:{edges}\n</search>\n"
    "<result>A (General): Paris is the capital of France.</result>\n<answer>Paris</answer>"
)


# --------------------------------------------------------------------------------------------
# LinearSchedule


def test_linear_schedule_interpolates_and_holds_the_ends() -> None:
    schedule = LinearSchedule([(10, {"a": 1.0, "b": 0.0}), (110, {"a": 0.0, "b": 2.0}), (210, {"a": 0.0, "b": 1.0})])
    assert schedule(0) == {"a": 1.0, "b": 0.0}
    assert schedule(10) == {"a": 1.0, "b": 0.0}
    assert schedule(35) == pytest.approx({"a": 0.75, "b": 0.5})
    assert schedule(110) == {"a": 0.0, "b": 2.0}
    assert schedule(160) == pytest.approx({"a": 0.0, "b": 1.5})
    assert schedule(10_000) == {"a": 0.0, "b": 1.0}
    assert schedule.keys == ["a", "b"]


def test_linear_schedule_single_knot_is_constant() -> None:
    schedule = LinearSchedule([(0, {"w": 0.3})])
    assert schedule(0) == schedule(999) == {"w": 0.3}


@pytest.mark.parametrize(
    "knots, message",
    [
        ([], "at least one"),
        ([(5, {"a": 1.0}), (5, {"a": 0.0})], "strictly increasing"),
        ([(5, {"a": 1.0}), (2, {"a": 0.0})], "strictly increasing"),
        ([(-1, {"a": 1.0})], "strictly increasing ints >= 0"),
        ([(0.5, {"a": 1.0})], "strictly increasing ints"),
        ([(0, {"a": 1.0}), (9, {"b": 0.0})], "names"),
        ([(0, {"a": float("nan")})], "non-finite"),
    ],
)
def test_linear_schedule_rejects_bad_knots(knots, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LinearSchedule(knots)


@pytest.mark.parametrize("step", [-1, 1.5, True, "3"])
def test_bad_step_is_rejected(step) -> None:
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        LinearSchedule([(0, {"a": 1.0})])(step)
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        StagedReward([(0, Fixed("a", 1.0))])("x", ["y"], step=step)


# --------------------------------------------------------------------------------------------
# StagedReward


def test_staged_reward_switches_at_the_stage_start() -> None:
    first, second = Fixed("first", 1.0, {"part": 0.5}), Fixed("second", -2.0)
    staged = StagedReward([(0, first), (100, second)])
    results = {step: staged("resp", ["gold"], step=step, question="q?") for step in (0, 99, 100, 5000)}
    assert [results[s].total for s in (0, 99, 100, 5000)] == [1.0, 1.0, -2.0, -2.0]
    assert results[99].components == {"part": 0.5, "stage": 0, "stage_reward": "first"}
    assert results[100].components == {"stage": 1, "stage_reward": "second"}
    assert [c["step"] for c in first.calls] == [0, 99] and [c["step"] for c in second.calls] == [100, 5000]
    assert first.calls[0] == {"response": "resp", "golden_answers": ["gold"], "step": 0, "question": "q?"}
    assert staged.stage_at(0) == 0 and staged.stage_at(99) == 0 and staged.stage_at(100) == 1


@pytest.mark.parametrize(
    "stages, message",
    [
        ([], "at least one"),
        ([(1, "search-r1")], "start at step 0"),
        ([(0, "search-r1"), (0, "search-r1-format")], "strictly increasing"),
        ([(0, "search-r1"), (10.0, "search-r1-format")], "strictly increasing ints"),
    ],
)
def test_staged_reward_rejects_bad_stages(stages, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StagedReward(stages)


def test_r1_searcher_two_stages_on_real_presets() -> None:
    # stage 1 (reference Llama code): +1 cover-EM, +0.5 balanced retrieval >= 1, +0.5 think/answer format
    # stage 2: answer F1, no penalty (counts equal, one </think>, one answer pair, no CJK)
    staged = StagedReward([(0, "r1-searcher-stage1"), (300, "r1-searcher-stage2")])
    right, wrong = R1_RESPONSE.format(answer="Paris"), R1_RESPONSE.format(answer="Lyon")
    at_0, at_300 = staged(right, ["Paris"], step=0), staged(right, ["Paris"], step=300)
    assert at_0.total == pytest.approx(2.0) and at_0.components["stage_reward"] == "r1-searcher-stage1"
    assert at_300.total == pytest.approx(1.0) and at_300.components["stage"] == 1
    assert staged(wrong, ["Paris"], step=299).total == pytest.approx(0.0)  # -1 + 0.5 + 0.5
    assert staged(wrong, ["Paris"], step=301).total == pytest.approx(0.0)
    # "Paris France" against "Paris": stage 1 covers the gold (+1), stage 2 F1 = 2*(1/2*1)/(1/2+1) = 2/3
    partial = R1_RESPONSE.format(answer="Paris France")
    assert staged(partial, ["Paris"], step=0).total == pytest.approx(2.0)
    assert staged(partial, ["Paris"], step=300).total == pytest.approx(2 / 3)


def test_unknown_preset_fails_at_construction() -> None:
    with pytest.raises(rewards.UnknownPresetError, match="known: .*search-r1"):
        StagedReward([(0, "search-r1"), (5, "no-such-preset")])
    with pytest.raises(TypeError, match="preset name or a StepReward"):
        as_step_reward(3.0)


# --------------------------------------------------------------------------------------------
# Preset with bound or scheduled options


def test_preset_binds_options_and_call_time_options_win() -> None:
    with pytest.raises(TypeError, match="judge_weight"):  # proves options reach the preset: search-r1 takes no weight options
        Preset("search-r1", judge_weight=1.0)("<answer>Paris</answer>", ["Paris"], step=0)
    # r1-searcher-stage1 without its answer term (the paper's form): 0.5 retrieval + 0.5 format
    no_answer_term = Preset("r1-searcher-stage1", answer_term=False)
    wrong = R1_RESPONSE.format(answer="Lyon")
    assert no_answer_term(wrong, ["Paris"], step=0).total == pytest.approx(1.0)
    assert no_answer_term(wrong, ["Paris"], step=0, answer_term=True).total == pytest.approx(0.0)


def test_preset_with_scheduled_weights_keeps_the_preset_formula() -> None:
    curriculum = Preset("reasoning-search", schedule=LinearSchedule([(0, {"judge_weight": 0.0}), (10, {"judge_weight": 1.0})]))

    def judge(question, golden_answers, prediction):
        return 0.5

    valid, cyclic = RS_RESPONSE.format(edges=""), RS_RESPONSE.format(edges="\nA -> A")
    # DAG valid: 0.25 dag + 0.25 * format(1) + judge_weight * 0.5
    at = {step: curriculum(valid, ["Paris"], step=step, question="Capital of France?", judge=judge) for step in (0, 4, 10, 50)}
    assert [at[s].total for s in (0, 4, 10, 50)] == pytest.approx([0.5, 0.7, 1.0, 1.0])
    assert at[4].components["option/judge_weight"] == pytest.approx(0.4)
    assert at[4].components["judge"] == 0.5
    # DAG invalid (self-loop): only 0.25 * format, whatever the judge weight
    assert curriculum(cyclic, ["Paris"], step=10, question="Capital of France?", judge=judge).total == pytest.approx(0.25)


# --------------------------------------------------------------------------------------------
# ComponentMix


def test_component_mix_weights_components_by_schedule() -> None:
    base = Fixed("base", 9.0, {"format": True, "dag_valid": 1.0, "judge": None, "answer": "Paris"})
    mix = ComponentMix(base, LinearSchedule([(0, {"format": 1.0, "judge": 0.0}), (100, {"format": 0.0, "judge": 2.0})]))
    result = mix("resp", ["gold"], step=25)
    assert result.total == pytest.approx(0.75)  # 0.75 * True + 0.5 * None(=0)
    assert result.components["base_total"] == 9.0 and result.components["answer"] == "Paris"
    assert result.components["weight/format"] == pytest.approx(0.75) and result.components["weight/judge"] == pytest.approx(0.5)
    assert base.calls[0]["step"] == 25

    base.components["judge"] = 0.5
    assert ComponentMix(base, {"judge": 2.0, "dag_valid": -1.0})("resp", ["gold"], step=0).total == pytest.approx(0.0)


def test_component_mix_errors_name_the_component() -> None:
    base = Fixed("base", 1.0, {"f1": 0.5, "answer": "Paris"})
    with pytest.raises(KeyError, match="no component 'judge'.*'answer', 'f1'"):
        ComponentMix(base, {"judge": 1.0})("r", ["g"], step=0)
    with pytest.raises(TypeError, match="component 'answer' of reward 'base' is 'Paris', not a number"):
        ComponentMix(base, {"answer": 1.0})("r", ["g"], step=0)
    with pytest.raises(ValueError, match="at least one weight"):
        ComponentMix(base, {})


def test_component_mix_reproduces_reasoning_search_and_shifts_weight() -> None:
    weights = LinearSchedule([(0, {"format": 0.5, "dag_valid": 0.5, "judge": 0.0}), (100, {"format": 0.1, "dag_valid": 0.2, "judge": 0.7})])
    mix = ComponentMix("reasoning-search", weights)

    def judge(question, golden_answers, prediction):
        return 0.5

    kwargs = {"question": "Capital of France?", "judge": judge}
    valid, cyclic = RS_RESPONSE.format(edges=""), RS_RESPONSE.format(edges="\nA -> A")
    # step 50: weights format 0.3, dag 0.35, judge 0.35 -> 0.3 + 0.35 + 0.35 * 0.5
    assert mix(valid, ["Paris"], step=50, **kwargs).total == pytest.approx(0.825)
    # invalid DAG: the preset skips the judge (None) -> only 0.3 * format
    result = mix(cyclic, ["Paris"], step=50, **kwargs)
    assert result.total == pytest.approx(0.3)
    assert result.components["base_total"] == pytest.approx(0.25)  # the preset's own 0.25 * format
    # the paper's weights as constants give back the preset's total: 0.25 + 0.25 + 0.5 * 0.5
    paper = ComponentMix("reasoning-search", {"format": 0.25, "dag_valid": 0.25, "judge": 0.5})
    assert paper(valid, ["Paris"], step=0, **kwargs).total == pytest.approx(rewards.score("reasoning-search", valid, ["Paris"], **kwargs).total)


# --------------------------------------------------------------------------------------------
# RewardMix


def test_reward_mix_of_presets() -> None:
    mix = RewardMix({"search-r1": 0.5, "search-r1-format": 0.25})
    # right answer, valid v0.3 format: EM 1.0 and format table 1.0 -> 0.5 + 0.25
    right = mix("<think> easy </think>\n<answer> Paris </answer>", ["Paris"], step=0)
    assert right.total == pytest.approx(0.75)
    assert right.components["search-r1/total"] == 1.0 and right.components["search-r1/em"] == 1.0
    assert right.components["weight/search-r1-format"] == 0.25
    # wrong answer, valid format: EM 0 and format table 0.2 -> 0.05
    assert mix("<think> easy </think>\n<answer> Lyon </answer>", ["Paris"], step=0).total == pytest.approx(0.05)


def test_reward_mix_with_labels_schedule_and_nesting() -> None:
    a, b = Fixed("a", 1.0, {"x": 3}), Fixed("b", 10.0)
    staged = StagedReward([(0, a), (50, b)])
    mix = RewardMix(LinearSchedule([(0, {"main": 1.0, "aux": 0.0}), (100, {"main": 0.0, "aux": 1.0})]), {"main": staged, "aux": b})
    result = mix("r", ["g"], step=60, question="q")
    # main = staged at step 60 -> b (10.0) weighted 0.4; aux = b (10.0) weighted 0.6
    assert result.total == pytest.approx(10.0)
    assert result.components["main/stage"] == 1 and result.components["weight/aux"] == pytest.approx(0.6)
    assert mix("r", ["g"], step=10).total == pytest.approx(0.9 * 1.0 + 0.1 * 10.0)
    assert all(call["step"] in (10, 60) for call in a.calls + b.calls)
    with pytest.raises(ValueError, match=r"terms \['extra'\] have no weight"):
        RewardMix({"main": 1.0}, {"main": a, "extra": b})
    with pytest.raises(rewards.UnknownPresetError):
        RewardMix({"not-a-preset": 1.0})


def test_accepts_option_follows_presets_through_stages_and_mixes() -> None:
    assert accepts_option("reasoning-search", "tools") and not accepts_option("search-r1", "tools")
    assert accepts_option(Preset("reasoning-search", judge_weight=0.2), "tools")
    assert not accepts_option(Preset("reasoning-search", tools=("wiki",)), "tools"), "bound by the user: not filled in"
    assert accepts_option(StagedReward([(0, "reasoning-search"), (5, Preset("reasoning-search"))]), "tools")
    assert not accepts_option(StagedReward([(0, "reasoning-search"), (5, "search-r1")]), "tools")
    assert accepts_option(ComponentMix("reasoning-search", {"judge": 1.0}), "tools")
    assert not accepts_option(RewardMix({"reasoning-search": 0.5, "search-r1": 0.5}), "tools")
    assert not accepts_option(Fixed("opaque", 1.0), "tools"), "an unknown StepReward is not assumed to take it"
    rewards.register("takes-anything", lambda response, golds, **options: 0.0, replace=True)
    assert accepts_option("takes-anything", "tools")
