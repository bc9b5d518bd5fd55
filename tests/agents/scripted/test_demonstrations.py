"""Scripted demonstrations: played through the environment, with a systematic mistake at a set rate."""
import pytest

from agents.scripted.demonstrations import DemonstrationAgent, make_demonstrations
from agents.scripted.agents import run_episode
from search_env import SearchQAEnv
from search_env.trajectory import AGENT


@pytest.fixture(scope="module")
def env():
    return SearchQAEnv(protocol="search-r1", world_seed=3, world_size=200)


@pytest.fixture(scope="module")
def chains(env):
    return [e for e in env.examples if e.metadata["type"] == "chain"]


@pytest.mark.parametrize("rate", [0.0, 0.05, 0.3, 1.0])
def test_second_hop_rate_is_honoured(env, chains, rate):
    demos = make_demonstrations(env, chains, 200, second_hop_rate=rate, seed=1)
    multi = [i for i, ex in enumerate(demos.trajectories) if demos.lookups[i] > 1]
    assert len(multi) > 50
    searched_twice = [i for i in multi if len(demos.trajectories[i].tool_calls) == 2]
    assert len(searched_twice) == round(rate * len(multi))
    assert demos.second_hop_share == pytest.approx(len(searched_twice) / len(multi))
    # 1-hop questions are always demonstrated correctly, with one search.
    for i, traj in enumerate(demos.trajectories):
        if demos.lookups[i] == 1:
            assert len(traj.tool_calls) == 1 and traj.reward == 1.0


def test_the_mistake_is_systematic(env, chains):
    """Every 2-hop demonstration that skips the second search answers with the bridge entity (the first
    lookup's answer), and every one that searches twice answers correctly."""
    demos = make_demonstrations(env, chains, 120, second_hop_rate=0.5, seed=2)
    by_id = {e.id: e for e in chains}
    seen = {True: 0, False: 0}
    for traj, n, full in zip(demos.trajectories, demos.lookups, demos.full):
        if n != 2:
            continue
        example = by_id[traj.example_id]
        bridge = example.decomposition[0].answer
        seen[full] += 1
        if full:
            assert traj.reward == 1.0 and traj.answer == example.golden_answers[0]
            assert bridge in traj.tool_calls[1].content  # the bridge was substituted into the second query
        else:
            assert len(traj.tool_calls) == 1 and traj.answer == bridge and traj.reward == 0.0
    assert seen[True] > 10 and seen[False] > 10


def test_demonstrations_are_the_environments_trajectories(env, chains):
    """The ids, producers and trained mask are what the environment records for the scripted chunks: the
    agent tokens are the encoded text, observations are the environment's and carry no training."""
    demos = make_demonstrations(env, chains, 20, second_hop_rate=1.0, seed=3)
    codec = env.codec
    for traj in demos.trajectories:
        agent = [i for i, p in enumerate(traj.producers) if p == AGENT]
        assert list(traj.trained) == list(traj.producers)  # search-r1 trains on every agent token
        assert set(range(traj.prompt_length)).isdisjoint(agent)
        agent_text = codec.decode([traj.token_ids[i] for i in agent])
        expected = "".join(f"<search> {c.content} </search>" for c in traj.tool_calls) + f"<answer> {traj.answer} </answer>"
        assert agent_text == expected
        # Played again with the same agent in a fresh environment, the episode is identical.
        fresh = SearchQAEnv(protocol="search-r1", dataset=env.examples, sources=env.sources, tokenizer=codec)
        again = run_episode(fresh, DemonstrationAgent(full=True), options={"example": next(e for e in chains if e.id == traj.example_id)})
        assert again.token_ids == traj.token_ids and again.producers == traj.producers and again.trained == traj.trained


def test_same_seed_same_demonstrations(env, chains):
    a = make_demonstrations(env, chains, 30, second_hop_rate=0.2, seed=5)
    b = make_demonstrations(env, chains, 30, second_hop_rate=0.2, seed=5)
    c = make_demonstrations(env, chains, 30, second_hop_rate=0.2, seed=6)
    assert [t.token_ids for t in a.trajectories] == [t.token_ids for t in b.trajectories]
    assert [t.token_ids for t in a.trajectories] != [t.token_ids for t in c.trajectories]


def test_bad_input(env, chains):
    with pytest.raises(ValueError, match="second_hop_rate"):
        make_demonstrations(env, chains, 5, second_hop_rate=1.5)
    with pytest.raises(ValueError, match="no examples"):
        make_demonstrations(env, [], 5, second_hop_rate=0.1)


def test_a_question_without_a_decomposition_searches_itself_then_answers(env):
    """Real datasets (HotpotQA, NQ) have no gold decomposition: the demonstration searches the question
    and answers with the first gold answer."""
    from dataclasses import replace

    plain = [replace(ex, decomposition=[]) for ex in env.examples[:6]]
    demos = make_demonstrations(env, plain, 6, second_hop_rate=0.0, seed=4)
    by_id = {e.id: e for e in plain}
    for traj, n in zip(demos.trajectories, demos.lookups):
        example = by_id[traj.example_id]
        assert n == 1 and [c.content.strip() for c in traj.tool_calls] == [example.question]
        assert traj.answer == example.golden_answers[0] and traj.reward == 1.0
    with pytest.raises(ValueError, match="no gold answer"):
        make_demonstrations(env, [replace(plain[0], golden_answers=[])], 1, second_hop_rate=0.0)


def test_only_demonstrations_whose_results_hold_the_gold_are_kept():
    """The answer-copying filter reads the search results only (the demonstration's own answer span always
    holds the gold) and matches whole normalised words ("Ann" is not in "anna")."""
    from agents.scripted.demonstrations import gold_in_results
    from search_env.data.example import QAExample
    from tests.conftest import CountingSource

    examples = [QAExample("a", "where was Anna born", ["ANNA"]), QAExample("b", "where was Bob born", ["Paris"]),
                QAExample("c", "where was Anna born", ["Ann"])]
    env = SearchQAEnv(protocol="search-r1", dataset=examples, sources=CountingSource("wiki"))
    demos = make_demonstrations(env, examples, 3, second_hop_rate=0.0, seed=1)
    assert all(t.reward == 1.0 for t in demos.trajectories)  # every demonstration answers with its gold
    kept = demos.kept(lambda t: gold_in_results(t, env.codec.decode))
    assert [t.example_id for t in kept.trajectories] == ["a"]
    assert kept.lookups == [1] and kept.full == [True]
    with pytest.raises(ValueError, match="none of the 3 demonstrations"):
        demos.kept(lambda t: False)
