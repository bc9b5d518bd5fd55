"""A training run searching two replicas of a retrieval server keeps every step when one replica dies:
its searches go to the other replica, none fails, and the run's log says which replica went down.

The run is the tiny one (:mod:`tests.agents.training.tiny`) with a scripted agent that searches once per
episode, so every step searches; both servers serve the run's own synthetic world over loopback, and
the first one is stopped by a callback once the first step's update is done.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "jsonargparse", "matplotlib")
skip_without("server", "starlette", "pydantic", "uvicorn")
from agents.scripted.agents import RetrieveThenAnswerAgent  # noqa: E402
from agents.scripted.rollout_agent import ScriptedRolloutAgent  # noqa: E402
from agents.training.build import build_trainer, env_options  # noqa: E402
from agents.training.callbacks import Callback  # noqa: E402
from agents.training.data import split_data  # noqa: E402
from agents.training.trainer import Trainer  # noqa: E402
from search_env import BatchSearchQAEnv  # noqa: E402
from search_env.server import RetrievalServer  # noqa: E402
from search_env.sources.remote import RemoteSource  # noqa: E402
from tests.agents.training.tiny import records, small_config  # noqa: E402

STEPS = 4


class StopServerAfter(Callback):
    """Stops ``server`` once ``step`` training steps are done (as a replica that dies mid-run)."""

    def __init__(self, server: RetrievalServer, step: int) -> None:
        self.server, self.step = server, step

    def on_update(self, trainer: Trainer, metrics: Mapping[str, Any]) -> None:
        if trainer.step == self.step:
            self.server.stop()


def test_a_run_keeps_every_step_when_one_of_two_replicas_dies(tmp_path, caplog) -> None:
    config = small_config("grpo", tmp_path, {"run.steps": STEPS, "eval.questions": 0, "env.max_new_tokens": 200})
    (examples, sources), _ = split_data(config)
    servers = [RetrievalServer(sources["all"]).start() for _ in range(2)]  # the run's world, served twice
    dead, alive = (server.retrieve_url for server in servers)
    # The default source of the search-r1 protocol, through both replicas; a long cool-down, so the dead
    # one is tried exactly once after it died.
    remote = RemoteSource([dead, alive], name="all", cooldown_s=3600)
    trainer = None
    try:
        built = build_trainer(config)
        built.close_environments()
        env = BatchSearchQAEnv(built.env.num_envs, dataset=examples, sources={**sources, "all": remote},
                               **env_options(config, built.policy.codec))
        trainer = Trainer(config, built.policy, env, built.algorithm, built.backend,
                          agent_factory=lambda greedy, seed: ScriptedRolloutAgent(RetrieveThenAnswerAgent),
                          callbacks=[StopServerAfter(servers[0], step=1)])
        with caplog.at_level(logging.WARNING, logger="search_env.sources.remote"):
            result = trainer.train()
        status = remote.replica_status()
    finally:
        if trainer is not None:
            trainer.close_environments()
        remote.close()
        for server in servers:
            server.stop()
    steps = records(tmp_path / "metrics.jsonl")
    assert result.steps_run == STEPS and [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert all(r["searches"] == 1.0 and r["searches/failed"] == 0 for r in steps)  # every search was answered
    assert status[dead].down and status[dead].failures == 1
    assert status[alive].requests >= STEPS - 1 and status[alive].failures == 0
    said = [r.getMessage() for r in caplog.records if r.name == "search_env.sources.remote"]
    assert len(said) == 1 and dead in said[0] and "is down" in said[0]
