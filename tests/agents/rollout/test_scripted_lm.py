"""The scripted model (``scripted_lm.py``) that the vLLM engine's multi-turn test runs: with the HF
sampler it writes its search call, gets results and answers, under every protocol."""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
import torch  # noqa: E402

from agents.policies.policy import HFPolicy  # noqa: E402
from agents.rollout.collect import collect_rollouts  # noqa: E402
from agents.rollout.hf_sampler import HFSampler  # noqa: E402
from search_env import SEED_PROTOCOLS, BatchSearchQAEnv  # noqa: E402
from search_env.protocols import SEARCH_R1_COMPACT  # noqa: E402
from search_env.tokenization import as_codec  # noqa: E402
from search_env.trajectory import AGENT  # noqa: E402
from tests.agents.rollout.scripted_lm import script_episode, scripted_lm  # noqa: E402
from tests.agents.rollout.test_collect import check_token_in_token_out, multi_turn  # noqa: E402

QUESTIONS = [0, 1, 2]


@pytest.fixture(scope="module")
def codec():
    return as_codec(None)


def prompts(env, questions):
    return [env.envs[0].first_observation(env.examples[q])[0]["token_ids"] for q in questions]


@pytest.mark.parametrize("protocol", [*SEED_PROTOCOLS, SEARCH_R1_COMPACT.name])
@pytest.mark.parametrize("greedy", [True, False])
def test_the_scripted_model_searches_then_answers(codec, protocol, greedy):
    env = BatchSearchQAEnv(2 * len(QUESTIONS), protocol=protocol, tokenizer=codec, max_new_tokens=64)
    episode = script_episode(env.protocol, codec, prompts(env, QUESTIONS))
    policy = HFPolicy(scripted_lm(episode, codec), codec)
    sampler = HFSampler(policy, greedy=greedy, seed=3)
    rollout = collect_rollouts(sampler, env, QUESTIONS, group_size=2)
    check_token_in_token_out(policy, sampler, rollout)
    for traj in rollout.trajectories:
        assert [i for i, p in zip(traj.token_ids, traj.producers) if p == AGENT] == episode.agent_ids
        assert multi_turn(traj)
        assert len(traj.tool_calls) == 1 and traj.tool_calls[0].error is None
        assert traj.end_reason == ("answer" if env.protocol.answer_ends_episode else "eos")
    env.close()


def test_the_marker_anywhere_in_the_context_turns_the_call_into_the_answer(codec):
    """What follows a prompt's last id depends on whether the marker occurred, however far back: the
    prompt alone is followed by the call, the prompt with the marker after its first id by the answer
    (Search-R1's prompt and results both end with a newline)."""
    env = BatchSearchQAEnv(1, protocol="search-r1", tokenizer=codec)
    prompt = list(prompts(env, [0])[0])
    episode = script_episode(env.protocol, codec, [prompt])
    assert episode.starts & episode.resumes  # the same id, followed by the call or by the answer
    model = scripted_lm(episode, codec)
    with torch.no_grad():
        plain = model(torch.tensor([prompt])).logits[0, -1].argmax()
        marked = model(torch.tensor([prompt[:1] + [episode.marker] + prompt[1:]])).logits[0, -1].argmax()
    assert int(plain) == episode.search_ids[0] and int(marked) == episode.answer_ids[0]
    env.close()
