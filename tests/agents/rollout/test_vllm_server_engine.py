"""The ``vllm-server`` rollout engine: vLLM servers in their own processes, run from the main install.

The trainer's side runs here (the main virtualenv needs no vLLM); the servers it launches run with the
Python of the vLLM virtualenv that ``.ci/vllm_venv.sh`` builds. One engine of two replicas serves the
module (a server takes about a minute to start on two cores): a one-layer Llama of the scripted models'
shapes, first with random weights, then with each protocol's scripted weights, all sent by weight syncs.
The in-process engine's episodes, to compare with, come from a subprocess of the vLLM virtualenv; the
test that kills the trainer starts one more engine in a subprocess of its own. The test that kills a
server runs last, as it leaves the module's engine with one replica gone.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from agents.policies.policy import HFPolicy
from agents.rollout.collect import collect_rollouts
from agents.rollout.engines import EngineSetup, lookup_engine
from agents.rollout.vllm_server_engine import RolloutServerError, VLLMServerEngineOptions
from agents.rollout.vllm_folder import write_model_folder
from search_env import BatchSearchQAEnv
from search_env.tokenization import as_codec
from search_env.trajectory import AGENT
from tests.agents.rollout.scripted_lm import script_episode, scriptable_protocols, scripted_lm
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]

#: The engine's log-probs are the trainer's within this (float32 on both sides, other kernels).
LOGPROB_ATOL = 1e-4
MAX_CONTEXT = 1024
SEQUENCE = "Who founded the Tallis Group? <search> Tallis Group founder </search>"


def random_lm(codec, seed: int):
    """A model of the scripted models' shapes (their weights can replace its own) with random weights."""
    env = BatchSearchQAEnv(1, protocol="search-r1", tokenizer=codec)
    prompts = [env.envs[0].first_observation(env.examples[0])[0]["token_ids"]]
    lm = scripted_lm(script_episode(env.protocol, codec, prompts), codec)
    env.close()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in lm.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return lm


@pytest.fixture(scope="module")
def policy() -> HFPolicy:
    codec = as_codec(None)
    return HFPolicy(random_lm(codec, seed=0), codec)


@pytest.fixture(scope="module")
def engine(vllm_python, policy):
    """Two replicas launched by the registered engine, as the trainer builds it."""
    options = VLLMServerEngineOptions(replicas=2, python=vllm_python, threads=1, startup_timeout_s=900,
                                      request_timeout_s=300)
    setup = EngineSetup(policy, temperature=1.0, top_p=1.0, max_context=MAX_CONTEXT, seed=0)
    engine = lookup_engine("vllm-server").build(options, setup)
    yield engine
    engine.close()


def trainer_logprobs(policy, sequence) -> torch.Tensor:
    with torch.no_grad():
        ids = torch.tensor([sequence])
        return policy(ids, torch.ones_like(ids)).logprobs[0, 1:]


def engine_gap(engine, policy, sequence) -> float:
    return float((torch.tensor(engine.logprobs([sequence])[0][1:]) - trainer_logprobs(policy, sequence)).abs().max())


