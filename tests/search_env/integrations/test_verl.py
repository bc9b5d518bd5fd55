"""verl's side without verl: ``compute_score`` gives the environment's reward on the same response for
every protocol, the tool's episode answers each call with the environment's own observation, and the
data command writes the rows verl's multi-turn recipes (and SkyRL) read."""
from __future__ import annotations

import json

import pytest

from search_env import SearchQAEnv
from search_env.integrations import verl
from search_env.integrations.verl import ToolEpisode, compute_score, data_source
from search_env.integrations.verl_data import main as data_main, rows
from tests.conftest import skip_without
from tests.search_env.integrations.scripted import PROTOCOLS, base_env, plan_tool, reference, script, shared_settings


@pytest.fixture(scope="module")
def base():
    return base_env()


def scripted(base, protocol, index=3):
    example = base.examples[index]
    settings = shared_settings(base, protocol)
    turns = script(protocol, example, plan_tool(base, protocol))
    return example, settings, turns, reference(settings, example, turns)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_compute_score_gives_the_environments_reward(base, protocol):
    example, settings, _, ref = scripted(base, protocol)
    env = SearchQAEnv(**settings)
    row = rows(env, [example], "train")[0]
    truth, info = row["reward_model"]["ground_truth"], row["extra_info"]
    assert ref.reward > 0
    assert compute_score(row["data_source"], ref.response_text, truth, info) == ref.reward
    preset = getattr(verl, f"compute_score_{env.reward.replace('-', '_')}")
    assert preset("anything", ref.response_text, truth, info) == ref.reward
    wrong = {"target": ["certainly not the answer"]}
    assert compute_score(row["data_source"], ref.response_text, wrong, info) < ref.reward


def test_the_protocol_in_data_source_picks_the_preset_when_the_row_names_none(base):
    _, _, _, ref = scripted(base, "search-r1")
    answers = base.examples[3].golden_answers
    assert compute_score(data_source("search-r1"), ref.response_text, {"target": answers}) == ref.reward == 1.0
    assert compute_score(data_source("search-r1"), ref.response_text, answers) == 1.0  # a plain list of answers
    with pytest.raises(ValueError, match="searchqa/<protocol>"):
        compute_score("nq", ref.response_text, answers)


def test_research_is_scored_zero_when_the_response_did_not_end_on_eos(base):
    example, settings, _, ref = scripted(base, "research")
    row = rows(SearchQAEnv(**settings), [example], "train")[0]
    info = row["extra_info"]
    assert compute_score(row["data_source"], ref.response_text, row["reward_model"]["ground_truth"], info) == ref.reward > 0
    cut = dict(info, ended_with_eos=False)
    assert compute_score(row["data_source"], ref.response_text, row["reward_model"]["ground_truth"], cut) == 0.0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_tool_answers_each_call_with_the_environments_observation(base, protocol):
    example, settings, turns, ref = scripted(base, protocol)
    tool = ToolEpisode(example.question, {"target": list(example.golden_answers)}, settings)
    codec = base.codec
    calls = [(turn.argument, env_ids) for turn, env_ids in zip(turns, ref.env_ids) if turn.argument is not None]
    assert calls and all(env_ids for _, env_ids in calls)
    for argument, env_ids in calls:
        assert tool.call(argument) == codec.decode(env_ids)


def test_the_tool_keeps_the_protocols_search_budget_across_a_trajectorys_calls(base):
    settings = shared_settings(base, "reasoning-search")  # one search per episode
    tool = ToolEpisode(base.examples[0].question, ["yes"], settings)
    plan = f"\nNodes:\nA: {base.examples[0].question} ({plan_tool(base, 'reasoning-search')})\nEdges:\n"
    first, second = tool.call(plan), tool.call(plan)
    assert "Doc 1" in first and "Doc 1" not in second and second.startswith("\n<result>\n")


def test_the_data_command_writes_the_rows_verl_and_skyrl_read(tmp_path, base, capsys):
    skip_without("data", "pyarrow")
    import pyarrow.parquet as pq

    assert data_main(["--protocol", "reasoning-search", "--test-size", "2", "--train-size", "3", "--output-dir", str(tmp_path)]) == 0
    assert "train.parquet" in capsys.readouterr().out
    train, test = (pq.read_table(tmp_path / f"{split}.parquet").to_pylist() for split in ("train", "test"))
    assert [r["extra_info"]["id"] for r in test] == [ex.id for ex in base.examples[:2]]
    assert [r["extra_info"]["id"] for r in train] == [ex.id for ex in base.examples[2:5]]
    example, settings, _, ref = scripted(base, "reasoning-search", index=3)
    row = train[1]
    env = SearchQAEnv(**settings)
    assert row["data_source"] == "searchqa/reasoning-search" and row["agent_name"] == "tool_agent"
    assert row["prompt"] == env.protocol.messages(example.question)  # the tools the sources offer, named
    assert row["reward_model"]["ground_truth"] == {"target": list(example.golden_answers)} == row["reward_spec"]["ground_truth"]
    assert row["env_class"] == "searchqa" and row["extra_info"]["question"] == example.question
    assert json.loads(row["extra_info"]["reward_options"])["tools"] == list(env.reward_options["tools"])
    create = row["extra_info"]["tools_kwargs"]["search"]["create_kwargs"]
    assert create == {"question": example.question, "ground_truth": {"target": list(example.golden_answers)}}
    # Read back from the file, the row scores the scripted response as the environment did.
    assert compute_score(row["data_source"], ref.response_text, row["reward_model"]["ground_truth"], row["extra_info"]) == ref.reward
