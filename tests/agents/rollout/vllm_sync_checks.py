"""Checked weight syncs with the in-process vLLM engine, run inside the vLLM virtualenv by
``test_vllm_sync_check.py``, which reads the JSON line this script prints last.

    python tests/agents/rollout/vllm_sync_checks.py full|lora|async1|async2 [...]

Each check trains the tiny model (``full``: all weights synced; ``lora``: LoRA adapters) with
``rollout.engine: vllm`` for up to four steps at a large learning rate; after step 2 the engine's syncs are
broken on purpose (``full``: a sync that counts but loads nothing; ``lora``: the adapters of step 0 sent
again), so the run must stop at the next sync with the check's one-line error. Reports the gaps of the
syncs before, the error, and the time each check took. ``async1`` and ``async2`` train with the next one or
two steps generated ahead (:func:`check_async`).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

MEMORY = 0.05  # of the machine's memory for the KV cache (capped at 2 GiB)


def check(lora: bool) -> dict:
    from agents.training.build import build_trainer
    from agents.training.callbacks import Callback
    from agents.training.health import TrainingFailed
    from tests.agents.training.tiny import small_config

    changes = {"rollout.engine": "vllm", "engine.memory_fraction": MEMORY, "eval.questions": 0, "run.steps": 4,
               "optim.learning_rate": 0.05, "env.max_context": 1024}
    if lora:
        changes["model.lora_rank"] = 4
    trainer = build_trainer(small_config("grpo", tempfile.mkdtemp(prefix="vllm-sync-check-"), changes))
    engine, policy = trainer.engine, trainer.policy
    old_adapters = {n: t.detach().clone() for n, t in policy.named_weights(adapters=True)} if lora else {}
    check_seconds: list[float] = []
    steps: list[dict] = []
    follow = trainer.rollout_driver.sync_check.follow

    def timed_follow(e, **options):
        started = time.perf_counter()
        gap = follow(e, **options)
        if gap is not None:
            check_seconds.append(time.perf_counter() - started)
        return gap

    trainer.rollout_driver.sync_check.follow = timed_follow

    def skipped_sync() -> None:  # received nothing, loaded nothing, and says it synced
        engine.llm.reset_prefix_cache()
        engine.syncs += 1
        engine.stale = False

    class BreakAfterTwo(Callback):
        def on_update(self, trainer, metrics):
            steps.append({"sync_gap": metrics.get("rollout/sync_gap"), "step_s": metrics["time/step"]})
            if trainer.step == 2:
                if lora:
                    engine._weights = lambda **options: iter(old_adapters.items())
                else:
                    engine.sync = skipped_sync

    trainer.callbacks.append(BreakAfterTwo())
    error = None
    try:
        trainer.train()
    except TrainingFailed as exc:
        error = str(exc)
    finally:
        trainer.close_environments()
    return {"error": error, "steps_done": trainer.step, "steps": steps, "gaps": trainer.rollout_driver.sync_check.gaps,
            "tolerance": trainer.rollout_driver.sync_check.tolerance, "check_seconds": check_seconds, "lora": engine.lora,
            "probe_tokens": sum(len(s) for s in trainer.rollout_driver.sync_check.probe)}


def check_async(max_staleness: int, sleep: bool) -> dict:
    """The tiny model trained K steps ahead (``rollout.max_staleness``) on the in-process engine for K + 2 steps
    at a large learning rate: each step's staleness, every sync (its thread, and a snapshot's version), the
    sync check's gaps and, with ``engine.sleep``, whether a rollout was in flight at each of its sleeps."""
    import threading

    from agents.training.build import build_trainer
    from agents.training.callbacks import Callback
    from tests.agents.training.tiny import small_config

    changes = {"rollout.engine": "vllm", "engine.memory_fraction": MEMORY, "eval.questions": 0,
               "run.steps": max_staleness + 2, "rollout.max_staleness": max_staleness, "optim.learning_rate": 0.05,
               "env.max_context": 1024, "engine.sleep": sleep}
    trainer = build_trainer(small_config("grpo", tempfile.mkdtemp(prefix="vllm-async-"), changes))
    engine, syncs, staleness, sleeps = trainer.engine, [], [], []
    sync, engine_sleep = engine.sync, engine.sleep

    def recorded_sync(weights=None):
        syncs.append((threading.current_thread().name, getattr(weights, "version", None)))
        sync(weights)

    def recorded_sleep():
        sleeps.append(trainer.rollout_driver.pipeline.in_flight)
        engine_sleep()

    engine.sync, engine.sleep = recorded_sync, recorded_sleep

    class Staleness(Callback):
        def on_update(self, trainer, metrics):
            staleness.append(metrics["rollout/staleness_max"])

    trainer.callbacks.append(Staleness())
    started = time.perf_counter()
    try:
        result = trainer.train()
    finally:
        trainer.close_environments()
    return {"steps_done": result.step, "staleness": staleness, "syncs": syncs, "gaps": trainer.rollout_driver.sync_check.gaps,
            "tolerance": trainer.rollout_driver.sync_check.tolerance, "in_flight": trainer.rollout_driver.pipeline.in_flight,
            "sleeps_in_flight": sleeps,
            "seconds": time.perf_counter() - started}


CHECKS = {"full": lambda: check(False), "lora": lambda: check(True), "async1": lambda: check_async(1, True),
          "async2": lambda: check_async(2, False)}

if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("VLLM_CHECK_THREADS", "2")))
    results: dict = {}
    for name in sys.argv[1:]:
        results[name] = CHECKS[name]()
        print(f"check {name} done", file=sys.stderr, flush=True)
    print(json.dumps(results))
