"""Resume is exact, or refused: a changed setting is refused in one line unless ``run.allow_changes``
names it (then it takes effect and is recorded), what a kill mid-save left is removed, a torn last
line of the metrics log is dropped, and a Ctrl-C during the first evaluation or the warm start stops
cleanly, with a checkpoint that resumes without redoing what was done - bit-identical to a run never
stopped."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.training.metric_keys import MACHINE_KEYS
from tests.conftest import REPO_ROOT, default_sigint_in_child, skip_without

skip_without("agents", "torch", "transformers", "jsonargparse", "matplotlib")
import torch  # noqa: E402

from agents.learners import ALGORITHMS  # noqa: E402
from agents.training.build import build_trainer  # noqa: E402
from agents.training.callbacks import Callback  # noqa: E402
from agents.training.checkpoint import load_checkpoint  # noqa: E402
from agents.training.config import TrainConfig  # noqa: E402
from agents.training.data import QuestionOrder  # noqa: E402
from agents.training.resume import free_settings  # noqa: E402
from agents.training.run_stages import run_start  # noqa: E402
from agents.training.run_state import START_PARTS, RunState  # noqa: E402
from agents.training.trainer import Trainer  # noqa: E402
from tests.agents.training.tiny import ProbedGRPO, records, run, small_config  # noqa: E402

#: The tiny run, two steps of which the first is done before each resume.
BASE = {"run.steps": 2, "eval.questions": 0, "model.tiny_layers": 1, "model.tiny_hidden": 32, "model.tiny_heads": 2}


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A tiny run stopped after its first of two steps."""
    folder = tmp_path_factory.mktemp("stopped") / "run"
    run(small_config("grpo", folder, {**BASE, "run.stop_after": 1}))
    return folder


