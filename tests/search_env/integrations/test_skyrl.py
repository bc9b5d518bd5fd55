"""The SkyRL-gym adapter: an episode played through it has the tokens and the reward it has through
``gym.make("SearchQA-v0")``, for every protocol; SkyRL's registry builds it from a data row."""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("skyrl", "skyrl_gym")

from search_env.integrations._text import TextEpisode, episode_env, shared_env  # noqa: E402
from search_env.integrations.skyrl import SearchQASkyRLEnv, register  # noqa: E402
from tests.search_env.integrations.scripted import PROTOCOLS, base_env, plan_tool, reference, script, shared_settings  # noqa: E402


@pytest.fixture(scope="module")
def base():
    return base_env()


def row(example):
    return {"reward_spec": {"method": "rule", "ground_truth": {"target": list(example.golden_answers)}},
            "extra_info": {"question": example.question, "id": example.id}}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_episode_through_skyrl_matches_gym_make(base, protocol):
    example = base.examples[3]
    settings = shared_settings(base, protocol)
    turns = script(protocol, example, plan_tool(base, protocol))
    ref = reference(settings, example, turns)
    assert ref.reward > 0, "the script answers correctly: a reward of 0 would make the comparison weak"
    assert any(ref.env_ids), "the script searches: the environment must have appended results"

    env = SearchQASkyRLEnv(settings, row(example))
    prompt, meta = env.init([])
    assert meta["prompt_ids"] == ref.prompt_ids
    assert prompt == env.episode.env.protocol.messages(example.question)
    env_ids, rewards, texts = [], [], []
    for turn in turns:
        out = env.step(turn.text(protocol))
        env_ids.append(out["metadata"]["observation_ids"])
        rewards.append(out["reward"])
        texts.append([m["content"] for m in out["observations"]])
        if out["done"]:
            break
    assert env_ids == ref.env_ids
    assert rewards[-1] == ref.reward and sum(rewards[:-1]) == 0
    assert env.episode.trajectory.token_ids == ref.token_ids and list(env.episode.trajectory.trained) == ref.trained
    codec = env.episode.codec
    assert texts[:-1] == [[codec.decode(ids)] for ids in ref.env_ids[:-1]] and texts[-1] == []  # done: no observation
    assert out["metadata"]["end_reason"] == ref.end_reason


def test_a_turn_with_no_stop_string_ends_the_episode_as_an_eos_would(base):
    """The model stopped on no stop string: it ended its generation, so the episode ends on EOS."""
    settings = shared_settings(base, "search-r1")
    episode = TextEpisode(episode_env(shared_env(settings), settings))
    episode.reset(base.examples[0])
    step = episode.step("I do not know")
    assert step.done and not step.truncated and step.info["end_reason"] == "eos" and step.observation_ids == []
    assert episode.trajectory.token_ids[-1] in episode.codec.eos_ids
    with pytest.raises(RuntimeError, match="has ended"):
        episode.step("more")


def test_skyrl_builds_the_registered_environment_from_a_row(base):
    import skyrl_gym

    register()
    register()  # a second registration is a no-op
    example = base.examples[5]
    env = skyrl_gym.make("searchqa", env_config=shared_settings(base, "search-r1"), extras=row(example))
    env.init([])
    out = env.step(f"<answer> {example.golden_answers[0]} </answer>")
    assert out["done"] and out["reward"] == 1.0 and out["postprocessed_action"].endswith("</answer>")


def test_a_row_without_its_answers_or_question_is_refused(base):
    settings = shared_settings(base, "search-r1")
    with pytest.raises(ValueError, match="reward_spec.ground_truth"):
        SearchQASkyRLEnv(settings, {"extra_info": {"question": "q"}})
    with pytest.raises(ValueError, match="extra_info.question"):
        SearchQASkyRLEnv(settings, {"reward_spec": {"ground_truth": ["a"]}})
