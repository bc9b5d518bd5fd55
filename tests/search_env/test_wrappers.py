"""Observation wrappers change what an agent observes, never the episode: a scripted agent plays the same
episode through :class:`FixedWindowObservation` or :class:`FullContextObservation` as in the bare env."""
from __future__ import annotations

import pytest

from agents.scripted import OracleAgent, RetrieveThenAnswerAgent, run_episode
from search_env import FixedWindowObservation, FullContextObservation, SearchQAEnv


def record(trajectory):
    return trajectory.token_ids, trajectory.answer, trajectory.reward, [call.content for call in trajectory.tool_calls]


@pytest.mark.parametrize("protocol", ["search-r1", "reasoning-search"])
@pytest.mark.parametrize("agent", [RetrieveThenAnswerAgent, OracleAgent])
def test_a_scripted_episode_is_the_same_wrapped_or_not(protocol, agent):
    env = SearchQAEnv(protocol, world_size=40)
    wrapped = [FixedWindowObservation(SearchQAEnv(protocol, world_size=40), window=16),
               FullContextObservation(SearchQAEnv(protocol, world_size=40))]
    for index in range(4):
        bare = record(run_episode(env, agent(), options={"index": index}))
        assert bare[1] not in (None, "unknown")  # the agent read the results it was given
        for other in wrapped:
            assert record(run_episode(other, agent(), options={"index": index})) == bare, type(other).__name__
