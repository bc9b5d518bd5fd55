"""Macro actions: each action writes its call into the token-level environment, the observation is
enough to play 1- and 2-hop chain questions perfectly, and a random choice mostly fails."""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from search_env import FixedWindowObservation, SearchQAEnv
from search_env.resolve import resolve_sources
from search_env.synthetic import SyntheticWorld, generate_world
from search_env.wrappers import MacroActions
from search_env.wrappers.macro_actions import SLOT_FEATURES
from tests.conftest import skip_without

SLOTS, MAX_STEPS = 3, 4
QUESTIONS_PER_HOPS = 30


@pytest.fixture(scope="module")
def world() -> SyntheticWorld:
    return generate_world(seed=0, n_questions=200)


def chain_env(world: SyntheticWorld, protocol: str = "search-r1", **options: int) -> MacroActions:
    """Macro actions over the chain questions of ``world``."""
    chain = [q for q in world.questions if q.metadata["type"] == "chain"]
    return MacroActions(SearchQAEnv(protocol, dataset=chain, sources=resolve_sources(None, world)), **options)


@pytest.fixture(scope="module")
def env(world: SyntheticWorld) -> MacroActions:
    return chain_env(world, slots=SLOTS, max_steps=MAX_STEPS)


def first_index(env: MacroActions, hops: int) -> int:
    return next(i for i, q in enumerate(env.unwrapped.examples) if q.metadata["hops"] == hops)


def subject_of(world: SyntheticWorld, example) -> str:
    """The entity a chain question starts from: the title of its first gold passage."""
    return world.passage(example.gold_passage_ids[0])["title"]


def written(env: MacroActions, action: int) -> tuple[str, float, bool, bool, dict]:
    """Step ``action``; the text the inner environment received and appended, and the step's result."""
    before = len(env.unwrapped.response_text)
    _, reward, terminated, truncated, info = env.step(action)
    return env.unwrapped.response_text[before:], reward, terminated, truncated, info


# --- checkers ---------------------------------------------------------------------------------------


def test_gymnasium_env_checker_passes() -> None:
    from gymnasium.utils.env_checker import check_env

    env = MacroActions(gym.make("SearchQA-v0", world_size=50))
    with pytest.warns(UserWarning, match="different from the unwrapped"):  # its only remark: it is a wrapper
        check_env(env, skip_render_check=False)


def test_stable_baselines3_env_checker_passes() -> None:
    skip_without("sb3", "stable_baselines3")
    from stable_baselines3.common.env_checker import check_env

    check_env(MacroActions(gym.make("SearchQA-v0", world_size=50)), warn=True)


def test_spaces_follow_slots_and_max_steps(world: SyntheticWorld) -> None:
    env = chain_env(world, slots=2, max_steps=5)
    assert env.action_space == gym.spaces.Discrete(2 + 2 * 2)
    assert env.observation_space.shape == (5 + SLOT_FEATURES * 2,) and env.observation_space.dtype == np.float32


# --- what each action writes ------------------------------------------------------------------------


def test_each_action_writes_its_call_into_the_token_level_environment(env: MacroActions, world: SyntheticWorld) -> None:
    index = first_index(env, hops=2)
    example = env.unwrapped.examples[index]
    subject, bridge = subject_of(world, example), example.decomposition[0].answer
    env.reset(options={"index": index})
    text, *_ = written(env, 0)
    assert text.startswith(f"<search> {subject} </search>") and f"(Title: {subject})" in text
    assert env.unwrapped.trajectory.tool_calls[-1].content == subject
    offered = env.candidates
    # the bridge is offered to search and to answer, in the same slot
    slot = offered.index(f"<search> {bridge} </search>") - 2
    assert 0 <= slot < SLOTS and offered[2 + SLOTS + slot] == f"<answer> {bridge} </answer>"
    for action in range(env.action_space.n):  # every action from the same state writes what it offered
        env.reset(options={"index": index})
        env.step(0)
        assert env.candidates == offered
        text, reward, terminated, _, info = written(env, action)
        assert text.startswith(offered[action])
        if action == 1:
            assert env.unwrapped.trajectory.tool_calls[-1].content == example.question
        if action >= 2 + SLOTS:  # an answer ends the episode with that answer
            assert terminated and info["answer"] == offered[action][len("<answer> "):-len(" </answer>")]
        else:
            assert not terminated and len(env.unwrapped.trajectory.tool_calls) == 2


