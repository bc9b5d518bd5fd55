"""How the environment scores episodes: scheduled rewards follow the trainer's step, and an NL-DAG plan
is held to one contract (the tools the prompt offers, the env runs and the reward accepts agree)."""
from __future__ import annotations

import pytest

import rewards
from rewards.schedule import ComponentMix, Preset, StagedReward
from search_env import BatchSearchQAEnv
from search_env.data.example import QAExample
from search_env.env import SearchQAEnv
from tests.conftest import CountingSource

EXAMPLES = [QAExample("q1", "Who founded Zarbo", ["Bob Smith"])]

# R1-Searcher: one well-formed retrieval, then the answer. Worked by hand from PROTOCOLS.md:
# stage 1 = +1 (the answer covers the gold) + 0.5 (query/document markers balanced, one query)
#         + 0.5 (no <think> in the response, one </think>, one <answer>, one </answer>) = 2.0;
# stage 2 = F1 1.0, no format penalty = 1.0.
R1_CHUNKS = [" I search.<|begin_of_query|> zarbo founder <|end_of_query|>", "It is him.</think><answer> Bob Smith </answer>"]
STAGE_TOTALS = {0: 2.0, 1: 1.0}
STAGE_NAMES = {0: "r1-searcher-stage1", 1: "r1-searcher-stage2"}


def r1_episode(env: SearchQAEnv) -> tuple[float, dict]:
    env.reset(seed=0)
    env.step(env.codec.encode(R1_CHUNKS[0]))
    _, reward, terminated, _, info = env.step(env.codec.encode(R1_CHUNKS[1]))
    assert terminated
    return reward, info["reward_components"]


def test_a_staged_reward_switches_stage_at_the_step_set_in_a_single_and_a_batch_env(split_tag_tokenizer):
    staged = StagedReward([(0, "r1-searcher-stage1"), (2000, "r1-searcher-stage2")])
    kwargs = dict(protocol="r1-searcher", dataset=EXAMPLES, sources=CountingSource(), tokenizer=split_tag_tokenizer, reward=staged)
    single = SearchQAEnv(**kwargs)
    batch = BatchSearchQAEnv(2, **kwargs)
    codec = single.codec
    assert single.reward_step == 0
    for step, stage in [(0, 0), (1999, 0), (2000, 1), (5000, 1), (3, 0)]:
        single.set_reward_step(step)
        batch.set_reward_step(step)
        reward, components = r1_episode(single)
        assert reward == STAGE_TOTALS[stage], f"step {step}"
        assert (components["stage"], components["stage_reward"]) == (stage, STAGE_NAMES[stage])
        batch.reset(seed=0)
        batch.step([codec.encode(R1_CHUNKS[0])] * 2)
        _, totals, terminated, _, infos = batch.step([codec.encode(R1_CHUNKS[1])] * 2)
        assert terminated.all() and totals.tolist() == [STAGE_TOTALS[stage]] * 2
        assert [info["reward_components"]["stage"] for info in infos] == [stage, stage]


def test_a_preset_name_scores_as_before_and_other_step_rewards_are_accepted(split_tag_tokenizer):
    kwargs = dict(protocol="r1-searcher", dataset=EXAMPLES, sources=CountingSource(), tokenizer=split_tag_tokenizer)
    plain = SearchQAEnv(reward="r1-searcher-stage2", **kwargs)
    plain.set_reward_step(10_000)
    assert r1_episode(plain) == (1.0, rewards.score("r1-searcher-stage2", plain.trajectory.response_text, ["Bob Smith"]).components)
    bound = SearchQAEnv(reward=Preset("r1-searcher-stage1", answer_term=False), **kwargs)
    assert r1_episode(bound)[0] == 1.0, "stage 1 without its answer term: 0.5 + 0.5"
    mixed = SearchQAEnv(reward=ComponentMix("r1-searcher-stage2", {"f1": 0.5}), **kwargs)
    assert r1_episode(mixed)[0] == 0.5
    with pytest.raises(ValueError):
        plain.set_reward_step(-1)
    with pytest.raises(ValueError):
        plain.set_reward_step(True)
    with pytest.raises(TypeError, match="preset name or a rewards.schedule.StepReward"):
        SearchQAEnv(reward=lambda response, golds: 1.0, **kwargs)
    with pytest.raises(rewards.UnknownNameError, match="unknown reward preset"):
        SearchQAEnv(reward="no-such-preset", **kwargs)


# ---------------------------------------------------------------------------------------------------
# NL-DAG: one plan contract

