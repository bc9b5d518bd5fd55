"""A run's folder under faults: a kill while a resume cuts the logs back leaves them whole, ``run.overwrite``
leaves the new run only, a second run in a folder still in use is one ``error:`` line, and a LoRA run that
would export over its own base is refused before anything is built."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "jsonargparse")
import agents.training.loggers as loggers  # noqa: E402
from agents.train import main  # noqa: E402
from agents.training.build import build_trainer  # noqa: E402
from agents.training.config import TrainConfig  # noqa: E402
from agents.training.run_lock import RunFolderBusy, lock_run_folder  # noqa: E402
from agents.training.trainer import Trainer  # noqa: E402
from tests.agents.training.test_run_reports import tiny_argv  # noqa: E402
from tests.agents.training.tiny import records, run, small_config  # noqa: E402
from tests.conftest import REPO_ROOT  # noqa: E402

#: A tiny run of one-layer model: four steps, stopped after three (a checkpoint at step 3), samples every step.
BASE = {"run.steps": 4, "eval.questions": 0, "model.tiny_layers": 1, "model.tiny_hidden": 32, "model.tiny_heads": 2,
        "run.sample_every": 1}


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stopped") / "run"
    run(small_config("grpo", folder, {**BASE, "run.stop_after": 3}))
    return folder


class Killed(BaseException):
    """Stands for a kill: nothing after it runs (a ``BaseException``, as no handler of the trainer catches it)."""


def _dies_on_second_record(monkeypatch) -> None:
    """The logger's ``json.dumps`` dies while it writes the second kept record (the middle of the cut-back)."""
    calls = []

    def dumps(value, *args, **kwargs):
        calls.append(value)
        if len(calls) == 2:
            raise Killed
        return json.dumps(value, *args, **kwargs)

    monkeypatch.setattr(loggers, "json", types.SimpleNamespace(dumps=dumps, loads=json.loads))


def _dies_before_the_rename(monkeypatch) -> None:
    """The cut-back log is written in full and synced, and the process dies before it replaces the log."""
    def fsync(fd):
        raise Killed

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.parametrize("fault", [_dies_on_second_record, _dies_before_the_rename])
def test_a_kill_while_a_resume_cuts_the_log_back_leaves_the_log_whole(stopped_run, tmp_path, monkeypatch, fault):
    folder = tmp_path / "run"
    shutil.copytree(stopped_run, folder)
    with open(folder / "metrics.jsonl", "a") as handle:  # a step logged after the checkpoint, before a kill
        handle.write(json.dumps({"step": 4, "reward": 0.5}) + "\n")
    metrics, samples = (folder / "metrics.jsonl").read_bytes(), (folder / "samples.jsonl").read_bytes()
    assert [r["step"] for r in records(folder / "metrics.jsonl")] == [1, 2, 3, 4]
    resumed = small_config("grpo", folder, {**BASE, "run.resume": True})
    trainer = build_trainer(resumed)
    with monkeypatch.context() as patch:
        fault(patch)
        with pytest.raises(Killed):
            trainer.train()
    trainer.close_environments()
    assert (folder / "metrics.jsonl").read_bytes() == metrics  # every record still there, none torn
    assert (folder / "samples.jsonl").read_bytes() == samples
    assert not list(folder.glob(".metrics.jsonl.*"))  # the unfinished copy is gone

    _, result = run(resumed)  # the next resume keeps the history and replaces the step past the checkpoint
    assert result.step == 4
    assert [r["step"] for r in records(folder / "metrics.jsonl")] == [1, 2, 3, 4]
    assert "rows" in records(folder / "metrics.jsonl")[-1]  # the step taken again, not the line past the checkpoint
    assert sorted({s["step"] for s in records(folder / "samples.jsonl")}) == [1, 2, 3, 4]


