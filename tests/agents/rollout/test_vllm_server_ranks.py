"""Data-parallel ranks with vLLM servers (the disaggregated layout: TRL's server mode, verl's rollout workers),
in the vLLM virtualenv on two CPU ranks (``torchrun``, gloo). Rank 0 owns the servers and their weight group;
every rank sends its own rows' requests, a row to replica (its global index) mod N. One ``agents.train``
command samples the same episodes as one process and ends at its parameters (FSDP2 on two servers, ZeRO-3
on one), each rank checking every sync; two steps ahead (``rollout.max_staleness 2``) on two ZeRO-3 ranks,
stopped after step 2 and resumed, takes the one process's steps; and on two ZeRO-2 ranks with a server that
rank 0 launched (its URL told to rank 1), killed between steps, both ranks end with the same one ``error:``
line naming it, nothing left running.

The runs share one module fixture, one after another, and two servers the module starts once (each run
reaches them by ``engine.urls`` and joins their weight group anew)."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, skip_without

skip_without("agents", "torch", "safetensors")
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from tests.agents.training.torchrun import free_port, rank_env, torchrun  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.fsdp, pytest.mark.deepspeed, pytest.mark.timeout(2400)]

#: The colocated test's small command on the server engine: the demo's tiny model with one layer, two steps
#: of four questions sampled twice (two question groups per rank), no evaluation, every step's first episodes
#: as text.
COMMAND = ("--algo", "grpo", "--model.name", "tiny", "--model.tiny_layers", "1", "--run.steps", "2",
           "--rollout.questions_per_step", "4", "--algorithm.group_size", "2", "--env.max_new_tokens", "16",
           "--env.max_context", "512", "--data.world_size", "30", "--algorithm.kl_coef", "0.01", "--run.seed", "3",
           "--optim.learning_rate", "1e-3", "--rollout.engine", "vllm-server", "--engine.threads", "1",
           "--engine.startup_timeout_s", "900", "--engine.request_timeout_s", "120", "--eval.questions", "0",
           "--run.report_to", "[]", "--run.sample_every", "1")
FSDP, ZERO3 = ("--run.backend", "fsdp"), ("--run.backend", "deepspeed", "--backend.zero_stage", "3")
#: Two steps ahead, over four steps: steps 2 and 3 are sampled by the first weights (step 2's rollout launched
#: with none in flight, its sync on the main thread), step 4 by the weights after step 2's update, launched
#: behind step 3's rollout (a snapshot, synced on the rollout's thread).
AHEAD = ("--rollout.max_staleness", "2", "--run.steps", "4")
#: Parameters agree within this (float sums over 8 rows in one process and 4 on each rank, in another order):
#: a hundredth of one Adam step at the command's learning rate, so a step that moved nothing fails.
ATOL, RTOL = 1e-5, 1e-5
#: Right after a correct sync the servers score the probe as the trainer does, to float32 noise.
SYNC_GAP_MAX = 1e-4


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _urls(urls: list[str]) -> tuple[str, ...]:
    return ("--engine.urls", json.dumps(urls))


@pytest.fixture(scope="module")
def servers(vllm_python, tmp_path_factory):
    """Two servers over the command's model (each run's first sync replaces their weights)."""
    from agents.policies.config import ModelConfig
    from agents.policies.loading import load_policy
    from agents.rollout.vllm_server_engine import VLLMServerEngine, VLLMServerEngineOptions

    policy = load_policy(ModelConfig(name="tiny", tiny_layers=1), seed=3)
    engine = VLLMServerEngine(policy, VLLMServerEngineOptions(replicas=2, python=vllm_python, threads=1,
                                                              startup_timeout_s=900, request_timeout_s=120),
                              max_model_len=512, seed=3)
    yield engine.urls
    engine.close()


@pytest.fixture(scope="module")
def runs(vllm_python, servers, tmp_path_factory) -> Path:
    """One process and two ranks, synchronous (``one``, ``fsdp`` on both servers, ``zero3`` on the first)
    and two steps ahead (``one-ahead``; ``zero3-ahead`` stopped after step 2, then
    resumed), one after another."""
    out = tmp_path_factory.mktemp("server-ranks")
    engine = ("--engine.python", vllm_python)
    for name, flags in {"one": _urls(servers), "one-ahead": (*_urls(servers), *AHEAD)}.items():
        one = subprocess.run([vllm_python, "-m", "agents.train", *COMMAND, *engine, *flags, "--run.output_dir",
                              str(out / name)], cwd=REPO_ROOT, env=rank_env(), capture_output=True, text=True, timeout=600)
        assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-6000:]
    ranks = {"fsdp": (*FSDP, *_urls(servers)), "zero3": (*ZERO3, *_urls(servers[:1])),
             "zero3-ahead": (*ZERO3, *_urls(servers), *AHEAD, "--run.stop_after", "2")}
    for name, flags in ranks.items():
        torchrun(2, "-m", "agents.train", *COMMAND, *engine, *flags, "--run.output_dir", str(out / name),
                 python=vllm_python)
    torchrun(2, "-m", "agents.train", *COMMAND, *engine, *ZERO3, *_urls(servers), *AHEAD, "--run.resume", "true",
             "--run.output_dir", str(out / "zero3-ahead"), python=vllm_python)
    return out


def _same_steps(one: Path, two: Path, steps: list[int]) -> None:
    """``two`` (two ranks) sampled ``one``'s episodes and took its steps, every sync checked on both ranks."""
    assert _lines(two / "samples.jsonl") == _lines(one / "samples.jsonl")  # the episodes, as text
    single, ranks = _lines(one / "metrics.jsonl"), _lines(two / "metrics.jsonl")
    assert [m["step"] for m in single] == [m["step"] for m in ranks] == steps
    for a, b in zip(single, ranks):
        for key in ("reward", "em", "searches", "response_tokens", "rows", "episodes", "rollout/staleness_max"):
            assert key in b if key in a else key not in b, (two.name, a["step"], key)
            assert b.get(key) == (None if key not in a else pytest.approx(a[key], rel=1e-12)), (two.name, a["step"], key)
        assert b["loss/total"] == pytest.approx(a["loss/total"], rel=1e-5, abs=1e-9), (two.name, a["step"])
        gaps = [b.get(f"rollout/sync_gap_rank{rank}") for rank in (0, 1)]
        if "rollout/sync_gap" in a:  # a step whose rollout followed a sync: both ranks checked it
            assert all(gap is not None and gap < SYNC_GAP_MAX for gap in gaps), (two.name, a["step"], gaps)
        else:  # a gap is logged with the step its rollout was for, however the threads ran
            assert gaps == [None, None], (two.name, a["step"], gaps)
    single = load_file(one / "policy" / "model.safetensors")  # what one process and the ranks exported
    ranks = load_file(two / "policy" / "model.safetensors")
    assert single.keys() == ranks.keys()
    for name, value in single.items():
        torch.testing.assert_close(ranks[name], value, atol=ATOL, rtol=RTOL, msg=lambda text: f"{two.name} {name}: {text}")


