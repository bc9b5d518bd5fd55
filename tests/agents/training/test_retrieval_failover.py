"""A training run searching two replicas of a retrieval server (``data.retrieval_url``) keeps every
step when one replica dies: its searches go to the other replica, none fails, and the run's log says
which replica went down.

The questions and passages are a synthetic world's, written as a FlashRAG dataset and corpus; both
servers serve the corpus over loopback, and a callback stops the first one once the first step's update
is done. A scripted agent searches once per episode, so every step searches.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Mapping

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "jsonargparse", "matplotlib")
skip_without("server", "starlette", "pydantic", "uvicorn")
from agents.scripted.agents import RetrieveThenAnswerAgent  # noqa: E402
from tests.agents.training.scripted_engine import ScriptedEngine  # noqa: E402
from agents.training.build import build_trainer  # noqa: E402
from agents.training.callbacks import Callback  # noqa: E402
from agents.training.trainer import Trainer  # noqa: E402
from search_env.server import RetrievalServer  # noqa: E402
from search_env.sources.bm25 import BM25Source  # noqa: E402
from search_env.synthetic import generate_world  # noqa: E402
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
    world = generate_world(seed=3, n_questions=40)
    dataset, corpus = tmp_path / "questions.jsonl", tmp_path / "corpus.jsonl"
    dataset.write_text("".join(json.dumps({"id": q.id, "question": q.question, "golden_answers": list(q.golden_answers)}) + "\n"
                               for q in world.questions))
    corpus.write_text("".join(json.dumps({"id": p["id"], "title": p["title"], "text": p["text"]}) + "\n" for p in world.passages()))
    servers = [RetrievalServer(BM25Source(str(corpus), name="wiki")).start() for _ in range(2)]
    dead, alive = (server.retrieve_url for server in servers)
    config = small_config("grpo", tmp_path / "run", {"run.steps": STEPS, "eval.questions": 0, "env.max_new_tokens": 200,
                                                     "data.dataset": str(dataset), "data.retrieval_url": f"{dead},{alive}"})
    trainer = build_trainer(config, callbacks=[StopServerAfter(servers[0], step=1)])
    trainer.engine = ScriptedEngine(RetrieveThenAnswerAgent)
    try:
        with caplog.at_level(logging.WARNING, logger="search_env.sources.remote"):
            result = trainer.train()
    finally:
        trainer.close_environments()
        for server in servers:
            server.stop()
    steps = records(tmp_path / "run" / "metrics.jsonl")
    assert result.steps_run == STEPS and [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert all(r["searches"] == 1.0 and r["searches/failed"] == 0 for r in steps)  # every search was answered
    said = [r.getMessage() for r in caplog.records if r.name == "search_env.sources.remote"]
    assert said and dead in said[0] and "is down" in said[0] and not any(alive in line for line in said)