def test_a_torn_last_sample_is_dropped_at_resume(stopped_run, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(stopped_run, folder)
    with open(folder / "samples.jsonl", "a") as handle:
        handle.write('{"step": 4, "question": "wh')  # a kill mid-write
    _, result = run(small_config("grpo", folder, {**BASE, "run.resume": True}))
    assert result.step == 4 and "samples.jsonl: dropped a torn last line" in capsys.readouterr().err
    assert sorted({s["step"] for s in records(folder / "samples.jsonl")}) == [1, 2, 3, 4]


# -- run.overwrite ------------------------------------------------------------------------------------------
def test_overwrite_leaves_the_new_run_only_even_when_it_dies_early(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    run(small_config("grpo", folder, {**BASE, "run.steps": 1}))
    assert (folder / "policy").is_dir() and list((folder / "checkpoints").iterdir())
    (folder / "resume_log.jsonl").write_text('{"step": 1}\n')

    def dies(self):
        raise RuntimeError("the new run dies at its first step")

    monkeypatch.setattr(Trainer, "train_step", dies)
    with pytest.raises(RuntimeError, match="dies at its first step"):
        run(small_config("grpo", folder, {**BASE, "run.steps": 3, "run.overwrite": True}))
    left = sorted(p.name for p in folder.iterdir())
    assert left == ["config.json", "metrics.jsonl"], left  # nothing of the old run, and no lock of the dead one
    assert json.loads((folder / "config.json").read_text())["run"]["steps"] == 3
    assert (folder / "metrics.jsonl").read_text() == ""


# -- one run per folder -------------------------------------------------------------------------------------
def _holder(folder: Path) -> subprocess.Popen:
    """Another process that holds ``folder`` as a run does, until it is killed."""
    code = ("import sys, time; from agents.training.run_lock import lock_run_folder; lock_run_folder(sys.argv[1]); "
            "print('held', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(folder)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_run_in_a_folder_in_use_is_one_error_line(tmp_path, capsys):
    folder = tmp_path / "run"
    holder = _holder(folder)
    try:
        capsys.readouterr()
        assert main(tiny_argv(folder, "--run.steps", "1", "--eval.questions", "0")) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"error: run.output_dir {str(folder)!r} is in use by another run (process {holder.pid} holds ")
        assert not (folder / "metrics.jsonl").exists() and not (folder / "config.json").exists()
        with pytest.raises(RunFolderBusy, match="is in use by another run"):  # a run built in Python too
            run(small_config("grpo", folder, {**BASE, "run.steps": 1}))
    finally:
        holder.kill()
        holder.wait()
    # The lock went with its holder (killed, nothing released it): the folder is free, the file it left locks nothing.
    assert main(tiny_argv(folder, "--run.steps", "1", "--eval.questions", "0", "--model.tiny_layers", "1",
                          "--model.tiny_hidden", "32", "--model.tiny_heads", "2")) == 0
    assert not (folder / "run.lock").exists()  # the finished run removed its lock file as it let go
    with lock_run_folder(folder):  # and the finished run let go of it
        assert (folder / "run.lock").read_text() == f"{os.getpid()}\n"
    assert not (folder / "run.lock").exists()


def test_a_lock_file_removed_by_its_holder_after_it_was_opened_is_locked_anew(tmp_path, monkeypatch):
    import agents.training.run_lock as run_lock

    opened, real_open = [], os.open

    def open_then_holder_lets_go(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        if Path(path).name == "run.lock":
            if not opened:  # the holder removes the file between this open and the flock
                os.unlink(path)
            opened.append(fd)
        return fd

    monkeypatch.setattr(run_lock.os, "open", open_then_holder_lets_go)
    lock = lock_run_folder(tmp_path)
    monkeypatch.undo()
    with lock:
        assert len(opened) == 2 and (tmp_path / "run.lock").read_text() == f"{os.getpid()}\n"
        code = "import sys; from agents.training.run_lock import lock_run_folder; lock_run_folder(sys.argv[1])"
        busy = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        assert busy.returncode != 0 and f"process {os.getpid()} holds" in busy.stderr  # the file at the path is locked


def test_the_lock_is_re_entrant_within_a_process_and_let_go_by_the_last_holder(tmp_path):
    first = lock_run_folder(tmp_path)
    second = lock_run_folder(tmp_path)
    first.release()
    first.release()  # a second release of one hold does nothing
    code = "import sys; from agents.training.run_lock import lock_run_folder; lock_run_folder(sys.argv[1])"
    other = [sys.executable, "-c", code, str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    busy = subprocess.run(other, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert busy.returncode != 0 and f"process {os.getpid()} holds" in busy.stderr
    second.release()
    assert subprocess.run(other, cwd=REPO_ROOT, env=env, capture_output=True, text=True).returncode == 0


# -- a LoRA run on its own export ---------------------------------------------------------------------------
def test_a_lora_run_trained_on_its_own_policy_folder_is_refused_up_front(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "run"
    with pytest.raises(ValueError, match=r"is this run's own policy/ folder, which its export replaces"):
        TrainConfig().updated({"model.lora_rank": 4, "model.name": str(folder / "policy"), "run.output_dir": str(folder)})
    TrainConfig().updated({"model.lora_rank": 4, "model.name": str(tmp_path / "base"), "run.output_dir": str(folder)})
    TrainConfig().updated({"model.name": str(folder / "policy"), "run.output_dir": str(folder)})  # full weights: checkpointed
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)  # the same folder named relatively
    assert main(tiny_argv("run", "--model.lora_rank", "4", "--model.name", "run/../run/policy")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: model.name 'run/../run/policy' is this run's own policy/")
    assert not folder.exists()