def copy_of(stopped_run: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(stopped_run, folder)
    return folder


def resumed(folder: Path, changes: dict | None = None):
    return small_config("grpo", folder, {**BASE, "run.resume": True, **(changes or {})})


# -- changed settings ---------------------------------------------------------------------------
#: The settings a resume may change without being told, as the groups declare them.
FREE = {
    "run.steps", "run.stop_after", "run.save_every", "run.log_every", "run.progress", "run.resume", "run.report_to",
    "run.output_dir", "run.log_entropy", "run.allow_changes", "run.overwrite", "run.print_every", "run.sample_every",
    "run.warn_failed_searches", "warm_start.save_every", "warm_start.num_threads", "optim.max_skipped_updates", "eval.every",
    "eval.by_hops", "eval.periodic_sampled", "rollout.env_worker", "rollout.sync_check", "rollout.sync_tolerance",
    "run.gradient_checkpointing", "run.collective_timeout_s", "warm_start.export",
}



def test_the_free_settings_are_declared_at_their_fields_in_any_group(monkeypatch):
    assert free_settings(TrainConfig()) == FREE
    monkeypatch.setitem(ALGORITHMS, ProbedGRPO.name, ProbedGRPO)
    assert free_settings(TrainConfig(ProbedGRPO.name)) == FREE | {"algorithm.probe_every"}
    # A warm-up given as a share of the steps ties their number: run.steps is no longer free.
    assert free_settings(TrainConfig().updated({"optim.warmup_ratio": 0.1})) == FREE - {"run.steps"}


def test_a_changed_setting_is_refused_in_one_line_listing_each_difference(stopped_run, tmp_path):
    folder = copy_of(stopped_run, tmp_path)
    with pytest.raises(ValueError) as error:
        build_trainer(resumed(folder, {"optim.learning_rate": 5e-3, "algorithm.group_size": 4}))
    message = str(error.value)
    assert "\n" not in message
    assert "optim.learning_rate 0.001 -> 0.005" in message and "algorithm.group_size 2 -> 4" in message
    assert "run.allow_changes: [algorithm.group_size, optim.learning_rate]" in message
    assert not (folder / "resume_log.jsonl").exists()


def test_the_command_line_refuses_a_changed_seed_with_one_error_line(stopped_run, tmp_path, capsys):
    from agents.train import main

    folder = copy_of(stopped_run, tmp_path)
    capsys.readouterr()  # the run's own config.json (JSON is YAML) as the recipe, with another seed
    status = main(["--config", str(folder / "config.json"), "--run.output_dir", str(folder), "--run.resume", "true",
                   "--run.seed", "7"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: the resumed run's settings differ") and "run.seed 0 -> 7" in err


def test_free_settings_change_without_being_allowed(stopped_run, tmp_path):
    folder = copy_of(stopped_run, tmp_path)
    trainer, result = run(resumed(folder, {"run.steps": 3, "run.log_every": 2, "run.save_every": 1, "eval.every": 5,
                                           "rollout.env_worker": True}))
    assert result.step == 3
    logged = json.loads((folder / "resume_log.jsonl").read_text().splitlines()[0])
    assert logged["step"] == 1 and logged["allowed"] == [] and logged["changes"]["run.steps"] == [2, 3]


def test_a_warm_up_given_as_a_share_of_the_steps_ties_them(tmp_path):
    folder = tmp_path / "run"
    config = small_config("grpo", folder, {**BASE, "optim.warmup_ratio": 0.5, "run.stop_after": 1})
    run(config)
    with pytest.raises(ValueError, match=r"run.steps 2 -> 4"):
        build_trainer(config.updated({"run.resume": True, "run.steps": 4, "run.stop_after": None}))


def test_an_allowed_learning_rate_takes_effect_and_is_recorded(stopped_run, tmp_path):
    folder = copy_of(stopped_run, tmp_path)
    trainer, result = run(resumed(folder, {"optim.learning_rate": 5e-3, "run.allow_changes": ["optim.learning_rate"]}))
    assert result.step == 2
    assert [r["lr"] for r in records(result.metrics_path) if "stage" not in r] == [1e-3, 5e-3]
    assert trainer.backend.optimizer.param_groups[0]["initial_lr"] == 5e-3
    record = json.loads((folder / "resume_log.jsonl").read_text())
    assert record["step"] == 1 and record["allowed"] == ["optim.learning_rate"]
    assert record["changes"]["optim.learning_rate"] == [1e-3, 5e-3] and record["changes"]["run.resume"] == [False, True]
    assert json.loads((folder / "config.json").read_text())["optim"]["learning_rate"] == 5e-3
    # The next resume compares with the settings the run now has: the new rate needs no permission again.
    from agents.training.resume import settings_changes

    assert settings_changes(json.loads(load_checkpoint(folder / "checkpoint.pt")["config_json"]),
                            resumed(folder, {"optim.learning_rate": 5e-3})) == {
        "run.allow_changes": (["optim.learning_rate"], [])}


def test_a_whole_group_or_all_can_be_allowed_and_a_misspelt_name_is_refused(stopped_run, tmp_path):
    folder = copy_of(stopped_run, tmp_path)
    trainer = build_trainer(resumed(folder, {"optim.learning_rate": 2e-3, "optim.weight_decay": 0.1,
                                             "run.allow_changes": ["optim"]}))
    trainer.close_environments()
    group = trainer.backend.optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"]) == (2e-3, 0.1)  # not the optimiser state's saved settings
    with pytest.raises(ValueError, match=r"run.allow_changes names no setting: 'optim.lr' \(did you mean optim.l"):
        build_trainer(resumed(folder, {"optim.learning_rate": 2e-3, "run.allow_changes": ["optim.lr"]}))


# -- what a kill mid-save leaves ---------------------------------------------------------------
def test_a_resume_removes_what_a_kill_mid_save_left(tmp_path):
    config = small_config("grpo", tmp_path, {**BASE, "run.stop_after": 1})
    run(config)
    # What a kill (no cleanup runs) during a later save leaves: the trainer state's temporary file, and a
    # half-written step folder that checkpoint.pt does not name.
    (tmp_path / ".checkpoint.pt.k1ll3d.tmp").write_bytes(b"PK\x03\x04 half")
    (tmp_path / "checkpoints" / "step-2").mkdir()
    (tmp_path / "checkpoints" / "step-2" / ".backend.pt.x.tmp").write_bytes(b"half")
    trainer = build_trainer(config.updated({"run.resume": True}))
    trainer.close_environments()
    assert trainer.step == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-1"]


# -- a torn metrics log -------------------------------------------------------------------------
def test_a_torn_last_line_of_the_log_is_dropped_with_one_line(stopped_run, tmp_path, capsys):
    folder = copy_of(stopped_run, tmp_path)
    whole = (folder / "metrics.jsonl").read_text()
    with open(folder / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 2, "reward": 0.')  # a kill mid-write
    capsys.readouterr()
    _, result = run(resumed(folder))
    err = [line for line in capsys.readouterr().err.splitlines() if "torn" in line or "Traceback" in line]
    assert err == [f"{folder / 'metrics.jsonl'}: dropped a torn last line (24 bytes, a write cut short)"]
    assert result.step == 2
    assert (folder / "metrics.jsonl").read_text().startswith(whole)
    assert [r["step"] for r in records(result.metrics_path)] == [1, 2]


def test_a_damaged_line_before_the_last_is_refused(stopped_run, tmp_path):
    folder = copy_of(stopped_run, tmp_path)
    lines = (folder / "metrics.jsonl").read_text()
    (folder / "metrics.jsonl").write_text("{not json\n" + lines)
    with pytest.raises(ValueError, match=r"metrics.jsonl line 1 is not a JSON record"):
        build_trainer(resumed(folder))


# -- Ctrl-C during the start --------------------------------------------------------------------
class StartSteps:
    """The trainer's steps that :func:`run_start` calls, as stand-ins that write down what ran; the one
    named ``interrupted`` is cut short by a Ctrl-C. A checkpoint is a copy of the run's state."""

    def __init__(self, state: RunState, interrupted: str | None = None) -> None:
        self.state, self.interrupted, self.ran, self.checkpoint = state, interrupted, [], None

    def _run(self, name: str) -> None:
        self.ran.append(name)
        if name == self.interrupted:
            raise KeyboardInterrupt

    def _warm_start(self) -> dict[str, float]:
        self._run("warm start")
        return {"warm_start/steps": 5.0}

    def _save(self) -> None:
        self.ran.append("save")
        self.checkpoint = self.state.state_dict()

    def _back(self) -> None:
        self.ran.append("back to the checkpoint")
        self.state.load_state_dict(self.checkpoint)

    def start(self, warm: bool) -> bool:
        return run_start(self.state, warm=warm, evaluate=lambda stage, extra: self._run(f"evaluate {stage}"),
                         warm_start=self._warm_start, save=self._save, back_to_checkpoint=self._back)


WHOLE_START = ["evaluate start", "save", "warm start", "save", "evaluate warm start"]


@pytest.mark.parametrize("interrupted, ran, done, then, resumed", [
    (None, WHOLE_START, START_PARTS, None, []),
    ("evaluate start", WHOLE_START[:1], (), "stopped during the start evaluation; --run.resume true runs it again", WHOLE_START),
    ("warm start", [*WHOLE_START[:3], "back to the checkpoint"], ("start",),
     "stopped during the warm start; --run.resume true starts the warm start again", WHOLE_START[1:]),
    ("evaluate warm start", [*WHOLE_START, "back to the checkpoint"], ("start", "warm start"),
     "stopped during the evaluation after the warm start; --run.resume true goes on from the warm-started policy",
     ["evaluate warm start"]),
])
def test_the_start_runs_its_parts_in_order_and_a_ctrl_c_goes_back_to_the_last_checkpoint(capsys, interrupted, ran, done, then,
                                                                                          resumed):
    state = RunState(QuestionOrder(10, seed=0))
    steps = StartSteps(state, interrupted)
    capsys.readouterr()
    assert steps.start(warm=True) == (interrupted is not None)
    assert steps.ran == ran and state.start_done == set(done)
    # The warm start's statistics are kept until the evaluation after it logs them.
    assert state.warm_start_stats == ({"warm_start/steps": 5.0} if interrupted == "evaluate warm start" else None)
    assert [line for line in capsys.readouterr().err.splitlines() if line] == ([then] if then else [])
    again = StartSteps(state)  # the resume: what is left, and no more
    assert again.start(warm=True) is False and again.ran == resumed and state.start_done == set(START_PARTS)


def test_a_start_without_a_warm_start_evaluates_once_and_a_step_ends_it():
    state = RunState(QuestionOrder(10, seed=0))
    steps = StartSteps(state)
    assert steps.start(warm=False) is False and steps.ran == ["evaluate start"]
    assert state.start_done == set(START_PARTS)
    fresh = RunState(QuestionOrder(10, seed=0))
    fresh.advance()  # a step taken outside train(): the start is behind it
    assert fresh.step == 1 and fresh.start_left() == []


WARM = {"run.steps": 1, "eval.questions": 2, "warm_start.steps": 5, "warm_start.examples": 4,
        "warm_start.batch_size": 2, "warm_start.learning_rate": 1e-2, "warm_start.save_every": 2}


class CtrlCAt(Callback):
    """Sends the process a real SIGINT when the evaluation of ``stage`` starts."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def on_evaluation_start(self, trainer, stage):
        if stage == self.stage:
            signal.raise_signal(signal.SIGINT)


def weights(trainer) -> dict[str, torch.Tensor]:
    out = {f"policy.{k}": v for k, v in trainer.policy.state_dict().items()}
    out.update({f"reference.{k}": v for k, v in trainer.backend.reference.state_dict().items()})
    return out


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory):
    trainer, result = run(small_config("grpo", tmp_path_factory.mktemp("whole"), WARM))
    return weights(trainer), result


@pytest.mark.parametrize("where", ["start", "warm start", "in the warm start", "late in the warm start"])
def test_ctrl_c_during_the_start_stops_cleanly_and_resumes_bit_identically(default_sigint, tmp_path, capsys, monkeypatch, never_stopped,
                                                                          where):
    """A Ctrl-C before, during and after the warm start (of 5 steps, checkpointed every 2): the resumed
    run's weights, evaluations and warm-start statistics are the uninterrupted run's. Stopped in its
    second step, the warm start starts again; stopped in its fourth, it goes on from its step-2 checkpoint."""
    config = small_config("grpo", tmp_path, WARM)
    trainer = build_trainer(config, callbacks=[CtrlCAt(where)] if where in ("start", "warm start") else [])
    if where.endswith("in the warm start"):  # a Ctrl-C in the middle of the warm start's 2nd (4th) optimiser step
        step, calls = trainer.backend.step, []
        at = 2 if where == "in the warm start" else 4

        def interrupted_step():
            calls.append(1)
            if len(calls) == at:
                signal.raise_signal(signal.SIGINT)
            return step()

        monkeypatch.setattr(trainer.backend, "step", interrupted_step)
    capsys.readouterr()
    try:
        stopped = trainer.train()
    except KeyboardInterrupt:
        pytest.fail("the Ctrl-C escaped Trainer.train as a KeyboardInterrupt (a traceback on the command line)")
    finally:
        trainer.close_environments()
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("stopp", "Traceback"))]
    part = {"start": "the start evaluation", "warm start": "the evaluation after the warm start",
            "in the warm start": "the warm start", "late in the warm start": "the warm start"}[where]
    then = {"in the warm start": "starts the warm start again", "late in the warm start": "goes on from warm-start step 2"}
    assert len(err) == 1 and err[0].startswith(f"stopped during {part}; --run.resume true {then.get(where, '')}")
    assert stopped.step == 0 and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    saved = load_checkpoint(stopped.checkpoint_path)
    assert saved["start_done"] == {"start": [], "warm start": ["start", "warm start"]}.get(where, ["start"])
    assert (saved["warm_start_progress"] is not None) == (where == "late in the warm start")

    warm_starts = []
    real = Trainer._warm_start

    def counted(self):
        warm_starts.append(0 if self.state.warm_start_progress is None else self.state.warm_start_progress.step)
        return real(self)

    monkeypatch.setattr(Trainer, "_warm_start", counted)
    trainer, result = run(config.updated({"run.resume": True}))
    # a finished warm start is never redone; a checkpointed one goes on from its step
    assert warm_starts == {"start": [0], "warm start": [], "in the warm start": [0], "late in the warm start": [2]}[where]
    logged = records(result.metrics_path)
    stages = [r.get("stage") for r in logged]
    assert stages.count("start") == 1 and stages.count("warm start") == 1 and result.step == 1
    expected, _ = never_stopped
    got = weights(trainer)
    assert expected.keys() == got.keys()
    for key, value in expected.items():
        assert torch.equal(value, got[key]), key
    assert result.evaluations == never_stopped[1].evaluations

    def warm_results(logged: list[dict]) -> dict:
        """The warm start's logged results, without what it measured of the machine."""
        return {k: v for r in logged if r.get("stage") == "warm start" for k, v in r.items()
                if k.startswith("warm_start/") and not k.startswith(MACHINE_KEYS)}

    warm, expected_warm = warm_results(logged), warm_results(records(never_stopped[1].metrics_path))
    assert warm == expected_warm and warm["warm_start/steps"] == 5


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_a_stopped_command_goes_on_from_its_last_warm_start_checkpoint(tmp_path, monkeypatch, signum):
    """A real process, a real Ctrl-C (or kill -9) once a checkpoint within its warm start is written
    (every 50 steps): a Ctrl-C exits with status 3 (stopped early) and one line saying from which warm-start step the
    resume goes on, no traceback; either way the checkpoint holds that step and the resume keeps the start
    evaluation and goes on from there."""
    folder = tmp_path / "run"
    flags = ["--run.steps", "1", "--rollout.questions_per_step", "2", "--algorithm.group_size", "2",
             "--env.max_new_tokens", "16", "--data.world_size", "30", "--eval.questions", "2", "--run.report_to", "[]",
             "--run.progress", "false", "--model.tiny_layers", "1", "--model.tiny_hidden", "32", "--model.tiny_heads", "2",
             "--warm_start.steps", "100000", "--warm_start.examples", "4", "--warm_start.batch_size", "2",
             "--warm_start.save_every", "50", "--run.output_dir", str(folder)]
    process = subprocess.Popen([sys.executable, "-m", "agents.train", *flags], cwd=REPO_ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint_in_child)

    def warm_start_checkpointed() -> bool:
        try:
            return load_checkpoint(folder / "checkpoint.pt")["warm_start_progress"] is not None
        except (FileNotFoundError, ValueError):  # not written yet
            return False

    try:
        deadline = time.monotonic() + 150  # a guard against a hung process, not a verdict
        while not warm_start_checkpointed():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no checkpoint within the warm start"
            time.sleep(0.1)
        process.send_signal(signum)
        out, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    state = load_checkpoint(folder / "checkpoint.pt")
    assert state["step"] == 0 and state["start_done"] == ["start"]
    at = state["warm_start_progress"]["step"]
    assert at >= 50 and at % 50 == 0 and len(state["warm_start_progress"]["losses"]) == at
    if signum == signal.SIGINT:
        assert process.returncode == 3, err
        assert "Traceback" not in err
        lines = [line for line in err.splitlines() if line.startswith(("stopp", "Traceback"))]
        assert lines == [f"stopped during the warm start; --run.resume true goes on from warm-start step {at}"], err
        assert "grpo: 0 of 1 steps" in out
    else:
        assert process.returncode == -signal.SIGKILL

    from agents.train import parse_config

    warm_starts = []
    monkeypatch.setattr(Trainer, "_warm_start", lambda self: warm_starts.append(self.state.warm_start_progress.step) or {"warm_start/steps": 0.0})
    _, result = run(parse_config([*flags, "--run.resume", "true"]))
    assert warm_starts == [at] and result.step == 1
    assert [r.get("stage") for r in records(result.metrics_path)].count("start") == 1  # not evaluated again
