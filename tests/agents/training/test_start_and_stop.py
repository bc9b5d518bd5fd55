"""What a user sees at a run's start and end: the device it trains on (``run.device: auto``) and the warnings
for an idle GPU, retrieval servers and a shared output folder checked before training, ``--smoke``
shrinking a recipe, Ctrl-C giving exit status 3 without naming a policy never written, ``--help`` without
Sphinx markup, and a curve that plots whatever the run evaluated."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tests.conftest import REPO_ROOT, default_sigint_in_child, skip_without

skip_without("agents", "torch", "transformers", "jsonargparse", "matplotlib")
import torch  # noqa: E402

from agents.train import main, parse_config, plain_text  # noqa: E402
from agents.training import devices  # noqa: E402
from agents.training.config import RunConfig, TrainConfig  # noqa: E402
from agents.training.devices import device_line, device_warnings, resolve_device  # noqa: E402
from agents.training.loggers import draw_curve, em_keys, read_metrics  # noqa: E402
from agents.training.run_checks import check_device  # noqa: E402
from agents.training.run_reach import SHARED_MARKER, check_retrieval_servers, check_shared_output  # noqa: E402
from agents.training.smoke import SMOKE_CAPS, smoke_changes  # noqa: E402
from tests.agents.training.test_run_reports import tiny_argv  # noqa: E402
from tests.agents.training.tiny import run, small_config  # noqa: E402


# -- run.device ---------------------------------------------------------------------------------------
def cuda_here(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_auto_is_the_cpu_without_cuda_and_the_ranks_gpu_with_it(monkeypatch):
    assert RunConfig().device == "auto"
    cuda_here(monkeypatch, 0)
    assert resolve_device("auto") == "cpu" and resolve_device("cuda:1") == "cuda:1"
    cuda_here(monkeypatch, 4)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert resolve_device("auto") == "cuda:0"
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device("auto") == "cuda:3"
    cuda_here(monkeypatch, 1)  # each rank sees its own GPU only (CUDA_VISIBLE_DEVICES per rank)
    assert resolve_device("auto") == "cuda:0"


def test_auto_passes_the_device_check_and_is_stored_as_given(tmp_path):
    check_device("auto")
    with pytest.raises(ValueError, match="is not a torch device"):
        RunConfig(device="gpu")
    trainer, result = run(small_config("grpo", tmp_path, {"run.steps": 1, "eval.questions": 0}))
    assert json.loads((tmp_path / "config.json").read_text())["run"]["device"] == "auto"
    assert trainer.backend.device == torch.device("cpu")  # this machine has no CUDA
    resumed, again = run(small_config("grpo", tmp_path, {"run.steps": 2, "eval.questions": 0, "run.resume": True}))
    assert again.step == 2  # the saved "auto" compares equal to the resumed run's


def test_warnings_for_an_idle_gpu(monkeypatch):
    cuda_here(monkeypatch, 0)
    monkeypatch.setattr(devices, "has_nvidia_gpu", lambda: False)
    assert device_warnings("auto") == [] and device_warnings("cpu") == []
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(devices, "has_nvidia_gpu", lambda: True)  # a GPU, and a CPU-only torch build
    (line,) = device_warnings("auto")
    assert line.startswith("warning: this machine has an NVIDIA GPU but PyTorch is a CPU-only build")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    cuda_here(monkeypatch, 1)
    assert device_warnings("auto") == []
    (line,) = device_warnings("cpu")
    assert line == "warning: run.device 'cpu' trains on the CPU although CUDA is available (--run.device auto uses the GPU)"


def test_the_first_line_names_device_and_precision(tmp_path, capsys):
    cpu = torch.device("cpu")
    assert device_line(RunConfig(), cpu) == "run.device auto: training on cpu, dtype fp32 (run.dtype auto), backend torch"
    assert device_line(RunConfig(device="cpu", dtype="bf16", backend="fsdp"), cpu, 2) == (
        "training on cpu, dtype bf16 (run.dtype bf16), backend fsdp, 2 ranks (each its own device)")
    assert main(tiny_argv(tmp_path, "--run.steps", "1", "--eval.questions", "0")) == 0
    err = capsys.readouterr().err
    assert err.splitlines()[0] == device_line(RunConfig(), cpu)
    assert "Setting accelerator to CPU" not in err  # DeepSpeed's notice, imported by accelerate at the export


# -- reaching the retrieval servers and one output folder ---------------------------------------------
class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = json.dumps({"status": "ok" if self.status == 200 else "building"}).encode()
        self.send_response(self.status if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    servers = []

    def start(status: int) -> str:
        handler = type("Handler", (_Health,), {"status": status})
        server = HTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/retrieve"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_retrieval_server_that_is_not_ready_ends_the_run_at_start(health_server, tmp_path, capsys):
    ready, building = health_server(200), health_server(503)
    check_retrieval_servers(ready)
    check_retrieval_servers(f"{building},{ready}")  # one ready replica is enough
    with pytest.raises(ValueError, match=r"^data.retrieval_url: no retrieval server is ready: http://127\.0\.0\.1:\d+/health "
                                         r"answered HTTP 503 \(building\); http://127\.0\.0\.1:9/health is unreachable"):
        check_retrieval_servers(f"{building},http://127.0.0.1:9/retrieve")
    dataset = tmp_path / "qa.jsonl"
    dataset.write_text(json.dumps({"question": "q?", "golden_answers": ["a"]}) + "\n")
    argv = ["--model.name", "tiny", "--data.dataset", str(dataset), "--data.retrieval_url", "http://127.0.0.1:9/retrieve",
            "--run.output_dir", str(tmp_path / "run")]
    assert main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("error", "Traceback"))]
    assert len(errors) == 1 and errors[0].startswith("error: data.retrieval_url: no retrieval server is ready")


class _Rank:
    """One rank of two as :func:`check_shared_output` sees it; rank 0's token and the ranks' answers given."""

    world_size = 2

    def __init__(self, rank: int, token: str, seen_by_other: bool) -> None:
        self.rank, self.token, self.seen_by_other = rank, token, seen_by_other

    def broadcast_object(self, obj):
        return obj if self.rank == 0 else self.token

    def barrier(self):
        pass

    def all_gather_object(self, seen):
        return [seen, self.seen_by_other] if self.rank == 0 else [self.seen_by_other, seen]


def test_a_rank_that_does_not_see_the_output_folder_fails_the_run(tmp_path):
    shared, elsewhere = tmp_path / "shared", tmp_path / "elsewhere"
    shared.mkdir(), elsewhere.mkdir()
    (shared / SHARED_MARKER).write_text("t0k3n")  # what rank 0 wrote
    check_shared_output(shared, _Rank(1, "t0k3n", seen_by_other=True))
    with pytest.raises(ValueError, match=r"^run.output_dir '.*elsewhere' is not the same folder on every rank: rank\(s\) 1 do not"):
        check_shared_output(elsewhere, _Rank(1, "t0k3n", seen_by_other=True))
    with pytest.raises(ValueError, match=r"rank\(s\) 1 do not see"):  # rank 0 hears it from rank 1, and removes its marker
        check_shared_output(shared, _Rank(0, "", seen_by_other=False))
    assert not (shared / SHARED_MARKER).exists()


@pytest.mark.slow
def test_two_gloo_ranks_in_different_folders_fail_at_start(tmp_path):
    """Two real ranks (torchrun, gloo, :mod:`tests.agents.training.shared_folder_rank`): one folder passes,
    a folder per rank fails on both ranks."""
    from tests.agents.training.torchrun import free_port, rank_env

    outputs = {}
    for mode in ("shared", "apart"):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                   "--master_port", str(free_port()), "-m", "tests.agents.training.shared_folder_rank", str(tmp_path / "out"), mode,
                   str(tmp_path / mode)]
        done = subprocess.run(command, cwd=REPO_ROOT, env=rank_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        outputs[mode] = [(tmp_path / mode / f"rank{rank}.txt").read_text(encoding="utf-8") for rank in (0, 1)]
    assert outputs["shared"] == ["ok", "ok"]
    assert len(outputs["apart"]) == 2 and all("rank(s) 1 do not see" in line for line in outputs["apart"])


# -- --smoke ------------------------------------------------------------------------------------------
RECIPE = str(REPO_ROOT / "agents" / "configs" / "search-r1-grpo.yaml")


def test_smoke_caps_the_recipes_size_and_keeps_the_rest():
    full = parse_config(["--config", RECIPE, "--model.name", "tiny"])
    smoke = parse_config(["--config", RECIPE, "--model.name", "tiny", "--smoke"])
    assert (smoke.run.steps, smoke.rollout.questions_per_step, smoke.algorithm.group_size, smoke.env.max_new_tokens,
            smoke.optim.mini_batch_size, smoke.eval.questions) == (2, 2, 2, 64, 4, 4)
    assert smoke.warm_start == full.warm_start  # the recipe has no warm start: none is added
    changed = {f"{group}.{name}" for group in full.as_dict() if isinstance(full.as_dict()[group], dict)
               for name, value in full.as_dict()[group].items() if smoke.as_dict()[group][name] != value}
    assert changed == {"run.steps", "rollout.questions_per_step", "algorithm.group_size", "env.max_new_tokens",
                       "optim.mini_batch_size", "eval.questions"}
    demo = parse_config(["--config", str(REPO_ROOT / "agents" / "configs" / "demo.yaml")])
    assert smoke_changes(demo)["warm_start.steps"] == SMOKE_CAPS["warm_start.steps"]
    assert smoke_changes(demo)["warm_start.copy_steps"] == SMOKE_CAPS["warm_start.copy_steps"]
    small = TrainConfig("grpo").updated({"run.steps": 1, "eval.questions": 0})
    assert "run.steps" not in smoke_changes(small) and "eval.questions" not in smoke_changes(small)  # never raised


def test_a_smoke_run_of_a_seed_recipe_trains_and_says_what_it_changed(tmp_path, capsys):
    assert main(["--config", RECIPE, "--model.name", "tiny", "--smoke", "--run.output_dir", str(tmp_path),
                 "--run.report_to", "[]"]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines()[0] == (
        "smoke run (the recipe's other settings kept): run.steps 1005->2, rollout.questions_per_step 512->2, "
        "algorithm.group_size 5->2, env.max_new_tokens 2500->64, optim.mini_batch_size 256->4, eval.questions 64->4")
    assert "grpo: 2 of 2 steps" in captured.out and (tmp_path / "policy").is_dir()
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["run"]["steps"] == 2 and saved["optim"]["learning_rate"] == 1e-6 and saved["algorithm"]["kl_coef"] == 0.001


# -- Ctrl-C -------------------------------------------------------------------------------------------
def interrupted_command(tmp_path, point: str, *flags: str) -> subprocess.CompletedProcess:
    """``agents.train`` of the tiny run that sends itself a real SIGINT at ``point``
    (:mod:`tests.agents.training.interrupt_at`)."""
    env = {**os.environ, "SEARCHQA_TEST_SIGINT_AT": point, "SEARCHQA_PROGRESS": "0"}
    argv = [sys.executable, "-m", "agents.train", "--import", "tests.agents.training.interrupt_at",
            *tiny_argv(tmp_path / "run", "--eval.questions", "0", *flags)]
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=default_sigint_in_child)


def test_ctrl_c_during_training_exits_3_and_names_no_policy(tmp_path):
    done = interrupted_command(tmp_path, "step")
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    assert "grpo: 1 of 2 steps" in done.stdout
    assert "policy:      not exported before step 2 (--run.resume true continues the run)" in done.stdout
    assert "stopped early at step 1 of 2: --run.resume true goes on from the checkpoint" in done.stdout
    assert not (tmp_path / "run" / "policy").exists() and (tmp_path / "run" / "checkpoint.pt").exists()


def test_ctrl_c_while_the_model_loads_is_one_line(tmp_path):
    done = interrupted_command(tmp_path, "load")
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.splitlines()[-1] == "stopped while the run was being set up: nothing trained"


def test_a_finished_run_exits_0_and_names_its_policy(tmp_path, capsys):
    assert main(tiny_argv(tmp_path, "--eval.questions", "0")) == 0
    out = capsys.readouterr().out
    assert f"policy:      {tmp_path / 'policy'}" in out and "stopped early" not in out


# -- --help -------------------------------------------------------------------------------------------
def test_plain_text_drops_sphinx_markup():
    assert plain_text("see :class:`~agents.training.health.TrainingFailed` and :mod:`agents.training`") == \
        "see TrainingFailed and agents.training"
    assert plain_text("``rollout.engine: hf`` (:func:`load <agents.policies.loading.load_policy>`)") == "rollout.engine: hf (load)"


@pytest.mark.parametrize("flags", [[], ["--algo", "ppo"], ["--run.backend", "deepspeed"], ["--rollout.engine", "vllm"]])
def test_help_has_no_sphinx_markup_and_whole_group_titles(flags):
    done = subprocess.run([sys.executable, "-m", "agents.train", *flags, "--help"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for markup in ("``", ":class:", ":mod:", ":func:", ":meth:", ":attr:"):
        assert markup not in done.stdout, markup
    titles = [line for line in done.stdout.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert "How a training step's episodes are played (the number of samples per question is the algorithm's group_size):" in titles
    assert not [title for title in titles if title.endswith(("the:", "a:", "of:", ",:"))], titles


# -- the curve ----------------------------------------------------------------------------------------
def test_every_panel_of_a_by_hops_curve_has_data(tmp_path):
    """A demo-like run (evaluated by hop count, every step): the reward panel and the EM panel both draw,
    the EM panel a line per mode and hop count, each with a point per evaluation."""
    config = small_config("grpo", tmp_path, {"eval.by_hops": True, "eval.every": 1, "eval.questions": 4,
                                             "eval.periodic_sampled": False, "data.world_max_hops": 2, "run.steps": 2})
    run(config)
    records = read_metrics(tmp_path / "metrics.jsonl")
    keys = em_keys(records)
    assert {"eval/greedy/1-hop/em", "eval/greedy/2-hop/em", "eval/sampled/1-hop/em", "eval/sampled/2-hop/em"} <= set(keys)
    figure = draw_curve(records)
    reward_panel, em_panel = figure.axes
    assert [line.get_label() for line in reward_panel.lines] == ["train reward (mean)"]
    assert len(reward_panel.lines[0].get_xdata()) == 2
    labels = {line.get_label(): len(line.get_xdata()) for line in em_panel.lines}
    assert labels["held-out EM, greedy 1-hop"] == 3 and labels["held-out EM, greedy 2-hop"] == 3  # start, step 1, final
    assert labels["held-out EM, sampled 1-hop"] == 2  # start and final
    assert all(count > 0 for count in labels.values()) and len(labels) == len(keys)
    assert (tmp_path / "curve.png").stat().st_size > 0


# -- other libraries' console noise -------------------------------------------------------------------
def test_deepspeeds_cpu_notice_and_the_collectives_deprecation_are_filtered_narrowly():
    import logging
    import warnings

    from agents.training.library_noise import hide_deepspeed_cpu_notice, ignore_deprecated_collective_warnings

    logger, seen = logging.getLogger("DeepSpeed"), []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    try:
        hide_deepspeed_cpu_notice()
        hide_deepspeed_cpu_notice()  # once is enough: no second filter
        logger.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.")
        logger.warning("Setting ds_accelerator to cuda (auto detect)")
    finally:
        logger.removeHandler(handler)
    assert seen == ["Setting ds_accelerator to cuda (auto detect)"] and len(logger.filters) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ignore_deprecated_collective_warnings()
        import torch.distributed.c10d_logger as c10d_logger

        for message, category in (("`torch.distributed.all_gather_into_tensor` is deprecated. Please use x", FutureWarning),
                                  ("`torch.distributed.reduce_scatter_tensor` is deprecated.", FutureWarning)):
            warnings.warn_explicit(message, category, c10d_logger.__file__, 83, module="torch.distributed.c10d_logger")
    assert [str(w.message) for w in caught] == ["`torch.distributed.reduce_scatter_tensor` is deprecated."]


@pytest.mark.slow
def test_a_two_rank_deepspeed_run_prints_the_device_line_and_no_library_noise(tmp_path):
    skip_without("deepspeed")
    from tests.agents.training.torchrun import TINY_RUN, torchrun

    done = torchrun(2, "-m", "agents.train", "--run.backend", "deepspeed", *TINY_RUN, "--run.output_dir", str(tmp_path / "run"))
    assert done.stderr.splitlines()[0] == ("run.device auto: training on cpu, dtype fp32 (run.dtype auto), backend deepspeed, "
                                           "2 ranks (each its own device)")
    assert "Setting accelerator to CPU" not in done.stderr and "FutureWarning" not in done.stderr, done.stderr