@pytest.mark.parametrize("layout", ["fsdp", "zero3"])
def test_two_ranks_on_servers_sample_the_one_process_episodes_and_end_at_its_parameters(runs, layout):
    _same_steps(runs / "one", runs / layout, [1, 2])
    assert all(m["rollout/sync_gap"] < SYNC_GAP_MAX for m in _lines(runs / "one" / "metrics.jsonl"))


def test_two_ranks_two_steps_ahead_stopped_and_resumed_take_the_one_process_steps(runs):
    ranks = _lines(runs / "zero3-ahead" / "metrics.jsonl")
    assert [m["rollout/staleness_max"] for m in ranks] == [0.0, 1.0, 2.0, 2.0]
    # Steps 3 and 4's episodes came from each rank's own rollouts ahead in the checkpoint of step 2 (step 4's
    # sampled by a snapshot of the weights after step 2, synced on the rollout's thread).
    _same_steps(runs / "one-ahead", runs / "zero3-ahead", [1, 2, 3, 4])


#: The trainer's rank 0 kills its server (the whole process group) as step 2's weight sync starts, after
#: writing the launcher's process id and the server's group to the file named first.
KILLER = """
import os, signal, sys
from pathlib import Path
from agents.rollout.vllm_server_engine import VLLMServerEngine
from agents.train import main
from agents.training.rank_exit import run_main
sync, pids = VLLMServerEngine.sync, Path(sys.argv[1])
def killing_sync(self, weights=None):
    if self.version == 1 and self._replicas[0].process is not None:
        replica = self._replicas[0]
        group = int(Path(replica.pid_file).read_text())
        pids.write_text(f"{replica.process.pid} {group}")
        os.killpg(group, signal.SIGKILL)
    return sync(self, weights)
VLLMServerEngine.sync = killing_sync
sys.argv = [sys.argv[0], *sys.argv[2:]]
run_main(main)
"""


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False


def test_a_server_killed_between_steps_ends_both_ranks_in_one_line_and_leaves_nothing_running(vllm_python, tmp_path):
    script, pids = tmp_path / "killer.py", tmp_path / "pids"
    script.write_text(KILLER)
    command = [vllm_python, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), str(script), str(pids), *COMMAND, "--engine.python", vllm_python,
               "--run.backend", "deepspeed", "--backend.zero_stage", "2", "--run.output_dir", str(tmp_path / "run")]
    done = subprocess.run(command, cwd=REPO_ROOT, env=rank_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode != 0 and pids.exists(), done.stderr[-6000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and errors[0] == errors[1], done.stderr[-6000:]  # one line from each rank
    assert "vllm-server replica 0 (http://127.0.0.1:" in errors[0], errors
    launcher, group = map(int, pids.read_text().split())
    deadline = time.monotonic() + 30
    while (_alive(launcher) or _alive(group)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(launcher) and not _alive(group)
    assert not (tmp_path / "run" / "policy").exists()  # the run ended at step 2, before its export