def test_an_empty_candidate_writes_an_empty_call(env: MacroActions) -> None:
    env.reset(options={"index": 0})
    assert env.candidates[2:] == ("<search>  </search>",) * SLOTS + ("<answer>  </answer>",) * SLOTS
    observation, _, _, _, info = env.step(2)
    assert "empty_query" in {event["event"] for event in info["events"]} and not env.unwrapped.trajectory.tool_calls
    assert not observation[MAX_STEPS:].any()  # an error gives no values
    text, reward, terminated, _, info = written(env, 2 + SLOTS)
    assert text.startswith("<answer>  </answer>") and terminated and reward == 0.0 and info["answer"] == ""


def test_calls_are_written_in_the_protocols_own_tags(world: SyntheticWorld) -> None:
    env = chain_env(world, protocol="r1-searcher")
    example = env.unwrapped.examples[0]
    env.reset(options={"index": 0})
    text, *_ = written(env, 0)
    assert text.startswith(f"<|begin_of_query|> {subject_of(world, example)} <|end_of_query|>")
    assert env.candidates[2 + env.slots].startswith("</think><answer> ")  # R1-Searcher closes its thought first


def test_an_observation_wrapper_inside_changes_nothing(env: MacroActions, world: SyntheticWorld) -> None:
    inner = FixedWindowObservation(SearchQAEnv(dataset=list(env.unwrapped.examples), sources=resolve_sources(None, world)), window=8)
    wrapped = MacroActions(inner, slots=SLOTS, max_steps=MAX_STEPS)
    index = first_index(env, hops=2)
    for macro in (env, wrapped):
        macro.reset(options={"index": index})
    for action in (0, 2):
        assert np.array_equal(env.step(action)[0], wrapped.step(action)[0]) and env.candidates == wrapped.candidates


# --- what the observation says ----------------------------------------------------------------------


def slot_flags(env: MacroActions, observation: np.ndarray, value: str) -> list[int]:
    """The features of the slot that offers ``value`` (present, bridge, answer, asked relation,
    searched before, named by the question)."""
    slot = env.candidates.index(f"<search> {value} </search>") - 2
    start = env.max_steps + SLOT_FEATURES * slot
    return observation[start:start + SLOT_FEATURES].astype(int).tolist()


def test_the_slot_features_follow_the_hops(env: MacroActions) -> None:
    index = first_index(env, hops=2)
    example = env.unwrapped.examples[index]
    bridge, answer = example.decomposition[0].answer, example.golden_answers[0]
    observation, _ = env.reset(options={"index": index})
    assert observation[:MAX_STEPS].tolist() == [1, 0, 0, 0] and not observation[MAX_STEPS:].any()
    observation, *_ = env.step(0)
    assert observation[:MAX_STEPS].tolist() == [0, 1, 0, 0]
    assert slot_flags(env, observation, bridge) == [1, 1, 0, 1, 0, 0]
    observation, *_ = env.step(env.candidates.index(f"<search> {bridge} </search>"))
    assert slot_flags(env, observation, answer) == [1, 0, 1, 1, 0, 0]
    observation, *_ = env.step(0)  # the subject's results again: the bridge now searched before
    assert slot_flags(env, observation, bridge) == [1, 1, 0, 1, 1, 0]


def test_a_value_the_question_names_is_flagged(world: SyntheticWorld) -> None:
    # a yes/no question naming the right value: searching the question finds the passage that states it
    question = next(q for q in world.questions if q.metadata["type"] == "yes_no" and q.metadata["hops"] == 1
                    and q.golden_answers == ["yes"])
    env = MacroActions(SearchQAEnv(dataset=[question], sources=resolve_sources(None, world)))
    env.reset()
    observation, *_ = env.step(1)
    named = question.decomposition[0].answer
    assert named in question.question and slot_flags(env, observation, named)[0::5] == [1, 1]


