"""The environment stepped in a worker process (:class:`search_env.worker.EnvWorker`): rollouts with it equal
in-process rollouts episode for episode over every protocol, the sampler hands each row's chunk over as the
row stops, and the worker's errors, reward step and lifecycle behave as the in-process environment's."""
from __future__ import annotations

import os

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
import torch  # noqa: E402

from search_env.protocols import SEARCH_R1_COMPACT  # noqa: E402
from agents.rollout.agent import StreamingRolloutAgent  # noqa: E402
from agents.scripted.rollout_agent import ScriptedRolloutAgent  # noqa: E402
from agents.rollout.collect import collect_rollouts  # noqa: E402
from agents.rollout.hf_sampler import HFSampler  # noqa: E402
from agents.scripted.agents import OracleAgent  # noqa: E402
from search_env import SEED_PROTOCOLS, BatchSearchQAEnv  # noqa: E402
from search_env.sources.base import Source  # noqa: E402
from search_env.sources.dense import DenseSource  # noqa: E402
from search_env.sources.hybrid import HybridSource  # noqa: E402
from search_env.tokenization import as_codec  # noqa: E402
from search_env.worker import EnvWorker  # noqa: E402
from tests.agents.rollout.test_collect import biased_policy, check_token_in_token_out, multi_turn  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def codec():
    return as_codec(None)


def episodes(rollout):
    return [(t.token_ids, bytes(t.trained), t.reward, t.answer, t.end_reason, [c.content for c in t.tool_calls])
            for t in rollout.trajectories]


@pytest.mark.parametrize("protocol", [*SEED_PROTOCOLS, SEARCH_R1_COMPACT.name])
def test_a_rollout_with_the_env_in_a_worker_equals_the_in_process_one(codec, protocol):
    policy = biased_policy(codec, protocol)
    env = BatchSearchQAEnv(8, protocol=protocol, tokenizer=codec, max_new_tokens=96)
    in_process = collect_rollouts(HFSampler(policy, temperature=0.9, seed=1), env, [0, 1, 2, 3], group_size=2)
    with EnvWorker(env) as worker:
        sampler = HFSampler(policy, temperature=0.9, seed=1)
        streamed = collect_rollouts(sampler, worker, [0, 1, 2, 3], group_size=2)
    assert episodes(streamed) == episodes(in_process)
    assert streamed.sampled_logprobs == in_process.sampled_logprobs
    check_token_in_token_out(policy, sampler, streamed)
    assert any(multi_turn(t) for t in streamed.trajectories)
    # The worker's time is reported apart: what the rollout waited for is env_s, and search is inside the worker.
    assert streamed.timings.worker_s > 0 and streamed.timings.search_s == 0 and streamed.timings.env_s > 0
    assert in_process.timings.worker_s == 0


@pytest.mark.parametrize("protocol", ["search-r1", "reasoning-search", "tool-calls"])
def test_a_non_streaming_agent_steps_the_worker_turn_by_turn(codec, protocol):
    # Under reasoning-search the in-process rollout runs NL-DAG plans on thread pools before the fork:
    # the worker must not inherit those pools (their threads do not exist in it) and hang.
    env = BatchSearchQAEnv(6, protocol=protocol, tokenizer=codec, world_size=40)
    agent = ScriptedRolloutAgent(OracleAgent)
    assert not isinstance(agent, StreamingRolloutAgent) or not getattr(agent, "streams_chunks", False)
    in_process = collect_rollouts(agent, env, [0, 1, 2, 3, 4, 5, 6, 7, 8])  # two waves of six episodes
    with EnvWorker(env) as worker:
        via_worker = collect_rollouts(ScriptedRolloutAgent(OracleAgent), worker, [0, 1, 2, 3, 4, 5, 6, 7, 8])
    assert episodes(via_worker) == episodes(in_process)
    assert sum(t.reward for t in via_worker.trajectories) > 0  # the oracle answers: the comparison is not of empty episodes
    assert all(call.kind == {"reasoning-search": "dag", "tool-calls": "tool"}.get(protocol, "query")
               for t in via_worker.trajectories for call in t.tool_calls)