def dag_trace(plan: str) -> str:
    return f"<think> two facts </think><search>\n{plan}\n</search>"


def test_a_plan_over_a_users_own_source_runs_and_scores_as_a_valid_plan(split_tag_tokenizer):
    sources = {"wiki": CountingSource("wiki"), "mydb": CountingSource("mydb")}
    env = SearchQAEnv("reasoning-search", dataset=EXAMPLES, sources=sources, tokenizer=split_tag_tokenizer)
    env.reset(seed=0)
    env.step(env.codec.encode(dag_trace("Nodes:\nA: zarbo founder (mydb)\nB: {A} birthplace (wiki)\nEdges:\nA -> B")))
    assert sources["mydb"].calls == [["zarbo founder"]] and sources["wiki"].calls
    _, reward, terminated, _, info = env.step(env.codec.encode("<answer> Bob Smith </answer>"))
    assert terminated and info["reward_components"]["dag_valid"] is True and reward == 1.0
    reference = rewards.score("reasoning-search", env.trajectory.response_text, ["Bob Smith"])
    assert reference.total == 0.25 and "unknown_tool:mydb" in reference.components["dag_violations"], "the reference list alone would not"


def test_the_prompt_offers_the_tools_the_env_serves(split_tag_tokenizer):
    sources = {"wiki": CountingSource("wiki"), "mydb": CountingSource("mydb")}
    env = SearchQAEnv("reasoning-search", dataset=EXAMPLES, sources=sources, tokenizer=split_tag_tokenizer)
    prompt = env.render_prompt("Who?")
    assert "Tool is General (web search) or mydb. Then" in prompt, "General reaches wiki by the default alias; News and Academy are not served"
    assert "(news articles)" not in prompt and "{tools}" not in prompt
    example = prompt.split("Example plan:")[1]
    assert "(News)" not in example and example.count("(mydb)") == 2 and example.count("(General)") == 1
    alone = SearchQAEnv("reasoning-search", dataset=EXAMPLES, sources={"mydb": CountingSource("mydb")},
                        tokenizer=split_tag_tokenizer).render_prompt("Who?")
    assert "Tool is mydb. Then" in alone and alone.split("Example plan:")[1].count("(mydb)") == 3


def test_the_default_world_keeps_the_reference_prompt_and_scores_reference_plans_as_the_reference(split_tag_tokenizer):
    env = SearchQAEnv("reasoning-search", tokenizer=split_tag_tokenizer, world_size=20)
    assert "Tool is General (web search), News (news articles) or Academy (papers; use English keywords). Then" in env.render_prompt("Who?")
    assert ("Example plan:\nNodes:\nA: US tariffs 2024 (News)\nB: Tariffs impact on 401k & CPI (General)\n"
            "C: new US tariff list commodities 2024 (News)\nEdges:") in env.render_prompt("Who?")
    assert {"general", "news", "academy", "wiki", "papers", "all"} <= set(env.reward_options["tools"])
    env.reset(seed=0)
    gold = env.example.golden_answers[0]
    env.step(env.codec.encode(dag_trace("Nodes:\nA: founder (News)\nB: {A} city (Academy)\nEdges:\nA -> B")))
    _, reward, *_ = env.step(env.codec.encode(f"<answer> {gold} </answer>"))
    assert reward == rewards.score("reasoning-search", env.trajectory.response_text, [gold]).total == 1.0


def test_a_user_set_tools_option_and_a_reward_without_one_are_left_alone(split_tag_tokenizer):
    sources = {"wiki": CountingSource("wiki")}
    strict = SearchQAEnv("reasoning-search", dataset=EXAMPLES, sources=sources, tokenizer=split_tag_tokenizer,
                         reward_options={"tools": ["general", "news", "academy"]})
    strict.reset(seed=0)
    strict.step(strict.codec.encode(dag_trace("Nodes:\nA: zarbo founder (wiki)")))
    _, reward, *_ = strict.step(strict.codec.encode("<answer> Bob Smith </answer>"))
    assert reward == 0.25, "(wiki) ran, but the user asked for the reference's tool list"
    dag_r1 = SearchQAEnv("reasoning-search", dataset=EXAMPLES, sources=sources, tokenizer=split_tag_tokenizer, reward="search-r1")
    assert "tools" not in dag_r1.reward_options
    dag_r1.reset(seed=0)
    dag_r1.step(dag_r1.codec.encode(dag_trace("Nodes:\nA: zarbo founder (wiki)")))
    assert dag_r1.step(dag_r1.codec.encode("<answer> Bob Smith </answer>"))[1] == 1.0