# --- episodes ---------------------------------------------------------------------------------------


def gold_action(env: MacroActions, example, turn: int) -> int:
    """The action of the gold plan at ``turn``: search the subject, then each bridge, then answer."""
    calls = ([f"<search> {n.answer} </search>" for n in example.decomposition[:-1]]
             + [f"<answer> {example.golden_answers[0]} </answer>"])
    return 0 if turn == 0 else env.candidates.index(calls[turn - 1])


def mean_rewards(env: MacroActions, choose) -> dict[int, float]:
    """Mean reward by hop count over the first questions of each hop count; ``choose(observation,
    example, turn)`` picks the action."""
    rewards: dict[int, list[float]] = {1: [], 2: []}
    for index, example in enumerate(env.unwrapped.examples):
        hops = example.metadata["hops"]
        if len(rewards[hops]) == QUESTIONS_PER_HOPS:
            continue
        observation, _ = env.reset(options={"index": index})
        done, turn = False, 0
        while not done:
            observation, reward, terminated, truncated, _ = env.step(choose(observation, example, turn))
            done, turn = terminated or truncated, turn + 1
        rewards[hops].append(reward)
    assert all(len(r) == QUESTIONS_PER_HOPS for r in rewards.values())
    return {hops: float(np.mean(r)) for hops, r in rewards.items()}


def test_the_gold_plan_and_the_scripted_policy_score_about_1_and_random_play_far_less(env: MacroActions) -> None:
    gold = mean_rewards(env, lambda observation, example, turn: gold_action(env, example, turn))
    from_observation = mean_rewards(env, lambda observation, example, turn: env.scripted_action(observation))
    rng = np.random.default_rng(0)
    random = mean_rewards(env, lambda observation, example, turn: int(rng.integers(env.action_space.n)))
    for hops in (1, 2):
        assert gold[hops] >= 0.95 and from_observation[hops] >= 0.95, (hops, gold, from_observation)
        assert random[hops] <= gold[hops] - 0.6, (hops, random, gold)


def test_an_episode_without_an_answer_is_truncated_after_max_steps(world: SyntheticWorld) -> None:
    env = chain_env(world, max_steps=2)
    observation, _ = env.reset(options={"index": 0})
    assert observation[0] == 1.0
    observation, reward, terminated, truncated, _ = env.step(0)
    assert observation[1] == 1.0 and not (terminated or truncated)
    observation, reward, terminated, truncated, _ = env.step(1)
    assert truncated and not terminated and reward == 0.0
    with pytest.raises(gym.error.ResetNeeded):
        env.step(0)


def test_a_question_it_cannot_read_leaves_the_subject_empty(world: SyntheticWorld) -> None:
    yes_no = next(q for q in world.questions if q.metadata["type"] == "yes_no")
    env = MacroActions(SearchQAEnv(dataset=[yes_no], sources=resolve_sources(None, world)))
    env.reset()
    assert env.candidates[0] == "<search>  </search>" and env.candidates[1] == f"<search> {yes_no.question} </search>"
    observation, *_ = env.step(1)
    slots = observation[env.max_steps:].reshape(env.slots, SLOT_FEATURES)
    assert slots[:, 0].any() and not slots[:, 1:4].any()  # values read, none a bridge, answer or asked relation


# --- errors -----------------------------------------------------------------------------------------


def test_bad_settings_and_actions_are_one_line_errors(env: MacroActions) -> None:
    with pytest.raises(ValueError, match="takes NL-DAG plans"):
        MacroActions(SearchQAEnv("reasoning-search", world_size=20))
    with pytest.raises(TypeError, match="wraps a SearchQA environment, not CartPoleEnv"):
        MacroActions(gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="slots and max_steps must be >= 1"):
        MacroActions(SearchQAEnv(world_size=20), slots=0)
    env.reset(options={"index": 0})
    with pytest.raises(ValueError, match=r"outside the action space Discrete\(8\)"):
        env.step(8)