def test_the_sampler_hands_each_row_over_once_as_it_stops(codec):
    policy = biased_policy(codec, "search-r1")
    env = BatchSearchQAEnv(8, protocol="search-r1", tokenizer=codec, max_new_tokens=96)
    obs, _ = env.reset(options=[{"index": i // 2} for i in range(8)])
    sampler = HFSampler(policy, temperature=0.9, seed=3)
    assert isinstance(sampler, StreamingRolloutAgent) and sampler.streams_chunks
    sampler.begin([list(o["token_ids"]) for o in obs], examples=[env.envs[i].example for i in range(8)],
                  protocol=env.envs[0].protocol, codec=codec)
    calls = []
    chunks = sampler.generate(list(range(8)), [96] * 8, on_chunks=lambda stopped: calls.append(dict(stopped)))
    reported = {row: chunk for call in calls for row, chunk in call.items()}
    assert sum(len(call) for call in calls) == 8 and set(reported) == set(range(8))  # every row exactly once
    assert [reported[row] for row in range(8)] == chunks  # the very chunks generate returns
    assert len({len(c.ids) for c in chunks}) > 1 and len(calls) > 1  # rows stopped at different steps, reported as they did


def test_worker_errors_come_back_with_their_message_and_a_closed_worker_refuses_work(codec):
    env = BatchSearchQAEnv(2, protocol="search-r1", tokenizer=codec, world_size=20)
    worker = EnvWorker(env)
    assert worker.pid is not None and worker.pid != os.getpid() and os.path.exists(f"/proc/{worker.pid}")
    worker.reset(options=[{"index": 0}, {"index": 1}])
    with pytest.raises(ValueError, match="action space"):
        worker.step([[codec.vocab_size + 5], None])
    eos = min(codec.eos_ids)
    _, _, terminated, _, infos = worker.step([[eos], None])
    assert terminated.tolist() == [True, False] and infos[0]["end_reason"] == "eos" and infos[1] == {}
    obs, _, terminated, _, _ = worker.step([None, codec.encode(" thinking")])
    assert terminated.tolist() == [True, False] and obs[0]["token_ids"] == ()  # a row not stepped keeps its flags
    worker.submit({0: [eos]})  # episode 0 has ended: the worker refuses, and collect raises it
    with pytest.raises(RuntimeError, match="episode 0 has ended"):
        worker.collect()
    with pytest.raises(ValueError, match="reward step"):
        worker.set_reward_step(-1)
    worker.submit({1: codec.encode("<answer> x </answer>")})
    with pytest.raises(RuntimeError, match="not collected"):
        worker.reset(options=[{"index": 0}, {"index": 1}])
    assert worker.collect()[1][2] is True  # terminated by the answer
    worker.close()
    worker.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        worker.submit({0: [eos]})


def test_sources_with_thread_pools_search_in_the_worker_after_the_parent_used_them(codec):
    # A hybrid source fuses on its own threads and source_timeout_s runs each source on a pool: after the
    # parent used them, the forked worker must start its own threads (the parent's do not exist in it).
    world = BatchSearchQAEnv(1, protocol="search-r1", tokenizer=codec, world_size=40).envs[0]
    hybrid = HybridSource([world.sources["all"], world.sources["wiki"]], name="all")
    env = BatchSearchQAEnv(4, protocol="search-r1", tokenizer=codec, dataset=world.examples, sources={"all": hybrid},
                           source_timeout_s=30.0)
    in_process = collect_rollouts(ScriptedRolloutAgent(OracleAgent), env, [0, 1, 2, 3])
    with EnvWorker(env) as worker:
        via_worker = collect_rollouts(ScriptedRolloutAgent(OracleAgent), worker, [0, 1, 2, 3])
    assert episodes(via_worker) == episodes(in_process)
    calls = [call for t in via_worker.trajectories for call in t.tool_calls]
    assert calls and all(call.error is None and call.passage_ids for call in calls)


class TorchModelSource(Source):
    """Stands for a dense source: it says it cannot search from a forked process."""

    name = "dense"

    @property
    def fork_safe(self) -> bool:
        return False

    def search(self, queries, k):
        return [[] for _ in queries]


def test_a_source_that_cannot_search_from_a_fork_is_refused_up_front(codec):
    env = BatchSearchQAEnv(2, protocol="search-r1", tokenizer=codec, world_size=20,
                           sources={"dense": TorchModelSource()}, cache_size=8)  # wrapped in a cache, which delegates
    with pytest.raises(ValueError, match=r"\['dense'\] cannot search from a forked worker"):
        EnvWorker(env)
    assert DenseSource.fork_safe.fget(None) is False  # the real dense source says so


def test_a_reset_of_given_questions_is_answered_here_and_checked_when_the_worker_replies(codec):
    env = BatchSearchQAEnv(2, protocol="search-r1", tokenizer=codec, world_size=20)
    with EnvWorker(env) as worker:
        obs, infos = worker.reset(options=[{"index": 0}, {"example": env.envs[0].examples[1]}])
        assert len(worker._expected) == 1  # answered before the worker's reply was read
        here, here_infos = env.reset(options=[{"index": 0}, {"index": 1}])
        assert obs == here and infos == here_infos
        # A seeded reset (questions drawn at random) waits for the worker, and draws as the environment does.
        assert worker.reset(seed=3) == env.reset(seed=3)
        # This side's copy disagreeing with the worker is caught when the worker's reply arrives.
        question = env.envs[0].examples[2].question
        env.envs[0]._prompts[question] = ((1, 2, 3), b"abc", (1, 2, 3))
        assert worker.reset(options=[{"index": 2}, {"index": 1}])[0][0]["token_ids"] == (1, 2, 3)
        with pytest.raises(RuntimeError, match="other prompts"):
            worker.collect()
