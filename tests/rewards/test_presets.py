"""Every reward preset on hand-made responses; expected totals worked out by hand from PROTOCOLS.md."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rewards
from rewards import registry

INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and "
    "</answer>. Let me try again.\n"
)


def total(preset: str, response: str, golds, **kwargs) -> float:
    return rewards.score(preset, response, golds, **kwargs).total


# ---------------------------------------------------------------------------------------------
# score / register / available


def test_available_lists_the_seed_presets():
    assert {
        "search-r1",
        "search-r1-format",
        "r1-searcher",
        "r1-searcher-stage1",
        "r1-searcher-stage2",
        "research",
        "r-search",
        "reasoning-search",
    } <= set(rewards.available())


def test_unknown_preset_lists_names():
    with pytest.raises(rewards.UnknownNameError) as info:
        rewards.score("search-r2", "x", ["y"])
    assert isinstance(info.value, ValueError)
    assert "search-r2" in str(info.value) and "search-r1-format" in str(info.value)


def test_unknown_option_is_a_type_error():
    with pytest.raises(TypeError, match="weight"):
        rewards.score("search-r1", "<answer>x</answer>", ["x"], weight=2)


def test_register_wraps_floats_and_passes_everything(monkeypatch):
    monkeypatch.setattr(registry, "_PRESETS", registry._PRESETS.copy())
    seen = {}

    def length_reward(response, golden_answers, *, question, ended_with_eos, evidence_model, judge, scale=1.0):
        seen.update(golds=golden_answers, question=question, eos=ended_with_eos, scale=scale)
        return scale * len(response)

    rewards.register("length", length_reward)
    assert "length" in rewards.available()
    result = rewards.score("length", "abcd", "gold", question="q?", ended_with_eos=False, scale=0.5)
    assert isinstance(result, rewards.RewardResult)
    assert result.total == 2.0 and result.components == {}
    assert seen == {"golds": ["gold"], "question": "q?", "eos": False, "scale": 0.5}
    rewards.register("length", length_reward)  # the same function again: harmless (a module imported twice)
    with pytest.raises(ValueError, match="already registered"):
        rewards.register("length", lambda response, golds, **_: 7)
    rewards.register("length", lambda response, golds, **_: 7, replace=True)
    assert total("length", "x", []) == 7.0


def test_golds_as_a_string_or_tuple():
    assert total("search-r1", "<answer>Paris</answer>", "Paris") == 1.0
    assert total("search-r1", "<answer>Paris</answer>", ("London", "Paris")) == 1.0


# ---------------------------------------------------------------------------------------------
# search-r1

SR1_TRACE = (
    "<think>I need to find the capital.</think>\n<search> capital of France </search>\n\n"
    "<information>Doc 1(Title: Paris) Paris is the capital of France.\n</information>\n\n"
    "<think>It is Paris.</think>\n<answer> Paris </answer>"
)


@pytest.mark.parametrize(
    "response, golds, expected",
    [
        (SR1_TRACE, ["Paris"], 1.0),
        (SR1_TRACE, ["London"], 0.0),
        (SR1_TRACE, ["London", "paris"], 1.0),  # several golds
        (SR1_TRACE.replace(" Paris </answer>", "The City of Light</answer>"), ["Paris", "city of light"], 1.0),
        (SR1_TRACE.replace(" Paris </answer>", "Paris, France</answer>"), ["Paris"], 0.0),  # EM is strict
        ("<answer>London</answer> <answer>Paris</answer>", ["Paris"], 1.0),  # the last answer
        ("<answer>Paris</answer> <answer>London</answer>", ["Paris"], 0.0),
        ("<think>no idea</think>", ["Beijing"], 0.0),  # no answer → 0 (the reference would read "Beijing")
        ("<think>x</think>" + INVALID_ACTION, ["Paris"], 0.0),  # the message's "<answer> and </answer>"
        ("<answer>yes</answer>", ["Yes"], 1.0),
        ("<answer>北京</answer>", ["北京"], 1.0),
    ],
)
def test_search_r1(response, golds, expected):
    assert total("search-r1", response, golds) == expected


def test_search_r1_components():
    result = rewards.score("search-r1", "<think>x</think>" + INVALID_ACTION, ["and"])
    assert result.components["answer"] == "and" and result.total == 1.0
    assert rewards.score("search-r1", "no answer", ["x"]).components["answer"] is None


# ---------------------------------------------------------------------------------------------
# search-r1-format (v0.3)


@pytest.mark.parametrize(
    "response, golds, expected, error",
    [
        (SR1_TRACE, ["Paris"], 1.0, None),  # correct & valid
        (SR1_TRACE + " Done.", ["Paris"], 0.8, "text_outside_tags"),  # correct & invalid
        (SR1_TRACE, ["London"], 0.2, None),  # wrong & valid
        ("Hmm " + SR1_TRACE, ["London"], 0.1, "text_outside_tags"),  # wrong & invalid
        ("<think>no idea</think>", ["Paris"], 0.1, "incomplete"),  # answerless: wrong, never valid
        ("<think>x</think>" + INVALID_ACTION + "<think>y</think><answer>Paris</answer>", ["Paris"], 0.8, "text_outside_tags"),
        (SR1_TRACE.replace("<think>It", "<think><think>It"), ["Paris"], 0.8, "tag_count:think"),
    ],
)
def test_search_r1_format(response, golds, expected, error):
    result = rewards.score("search-r1-format", response, golds)
    assert result.total == pytest.approx(expected)
    assert result.components["format_error"] == error
    assert result.components["format_valid"] is (error is None)


def test_search_r1_format_weights_and_retrieval_bonus():
    assert total("search-r1-format", SR1_TRACE, ["Paris"], score=2.0) == pytest.approx(2.0)
    assert total("search-r1-format", SR1_TRACE + " x", ["Paris"], score=2.0, structure_format_score=0.5) == pytest.approx(1.5)
    # wrong answer, valid, and a gold ("France") inside an information block: 0.2 + retrieval_score
    assert total("search-r1-format", SR1_TRACE, ["France"], retrieval_score=0.1) == pytest.approx(0.3)
    assert total("search-r1-format", SR1_TRACE, ["Lyon"], retrieval_score=0.1) == pytest.approx(0.2)
    assert total("search-r1-format", "x " + SR1_TRACE, ["France"], retrieval_score=0.1) == pytest.approx(0.1)


# ---------------------------------------------------------------------------------------------
# r1-searcher (base reward), stage 1 and stage 2

R1_DOCS = "<|end_of_query|>\n\n<|begin_of_documents|>\n(1)Paris is the capital of France.\n(2)Lyon is a city.\n<|end_of_documents|>\n\n"
R1_TRACE = " I should look it up. <|begin_of_query|>capital France" + R1_DOCS + "So it is Paris.</think>\n<answer> Paris </answer>"
R1_NO_SEARCH = " I know it.</think>\n<answer> Paris </answer>"
R1_NONE_DOCS = R1_TRACE.replace("(1)Paris is the capital of France.\n(2)Lyon is a city.\n", "None")
ELEVEN_WORDS = "Paris is the capital city of France and it is big"
F1_ELEVEN = 2 * (1 / 10) / (1 / 10 + 1)  # r1 normalisation keeps 10 tokens ("the" dropped); 1 in common


@pytest.mark.parametrize(
    "response, golds, expected, error",
    [
        (R1_TRACE, ["Paris"], 1.0, None),
        (R1_TRACE + "<|endoftext|>", ["Paris"], 1.0, None),  # EOS already there: still exactly one
        (R1_NO_SEARCH, ["Paris"], 1.0, None),  # no retrieval: all seven counts are 0
        (R1_TRACE, ["Paris, France"], 2 / 3, None),  # partial F1
        (R1_TRACE, ["London", "Paris"], 1.0, None),
        (R1_TRACE, ["London"], 0.0, None),
        (R1_TRACE.replace(" Paris </answer>", " True </answer>"), ["yes"], 1.0, None),  # True → yes
        (R1_TRACE.replace(" Paris </answer>", "no</answer>"), ["yes"], 0.0, None),  # yes/no rule
        (R1_TRACE.replace(" Paris </answer>", "New_York</answer>"), ["new york"], 1.0, None),
        (R1_TRACE.replace("</think>", "</think></think>"), ["Paris"], -1.0, "think_count"),
        ("<think>" + R1_TRACE, ["Paris"], -1.0, "think_count"),
        (R1_TRACE.replace("</answer>", ""), ["Paris"], -2.0, "answer_count"),  # no answer tags → F1 0
        (" I give up.</think>", ["Paris"], -2.0, "answer_count"),
        (R1_NONE_DOCS, ["Paris"], -1.0, "retrieval_count"),
        (R1_TRACE.replace("Lyon is a city", "Assistant"), ["Paris"], -1.0, "assistant"),
        (R1_TRACE.replace("So it is", "所以"), ["Paris"], -1.0, "cjk"),
        (R1_TRACE.replace("Lyon is a city", "里昂"), ["Paris"], 1.0, None),  # CJK inside documents
        (R1_TRACE.replace(" Paris </answer>", ELEVEN_WORDS + "</answer>"), ["Paris"], F1_ELEVEN - 2, "answer_too_long"),
        (R1_TRACE.replace(" Paris </answer>", "begin_of_query Paris</answer>"), ["Paris"], 0.4 - 2, "answer_has_call"),  # "begin of query paris"
        # the prompt's last line inside the response: only what follows its last occurrence is scored
        ("Assistant: <answer>London</answer>\nAssistant: <think>" + R1_TRACE, ["Paris"], 1.0, None),
    ],
)
def test_r1_searcher(response, golds, expected, error):
    result = rewards.score("r1-searcher", response, golds)
    assert result.total == pytest.approx(expected)
    assert result.components["format_error"] == error


def test_r1_searcher_eos_does_not_matter_and_is_configurable():
    assert total("r1-searcher", R1_TRACE, ["Paris"], ended_with_eos=False) == 1.0
    # no closing tag: the answer runs to the end, EOS string included → an answer_count violation
    result = rewards.score("r1-searcher", " x</think><answer> Paris", ["Paris"], eos_string="<|im_end|>")
    assert result.components["answer"] == "Paris<|im_end|>" and result.total == -2.0
    assert total("r1-searcher", R1_TRACE.replace("Lyon is a city", "Assistant"), ["Paris"], format_penalty=-0.5) == 0.5
    eleven_words = R1_TRACE.replace(" Paris </answer>", ELEVEN_WORDS + "</answer>")
    assert total("r1-searcher", eleven_words, ["Paris"], max_answer_words=11) == pytest.approx(F1_ELEVEN)
    assert total("r1-searcher", "Q\n\nUser:q\nA: <think> x</think><answer>Paris</answer>", ["Paris"], prompt_suffix="\nA: <think>") == 1.0


@pytest.mark.parametrize(
    "response, golds, expected",
    [
        (R1_TRACE, ["Paris"], 2.0),  # +1 cover, +0.5 retrieval, +0.5 format
        (R1_TRACE, ["London"], 0.0),  # −1 + 0.5 + 0.5
        (R1_TRACE.replace(" Paris </answer>", "Paris, the French capital</answer>"), ["paris"], 2.0),  # covers
        (R1_TRACE.replace(" Paris </answer>", "Paris</answer>"), ["Paris France"], 0.0),  # does not cover
        (R1_NO_SEARCH, ["Paris"], 1.5),  # no retrieval: counts equal but 0
        (R1_NONE_DOCS, ["Paris"], 1.5),  # "None" documents: counts differ
        ("<think>" + R1_TRACE, ["Paris"], 1.5),  # format fails
        (R1_TRACE.replace("</answer>", ""), ["Paris"], -1.0 + 0.5),  # no answer tags: −1, no format
        (R1_TRACE.replace("So it is", "所以 Assistant"), ["Paris"], 2.0),  # stage 1 ignores CJK and "Assistant"
        (R1_TRACE.replace(" Paris </answer>", " True </answer>"), ["yes"], 2.0),
        (R1_TRACE.replace(" Paris </answer>", ELEVEN_WORDS + "</answer>"), ["Paris"], 2.0),
    ],
)
def test_r1_searcher_stage1(response, golds, expected):
    assert total("r1-searcher-stage1", response, golds) == pytest.approx(expected)


def test_r1_searcher_stage1_without_answer_term():
    assert total("r1-searcher-stage1", R1_TRACE, ["London"], answer_term=False) == 1.0
    assert total("r1-searcher-stage1", R1_NO_SEARCH, ["Paris"], answer_term=False) == 0.5
    assert total("r1-searcher-stage1", R1_TRACE, ["Paris"], retrieval_reward=0.25, format_reward=0.0) == 1.25
    # the stages' default EOS string is Llama's <|eot_id|>
    assert rewards.score("r1-searcher-stage1", " x</think><answer>Paris", ["Paris"]).components["answer"] == "Paris<|eot_id|>"


@pytest.mark.parametrize(
    "response, golds, expected",
    [
        (R1_TRACE, ["Paris"], 1.0),
        (R1_TRACE, ["Paris France"], 2 / 3),
        (R1_TRACE, ["London"], 0.0),
        (R1_NONE_DOCS, ["Paris"], 0.0),  # 1 − 1
        (R1_TRACE.replace("So it is", "所以"), ["Paris"], 0.0),
        ("<think>" + R1_TRACE, ["Paris"], 0.0),
        (R1_TRACE.replace("</answer>", ""), ["Paris"], -1.0),
        (R1_TRACE.replace("Lyon is a city", "Assistant"), ["Paris"], 1.0),  # no "Assistant" rule here
        (R1_TRACE.replace(" Paris </answer>", ELEVEN_WORDS + "</answer>"), ["Paris"], F1_ELEVEN),  # no length rule
    ],
)
def test_r1_searcher_stage2(response, golds, expected):
    assert total("r1-searcher-stage2", response, golds) == pytest.approx(expected)


def test_r1_searcher_stage2_penalty_weight():
    assert total("r1-searcher-stage2", R1_NONE_DOCS, ["Paris"], format_penalty=-0.25) == 0.75


# ---------------------------------------------------------------------------------------------
# research

RESEARCH_TRACE = (
    "<think>I need the capital.</think> <search>capital of France</search> <result>\nParis is the capital.\n"
    "</result> <think>It is Paris.</think> <answer>The final answer is \\[ \\boxed{Paris} \\]</answer>"
)


def _research_answer(text: str) -> str:
    return RESEARCH_TRACE.replace("The final answer is \\[ \\boxed{Paris} \\]", text)


@pytest.mark.parametrize(
    "response, golds, eos, expected, error",
    [
        (RESEARCH_TRACE, ["Paris"], True, 1.0, None),
        (RESEARCH_TRACE, ["Paris"], False, 0.0, "no_eos"),  # missing EOS
        (RESEARCH_TRACE, ["London"], True, 0.1, None),  # wrong answer, good format
        (RESEARCH_TRACE, ["Paris France"], True, 2 / 3, None),
        (RESEARCH_TRACE, ["Paris is in France"], True, 0.4, None),  # p 1, r 1/4: any F1 > 0 is kept
        (RESEARCH_TRACE, ["London", "Paris"], True, 1.0, None),
        (RESEARCH_TRACE.replace("<think>It", "It"), ["Paris"], True, 0.0, "think_unpaired"),
        (_research_answer("Paris"), ["Paris"], True, 0.0, "answer_not_boxed"),
        (_research_answer("\\boxed{no}"), ["yes"], True, 0.1, None),  # yes/no rule → F1 0 → floor
        (_research_answer("\\boxed{London} or \\boxed Paris$ end"), ["Paris"], True, 1.0, None),  # "\boxed " wins
        (_research_answer("\\boxed{Paris} and \\boxed{x"), ["Paris"], True, 0.0, "boxed_unreadable"),  # unmatched
        (_research_answer("\\boxed{Paris} \\boxed"), ["Paris"], True, 0.0, "boxed_unreadable"),
        (_research_answer("\\boxed{北京}"), ["北京"], True, 1.0, None),
    ],
)
def test_research(response, golds, eos, expected, error):
    result = rewards.score("research", response, golds, ended_with_eos=eos)
    assert result.total == pytest.approx(expected)
    assert result.components["format_error"] == error


def test_research_boxed_text_is_scored_after_normalisation():
    # "\text{Paris}" normalises to "textparis": F1 0 against "Paris", so the 0.1 floor applies
    assert total("research", _research_answer("\\boxed{\\text{Paris}}"), ["Paris"]) == pytest.approx(0.1)
    assert total("research", RESEARCH_TRACE, ["London"], wrong_answer_score=0.0) == 0.0


# ---------------------------------------------------------------------------------------------
# r-search

RS_TRACE = (
    "I will search. <search>capital of France</search>\n\n<observation>(Title: Paris) Paris is the capital "
    "of France.\n</observation>\n\n<original_evidence>Paris is the capital of France.</original_evidence>"
    "<answer>Paris</answer>"
)


class Recorder:
    """An evidence model that records its calls and answers a fixed text."""

    def __init__(self, reply: str):
        self.reply, self.calls = reply, []

    def __call__(self, question: str, evidence: str) -> str:
        self.calls.append((question, evidence))
        return self.reply


def test_r_search_without_evidence_model_skips_evidence():
    result = rewards.score("r-search", RS_TRACE, ["Paris"])
    assert result.total == pytest.approx(1.4)  # 0.2 + 0.2 + 1.0 + 0
    assert result.components["evidence_skipped"] is True and result.components["evidence_f1"] == 0.0


@pytest.mark.parametrize(
    "reply, expected",
    [("Paris", 2.4), ("the city of Paris", 1.9), ("London", 1.4)],  # "city of paris": p 1/3, r 1 → 0.5
)
def test_r_search_with_evidence_model(reply, expected):
    model = Recorder(reply)
    result = rewards.score("r-search", RS_TRACE, ["Paris"], question="What is the capital of France?", evidence_model=model)
    assert result.total == pytest.approx(expected)
    assert model.calls == [("What is the capital of France?", "Paris is the capital of France.")]
    assert result.components["evidence_skipped"] is False


@pytest.mark.parametrize(
    "response, golds, expected",
    [
        ("<answer>Paris</answer>", ["Paris"], 1.4),  # no search, evidence rightly omitted
        ("<answer>Paris</answer>", ["Paris France"], 1.07),  # 0.2 + 0.2 + round(2/3, 2)
        ("<answer>yes</answer>", ["yes sir"], 1.07),  # no yes/no rule here
        ("<original_evidence>Paris</original_evidence><answer>Paris</answer>", ["Paris"], 1.2),  # evidence without search
        (RS_TRACE.replace("<original_evidence>Paris is the capital of France.</original_evidence>", ""), ["Paris"], 1.2),
        (INVALID_ACTION + "<answer>Paris</answer>", ["Paris"], 1.2),  # two answer matches
        ("<answer> and </answer>", ["and"], 1.2),  # answer "and" is ill-formed but still scored: 0 + 0.2 + 1
        ("Paris", ["Paris"], 0.2),  # no answer
    ],
)
def test_r_search_counting_rules(response, golds, expected):
    assert total("r-search", response, golds, question="q", evidence_model=Recorder("never")) == pytest.approx(expected)


def test_r_search_evidence_model_only_on_scored_evidence():
    model = Recorder("Paris")
    # evidence without any observation: no evidence, model not called
    rewards.score("r-search", "<original_evidence>Paris</original_evidence><answer>x</answer>", ["Paris"], question="q", evidence_model=model)
    assert model.calls == []
    # two evidence blocks: not well-formed, but the last one is still scored
    response = RS_TRACE.replace("<answer>", "<original_evidence>second</original_evidence><answer>")
    result = rewards.score("r-search", response, ["Paris"], question="q", evidence_model=model)
    assert model.calls == [("q", "second")]
    assert result.total == pytest.approx(0.2 + 0.0 + 1.0 + 1.0)


def test_r_search_needs_question_for_evidence_model():
    with pytest.raises(ValueError, match="question"):
        rewards.score("r-search", RS_TRACE, ["Paris"], evidence_model=Recorder("Paris"))


def test_r_search_weights():
    result = rewards.score("r-search", RS_TRACE, ["Paris"], question="q", evidence_model=Recorder("Paris"),
                           answer_format_weight=0.5, evidence_format_weight=0.0, evidence_weight=0.5)
    assert result.total == pytest.approx(0.5 + 0.0 + 1.0 + 0.5)


# ---------------------------------------------------------------------------------------------
# reasoning-search

RSR_PLAN = "\nNodes:\nA: capital of France (General)\nB: population of Paris (News)\nEdges:\nA -> B\n"
RSR_TRACE = (
    f"<think>I need two facts.</think>\n<search>{RSR_PLAN}</search>\n"
    "<result>A [general]: Paris is the capital.\nB [news]: 2.1 million</result>\n<answer>Paris</answer>"
)


class Judge:
    def __init__(self, value: float):
        self.value, self.calls = value, []

    def __call__(self, question, golden_answers, prediction):
        self.calls.append((question, golden_answers, prediction))
        return self.value


@pytest.mark.parametrize(
    "response, golds, expected",
    [
        (RSR_TRACE, ["Paris"], 1.0),  # 0.25 + 0.25 + 0.5·F1 stand-in
        (RSR_TRACE, ["Paris France"], 0.5 + 0.5 * 2 / 3),
        (RSR_TRACE, ["London"], 0.5),
        (RSR_TRACE.replace("A -> B", "A -> B; B -> A"), ["Paris"], 0.25),  # cycle: 0.25·format only
        (RSR_TRACE.replace("A -> B", "A -> A"), ["Paris"], 0.25),  # self-loop
        (RSR_TRACE.replace("A -> B", "A -> C"), ["Paris"], 0.25),  # unknown node
        (RSR_TRACE.replace("(News)", "(Web)"), ["Paris"], 0.25),  # unknown tool
        (RSR_TRACE.replace("<think>I need two facts.</think>", ""), ["Paris"], 0.75),  # format fails, DAG valid
        (RSR_TRACE.replace("<think>I need two facts.</think>", "").replace("A -> B", "A -> A"), ["Paris"], 0.0),
        ("<answer>Paris</answer>", ["Paris"], 0.0),  # no plan at all
        (RSR_TRACE.upper().replace("PARIS</ANSWER>", "Paris</ANSWER>"), ["Paris"], 1.0),  # case-insensitive tags
        (RSR_TRACE.replace("<answer>Paris", "<answer>x</result>Paris"), ["Paris"], 1.0),  # judged as "Paris"
        (RSR_TRACE.replace("<answer>Paris</answer>", "Paris"), ["Paris"], 0.75),  # no answer: text after </result>
        (RSR_TRACE.replace(RSR_PLAN, "节点：\nA：法国 首都（新闻）\nB：巴黎 人口 (学术)\nEdges：A → B"), ["Paris"], 1.0),
        (RSR_TRACE.replace("Edges:", "G: q (News)\nH: q (News)\nI: q (News)\nJ: q (News)\nK: q (News)\nEdges:"), ["Paris"], 1.0),
    ],
)
def test_reasoning_search_with_f1_stand_in(response, golds, expected):
    result = rewards.score("reasoning-search", response, golds)
    assert result.total == pytest.approx(expected)


def test_reasoning_search_components():
    result = rewards.score("reasoning-search", RSR_TRACE.replace("A -> B", "A -> B; B -> A"), ["Paris"])
    assert result.components["dag_valid"] is False and result.components["dag_violations"] == "cycle"
    assert result.components["judge"] is None and result.components["judge_source"] == "skipped"
    ok = rewards.score("reasoning-search", RSR_TRACE, ["Paris"])
    assert ok.components["judge_source"] == "f1_stand_in" and ok.components["prediction"] == "Paris"


@pytest.mark.parametrize("value, expected", [(0.4, 0.7), (1.7, 1.0), (-0.3, 0.5), (math.nan, 0.5), (1, 1.0)])
def test_reasoning_search_judge(value, expected):
    judge = Judge(value)
    result = rewards.score("reasoning-search", RSR_TRACE, ("Paris", "City of Light"), question="Capital of France?", judge=judge)
    assert result.total == pytest.approx(expected)
    assert judge.calls == [("Capital of France?", ["Paris", "City of Light"], "Paris")]


def test_reasoning_search_judge_skipped_on_invalid_dag():
    judge = Judge(1.0)
    assert total("reasoning-search", RSR_TRACE.replace("A -> B", "B -> B"), ["Paris"], question="q", judge=judge) == 0.25
    assert judge.calls == []


def test_reasoning_search_weights_and_question():
    assert total("reasoning-search", RSR_TRACE, ["Paris"], format_weight=0.1, dag_weight=0.2, judge_weight=0.7) == pytest.approx(1.0)
    assert total("reasoning-search", RSR_TRACE, ["London"], format_weight=0.1, dag_weight=0.2, judge_weight=0.7) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="question"):
        rewards.score("reasoning-search", RSR_TRACE, ["Paris"], judge=Judge(1.0))


def test_reasoning_search_tools_option_scores_a_users_source_as_a_valid_tool():
    users_plan = RSR_TRACE.replace("(News)", "(mydb)").replace("(General)", "(wiki)")
    assert users_plan != RSR_TRACE
    default = rewards.score("reasoning-search", users_plan, ["Paris"])
    assert default.total == pytest.approx(0.25) and "unknown_tool:mydb" in default.components["dag_violations"]
    told = rewards.score("reasoning-search", users_plan, ["Paris"], tools=("wiki", "mydb"))
    assert told.total == pytest.approx(1.0) and told.components["dag_valid"] is True
    assert total("reasoning-search", RSR_TRACE, ["Paris"], tools=("wiki", "mydb")) == pytest.approx(0.25), "News is not listed"


# ---------------------------------------------------------------------------------------------
# every preset on junk: a RewardResult with a finite total, never an exception


@pytest.mark.parametrize("preset", sorted(registry._PRESETS))
@pytest.mark.parametrize("response", ["", "<answer>", "</answer><answer>", "\\boxed{", "<search>Nodes:\nA: (x)</search>" * 3, "巴黎" * 50])
def test_presets_never_raise_on_junk(preset, response):
    result = rewards.score(preset, response, ["Paris"])
    assert isinstance(result, rewards.RewardResult) and math.isfinite(result.total)


# Each preset's documented range, on random mixes of every protocol's tags.
RANGES = {
    "search-r1": (0.0, 1.0),
    "search-r1-format": (0.1, 1.0),
    "r1-searcher": (-2.0, 1.0),
    "r1-searcher-stage1": (-1.0, 2.0),
    "r1-searcher-stage2": (-1.0, 1.0),
    "research": (0.0, 1.0),
    "r-search": (0.0, 2.4),
    "reasoning-search": (0.0, 1.0),
}
TOKENS = [
    "<think>", "</think>", "<search>", "</search>", "<information>", "</information>", "<answer>", "</answer>",
    "<result>", "</result>", "<observation>", "</observation>", "<original_evidence>", "</original_evidence>",
    "<|begin_of_query|>", "<|end_of_query|>", "<|begin_of_documents|>\n(1)", "<|end_of_documents|>\n\n",
    "\\boxed{", "}", "Paris", "yes", " ", "\n", "Nodes:\nA: q (News)\n", "Edges: A -> B", "巴黎", "Assistant",
]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=30).map("".join), st.booleans())
def test_presets_stay_in_range(response, eos):
    for preset, (low, high) in RANGES.items():
        value = rewards.score(preset, response, ["Paris"], question="q", ended_with_eos=eos, evidence_model=lambda q, e: e).total
        assert low - 1e-9 <= value <= high + 1e-9, (preset, response, value)
