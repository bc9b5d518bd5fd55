"""Both batch environments satisfy :class:`search_env.BatchEnv`: rollouts, trainers and warm starts read
the dataset, protocol, tokenizer and budgets from the batch, never from ``envs[0]``."""
from __future__ import annotations

import multiprocessing

import pytest

from search_env import BatchEnv, BatchSearchQAEnv, EnvWorker, SearchQAEnv

SETTINGS = dict(protocol="r1-searcher", world_size=30, max_new_tokens=64, max_context=1024, max_turns=2)


def check_batch_env(batch, reference: SearchQAEnv, *, rows_here: bool) -> None:
    assert isinstance(batch, BatchEnv)
    assert batch.num_envs == 3
    assert batch.examples is reference.examples and batch.examples[0].question == reference.examples[0].question
    assert batch.protocol is reference.protocol and batch.protocol.name == "r1-searcher"
    assert batch.codec is reference.codec
    assert (batch.max_new_tokens, batch.max_context) == (64, 1024)
    single = batch.make_env()
    assert isinstance(single, SearchQAEnv) and single not in batch.envs
    assert single.examples == reference.examples and single.codec is reference.codec and single.max_turns == 2
    obs, infos = batch.reset(options=[{"index": i} for i in range(3)])
    assert [info["question"] for info in infos] == [ex.question for ex in reference.examples[:3]]
    eos = min(batch.codec.eos_ids)
    _, rewards, terminated, truncated, step_infos = batch.step([[eos], None, [eos]])
    assert list(terminated) == [True, False, True] and not truncated.any() and rewards.shape == (3,)
    assert step_infos[0]["end_reason"] == "eos" and step_infos[1] == {}
    single.reset(options={"index": 0})
    assert single.step([eos])[4]["end_reason"] == "eos"  # its episode is its own: the batch's rows are untouched
    if rows_here:  # the in-process batch's row 1 was left alone (a worker's rows live in the worker)
        assert batch.envs[1].trajectory.end_reason is None and not batch.envs[1].done
    batch.set_reward_step(3)
    assert all(env.reward_step == 3 for env in batch.envs)  # the worker keeps the caller's copy in step too


def test_the_in_process_batch_is_a_batch_env():
    batch = BatchSearchQAEnv(3, **SETTINGS)
    check_batch_env(batch, batch.envs[0], rows_here=True)
    batch.close()


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="the worker needs fork")
def test_the_worker_is_a_batch_env():
    batch = BatchSearchQAEnv(3, **SETTINGS)
    with EnvWorker(batch) as worker:
        check_batch_env(worker, batch.envs[0], rows_here=False)
        assert worker.envs is batch.envs  # kept for callers that still read envs[i]