def processes_alive(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.killpg(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    return alive


def test_options_refuse_bad_values_in_one_line():
    for bad in ({"replicas": 0}, {"threads": 0}, {"urls": ["localhost:8000"]}, {"request_timeout_s": 0},
                {"gpus": ["0"], "replicas": 2}, {"memory_fraction": 1.5}, {"group_port": 70000}):
        with pytest.raises(ValueError) as caught:
            VLLMServerEngineOptions(**bad)
        assert "\n" not in str(caught.value) and "engine." in str(caught.value), bad


def test_weights_sync_over_the_group_and_the_version_counts_syncs(engine, policy):
    """The servers' log-probs are the trainer's after a sync; changed trainer weights are not served
    until the next sync; each sync raises the weights version an agent records."""
    sequence = policy.codec.encode(SEQUENCE)
    engine.sync()
    version = engine.version
    assert engine_gap(engine, policy, sequence) < LOGPROB_ATOL
    saved = {k: v.clone() for k, v in policy.model.state_dict().items()}
    with torch.no_grad():
        policy.model.lm_head.weight.add_(torch.randn(policy.model.lm_head.weight.shape, generator=torch.Generator().manual_seed(1)))
    stale_gap = engine_gap(engine, policy, sequence)
    engine.sync()
    synced_gap = engine_gap(engine, policy, sequence)
    agent = engine.agent(seed=0)
    policy.model.load_state_dict(saved)
    engine.sync()
    assert stale_gap > 1e-2, stale_gap  # the trainer moved, the servers did not ...
    assert synced_gap < LOGPROB_ATOL, synced_gap  # ... until the sync
    assert engine.version == version + 2 and agent.weights_version == version + 1


def test_the_sync_check_passes_a_sync_and_stops_one_that_sent_nothing(engine, policy, monkeypatch):
    """The checked-sync API on the servers (both replicas score the probe): after a real sync the gap is far
    below the float32 tolerance; a sync whose broadcast is skipped (the version still goes up) fails the
    check with its one line; the servers are then synced for real again."""
    from agents.rollout.sync_check import StaleEngineError, SyncCheck, default_tolerance, make_probe, policy_logprobs

    probe = make_probe([policy.codec.encode(SEQUENCE), policy.codec.encode("Where is the Tallis Group based?")], seed=0,
                       count=2, length=12)
    check = SyncCheck(probe, lambda sequences: policy_logprobs(policy.eval(), sequences), engine_name="vllm-server",
                      tolerance=default_tolerance(engine.dtype, "float32"))
    engine.sync()
    good = check.follow(engine)
    saved = {k: v.clone() for k, v in policy.model.state_dict().items()}
    with torch.no_grad():
        policy.model.lm_head.weight.add_(torch.randn(policy.model.lm_head.weight.shape, generator=torch.Generator().manual_seed(2)))
    try:
        with monkeypatch.context() as patched:
            patched.setattr(engine, "_broadcast", lambda method, args, weights: [])
            engine.sync()
        with pytest.raises(StaleEngineError) as caught:
            check.follow(engine)
    finally:
        policy.model.load_state_dict(saved)
        engine.sync()
    assert good is not None and good < 1e-4, check.gaps
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"weight sync check: engine vllm-server, sync {engine.syncs - 1}:"), message


def test_an_optimiser_step_makes_the_weights_stale_and_the_next_rollout_syncs(engine, policy):
    from agents.learners import GRPO, GRPOConfig
    from agents.training.backends import build_backend
    from agents.training.config import OptimConfig, TrainConfig

    config = TrainConfig("grpo", algorithm=GRPOConfig(group_size=2, kl_coef=0.0), optim=OptimConfig(learning_rate=1e-2))
    backend = build_backend(config, policy, GRPO(config.algorithm))
    saved = {k: v.clone() for k, v in policy.model.state_dict().items()}
    engine.attach(backend)
    sequence = policy.codec.encode(SEQUENCE)
    before = torch.tensor(engine.logprobs([sequence])[0][1:])  # attach's sync
    policy.train()
    ids = torch.tensor([sequence])
    (-policy(ids, torch.ones_like(ids)).logprobs.sum()).backward()
    backend.step()
    policy.eval()
    stale, syncs = engine.stale, engine.syncs
    after = torch.tensor(engine.logprobs([sequence])[0][1:])
    gap = float((after - trainer_logprobs(policy, sequence)).abs().max())
    engine.stale, engine._weights = False, engine._policy_weights  # detach from the test's backend
    policy.model.load_state_dict(saved)
    engine.sync()
    assert stale and engine.syncs >= syncs + 1
    assert float((after - before).abs().max()) > 1e-2 and gap < LOGPROB_ATOL, gap


IN_PROCESS = textwrap.dedent("""
    import json, os, sys
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    torch.set_num_threads(1)
    from agents.policies.loading import load_policy
    from agents.rollout.collect import collect_rollouts
    from agents.rollout.vllm_engine import VLLMEngine
    from search_env import BatchSearchQAEnv
    folder, protocols = sys.argv[1], sys.argv[2:]
    policy = load_policy(folder)
    engine = VLLMEngine(policy, memory_fraction=0.05, max_model_len=%d)
    out = {}
    for protocol in protocols:
        env = BatchSearchQAEnv(8, protocol=protocol, tokenizer=policy.codec, max_new_tokens=24, max_context=%d)
        rollout = collect_rollouts(engine.agent(seed=11, first_row=3), env, [0, 1, 2, 3], group_size=2)
        out[protocol] = [[t.token_ids, lps] for t, lps in zip(rollout.trajectories, rollout.sampled_logprobs)]
        env.close()
    engine.close()
    print(json.dumps(out))
""" % (MAX_CONTEXT, MAX_CONTEXT))


def test_seeded_episodes_equal_the_in_process_engines(engine, policy, vllm_python, tmp_path):
    """The same seed and first row sample the same ids, with the same log-probs, on two replicas as on
    the in-process engine (vLLM's seeded sampling, whichever replica and batch a row lands in)."""
    engine.sync()
    protocols = ["search-r1", "r1-searcher"]
    write_model_folder(policy, tmp_path / "policy")
    env_vars = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([vllm_python, "-c", IN_PROCESS, str(tmp_path / "policy"), *protocols], capture_output=True,
                         text=True, timeout=900, cwd=REPO_ROOT, env=env_vars)
    assert run.returncode == 0, run.stderr[-4000:]
    in_process = json.loads(run.stdout.strip().splitlines()[-1])
    for protocol in protocols:
        env = BatchSearchQAEnv(8, protocol=protocol, tokenizer=policy.codec, max_new_tokens=24, max_context=MAX_CONTEXT)
        rollout = collect_rollouts(engine.agent(seed=11, first_row=3), env, [0, 1, 2, 3], group_size=2)
        env.close()
        theirs = in_process[protocol]
        assert [t.token_ids for t in rollout.trajectories] == [ids for ids, _ in theirs], protocol
        for mine, (_, lps) in zip(rollout.sampled_logprobs, theirs):
            assert max(abs(a - b) for a, b in zip(mine, lps)) < LOGPROB_ATOL, protocol
        assert any(any(lp != 0.0 for lp in lps) for lps in rollout.sampled_logprobs)


def multi_turn(traj) -> bool:
    seen_env = False
    for t in range(traj.prompt_length, len(traj.token_ids)):
        if traj.producers[t] != AGENT:
            seen_env = True
        elif seen_env:
            return True
    return False


def test_multi_turn_episodes_under_every_protocol(engine, policy):
    """Each protocol's scripted weights, synced into the running servers, write their search-then-answer
    episode (the context after the search results sent back as ids); the sampled log-probs sit on the
    agent's tokens only."""
    codec, questions = policy.codec, [0, 1, 2]
    saved = {k: v.clone() for k, v in policy.model.state_dict().items()}
    try:
        for protocol in scriptable_protocols():
            env = BatchSearchQAEnv(len(questions) * 2, protocol=protocol, tokenizer=codec, max_new_tokens=64,
                                   max_context=MAX_CONTEXT)
            prompts = [env.envs[0].first_observation(env.examples[q])[0]["token_ids"] for q in questions]
            episode = script_episode(env.protocol, codec, prompts)
            policy.model.load_state_dict(scripted_lm(episode, codec).state_dict())
            engine.sync()
            rollout = collect_rollouts(engine.agent(greedy=True, seed=0), env, questions, group_size=2)
            env.close()
            trajectories = rollout.trajectories
            agent_ids = [[i for i, p in zip(t.token_ids, t.producers) if p == AGENT] for t in trajectories]
            assert all(ids == episode.agent_ids for ids in agent_ids), protocol
            assert all(multi_turn(t) and len(t.tool_calls) >= 1 for t in trajectories), protocol
            assert all(lp == 0.0 for lps, t in zip(rollout.sampled_logprobs, trajectories)
                       for lp, p in zip(lps, t.producers) if p != AGENT), protocol
    finally:
        policy.model.load_state_dict(saved)
        engine.sync()


def served_requests(url: str) -> float:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def test_two_replicas_share_the_rows(engine, policy):
    before = [served_requests(url) for url in engine.urls]
    env = BatchSearchQAEnv(8, protocol="search-r1", tokenizer=policy.codec, max_new_tokens=8, max_context=MAX_CONTEXT)
    collect_rollouts(engine.agent(seed=2), env, [0, 1, 2, 3], group_size=2)
    env.close()
    served = [served_requests(url) - b for url, b in zip(engine.urls, before)]
    assert len(served) == 2 and served[0] >= 4 and served[1] >= 4, served  # eight rows, four each (per turn)


KILLED_TRAINER = textwrap.dedent("""
    import contextlib, json, sys, time, torch
    torch.set_num_threads(1)
    from agents.policies.config import ModelConfig
    from agents.policies.loading import load_policy
    from agents.rollout.vllm_server_engine import VLLMServerEngine, VLLMServerEngineOptions
    policy = load_policy(ModelConfig(lora_rank=4), seed=0)
    generator = torch.Generator().manual_seed(3)
    def move_adapters():
        with torch.no_grad():
            for name, parameter in policy.model.named_parameters():
                if ".lora_B." in name:
                    parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.1)
    move_adapters()
    engine = VLLMServerEngine(policy, VLLMServerEngineOptions(python=sys.argv[1], startup_timeout_s=900), max_model_len=256)
    sequence = policy.codec.encode("Who founded the Tallis Group? <search> Tallis Group founder </search>")
    def gap(adapters=True):
        with torch.no_grad(), (contextlib.nullcontext() if adapters else policy.adapters_off()):
            ids = torch.tensor([sequence])
            mine = policy(ids, torch.ones_like(ids)).logprobs[0, 1:]
        return float((torch.tensor(engine.logprobs([sequence])[0][1:]) - mine).abs().max())
    result = {"built_gap": gap(), "base_gap": gap(adapters=False), "served": engine.model}
    move_adapters()
    result["stale_gap"] = gap()
    engine.sync()
    replica = engine._replicas[0]
    result.update(launcher=replica.process.pid, server=int(open(replica.pid_file).read()), synced_gap=gap(),
                  synced_served=engine.model)
    print(json.dumps(result), flush=True)
    time.sleep(600)
""")


def test_nothing_is_left_running_after_the_trainer_is_killed(vllm_python):
    """A trainer killed with SIGKILL runs no clean-up: the launcher ends its server when the trainer's end
    of its stdin closes. The same subprocess serves LoRA adapters: the servers' log-probs are the adapted
    model's (not its base's), and after the adapters move and a sync, under a new adapter name, the new
    adapters' (a sync that did not arrive would leave the stale gap)."""
    env_vars = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    trainer = subprocess.Popen([sys.executable, "-c", KILLED_TRAINER, vllm_python], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=env_vars, cwd=REPO_ROOT, start_new_session=True)
    try:
        line = "not yet"
        while line and not line.startswith("{"):  # libraries may print their notices first
            line = trainer.stdout.readline()
        assert line, "the trainer subprocess ended before its engine was up"
        started = json.loads(line)
        groups = [started["launcher"], started["server"]]
        assert processes_alive(groups) == groups
        trainer.kill()
        trainer.wait(30)
        deadline = time.monotonic() + 60
        while processes_alive(groups) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert processes_alive(groups) == [], groups
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    assert started["built_gap"] < LOGPROB_ATOL and started["base_gap"] > 1e-2, started
    assert started["stale_gap"] > 1e-2 and started["synced_gap"] < LOGPROB_ATOL, started
    assert started["served"] == "policy-adapters-1" and started["synced_served"] == "policy-adapters-2", started


def test_a_server_killed_mid_rollout_ends_it_with_one_line_naming_it(engine, policy):
    """Runs last: replica 1's server is killed as soon as a request of the rollout is on its way to it;
    then closing the engine leaves none of its processes running."""
    replica = engine._replicas[1]
    server_group = int(Path(replica.pid_file).read_text())
    groups = [group for r in engine._replicas for group in (r.process.pid, int(Path(r.pid_file).read_text()))]
    submit = engine.submit

    def submit_then_kill(row, body):
        future = submit(row, body)
        if row % 2 == 1 and processes_alive([server_group]):
            os.killpg(server_group, signal.SIGKILL)
        return future

    env = BatchSearchQAEnv(8, protocol="search-r1", tokenizer=policy.codec, max_new_tokens=64, max_context=MAX_CONTEXT)
    engine.submit = submit_then_kill
    started = time.monotonic()
    try:
        with pytest.raises(RolloutServerError) as caught:
            collect_rollouts(engine.agent(seed=4), env, [0, 1, 2, 3], group_size=2)
    finally:
        engine.submit = submit
        env.close()
    message = str(caught.value)
    assert time.monotonic() - started < 120
    assert "\n" not in message and "replica 1" in message and replica.url in message, message
    engine.close()
    assert processes_alive(groups) == [], groups
