"""A training run never lies and never strands anything: skipped updates are counted and stop a diverged
run, failed searches and runs that never search are logged and said, progress and evaluations are printed off a terminal, episodes
are sampled as text, an earlier run is never overwritten by accident, and bad settings or output folders
are one ``error:`` line before any model is built."""
from __future__ import annotations

import json
import math

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "jsonargparse", "matplotlib")
from agents.scripted.agents import NoSearchAgent, RetrieveThenAnswerAgent  # noqa: E402
from tests.agents.training.scripted_engine import ScriptedEngine  # noqa: E402
from agents.train import main  # noqa: E402
from agents.training.build import build_trainer, env_options  # noqa: E402
from agents.training.config import TrainConfig  # noqa: E402
from agents.training.data import split_data  # noqa: E402
from agents.training.health import NoSearchWarning, TrainingDiverged, episodes_without_search  # noqa: E402
from agents.training.run_checks import recipe_warnings  # noqa: E402
from agents.training.run_files import SAMPLES_FILE  # noqa: E402
from agents.training.samples import MAX_TEXT_CHARS, _cut  # noqa: E402
from agents.training.trainer import Trainer  # noqa: E402
from search_env import BatchSearchQAEnv  # noqa: E402
from search_env.sources.base import Source, SourceError  # noqa: E402
from tests.agents.training.tiny import TINY, records, run, small_config  # noqa: E402

#: A learning rate that sends the weights to infinity at the first update: every later gradient is NaN.
HUGE_LR = {"optim.learning_rate": 1e30, "run.steps": 4, "eval.questions": 0}


def tiny_argv(output_dir, *more: str) -> list[str]:
    """The command line of the tiny run (:data:`TINY`) writing to ``output_dir``."""
    argv = []
    for key, value in TINY.items():
        argv += [f"--{key}", json.dumps(value) if isinstance(value, (list, bool)) else str(value)]
    return [*argv, "--run.output_dir", str(output_dir), *more]


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


# -- skipped updates ----------------------------------------------------------------------------------
def test_a_diverged_run_stops_after_max_skipped_updates(tmp_path):
    # 4 optimiser updates a step (2 passes x 2 mini-batches): the first applies, the next three are NaN.
    with pytest.raises(TrainingDiverged, match=r"^step 1: 3 optimiser updates in a row had a non-finite gradient norm"):
        run(small_config("grpo", tmp_path, HUGE_LR))
    (logged,) = records(tmp_path / "metrics.jsonl")
    assert logged["step"] == 1 and logged["updates/applied"] == 1 and logged["updates/skipped"] == 3


def test_skipped_updates_are_logged_warned_once_and_reported(tmp_path, capsys):
    trainer, result = run(small_config("grpo", tmp_path, {**HUGE_LR, "optim.max_skipped_updates": 100}))
    steps = records(result.metrics_path)
    assert [(r["updates/applied"], r["updates/skipped"]) for r in steps] == [(1, 3), (0, 4), (0, 4), (0, 4)]
    warned = warnings_in(capsys.readouterr().err)  # besides that the policy, its weights not finite, never searches
    assert [line for line in warned if "no episode searched" not in line] == warned[:1]
    assert warned[0].startswith("warning: step 1: 3 optimiser update(s) skipped")
    assert (result.steps_run, result.updated_steps, result.skipped_updates) == (4, 1, 15)
    assert result.report().splitlines()[1] == (
        "updated the policy at 1 of the 4 steps this invocation took (15 optimiser updates skipped: non-finite gradient norm)")


def test_a_healthy_run_reports_every_step_updated(tmp_path):
    _, result = run(small_config("grpo", tmp_path, {"eval.questions": 0}))
    assert all(r["updates/skipped"] == 0 and r["updates/applied"] == 4 for r in records(result.metrics_path))
    assert result.report().splitlines()[1] == "updated the policy at 2 of the 2 steps this invocation took"


def test_the_command_line_turns_a_diverged_run_into_one_error_line(tmp_path, capsys):
    status = main(tiny_argv(tmp_path, "--optim.learning_rate", "1e30", "--eval.questions", "0"))
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert status == 1 and captured.out == ""
    assert len(errors) == 1 and errors[0].startswith("error: step 1: 3 optimiser updates in a row")
    assert "Traceback" not in captured.err


# -- config checks --------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags, expected", [
    (["--optim.update_epochs", "0"], "error: optim.update_epochs must be >= 1, got 0"),
    (["--run.device", "cuda:99"], "error: run.device 'cuda:99': "),
    (["--run.device", "gpu"], "error: run.device 'gpu' is not a torch device"),
    (["--optim.max_skipped_updates", "0"], "error: optim.max_skipped_updates must be >= 1, got 0"),
    (["--run.print_every", "-1"], "error: run.print_every must be >= 0, got -1"),
    (["--run.warn_failed_searches", "1.5"], "error: run.warn_failed_searches must be in [0, 1], got 1.5"),
])
def test_bad_settings_are_one_error_line_before_any_model_is_built(tmp_path, capsys, monkeypatch, flags, expected):
    import agents.training.build as build

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(build, "load_policy", no_model)
    assert main(tiny_argv(tmp_path / "run", *flags)) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith(expected), captured.err


@pytest.mark.parametrize("change", [{"rollout.temperature": math.inf}, {"optim.learning_rate": math.inf},
                                    {"optim.max_grad_norm": math.nan}, {"warm_start.learning_rate": math.inf}])
def test_non_finite_rates_are_refused_by_the_config(change):
    (key,) = change
    with pytest.raises(ValueError, match=rf"^{key} must be a finite number"):
        TrainConfig().updated(change)


# -- failed searches ------------------------------------------------------------------------------------
class DownSource(Source):
    """A retrieval source whose server is down: every call fails, or (``timeout``) runs out of time."""

    def __init__(self, name: str, timeout: bool = False) -> None:
        self.name, self.timeout = name, timeout

    def search(self, queries, k):
        if self.timeout:
            raise SourceError(f"source {self.name!r} timed out after 5 s ({len(queries)} queries)")
        raise SourceError("connection refused")


def trainer_on_down_source(config: TrainConfig, timeout: bool = False) -> Trainer:
    """The run's trainer with a scripted agent that searches once per episode, on sources that fail (its
    held-out evaluation too, with ``eval.questions``)."""
    (examples, sources), held_out = split_data(config)
    built = build_trainer(config)
    built.close_environments()
    options = env_options(config, built.policy.codec)
    env = BatchSearchQAEnv(built.env.num_envs, dataset=examples, sources={name: DownSource(name, timeout) for name in sources},
                           **options)
    eval_env, eval_questions = None, []
    if held_out is not None:
        eval_env = BatchSearchQAEnv(built.env.num_envs, dataset=held_out[0],
                                    sources={name: DownSource(name, timeout) for name in held_out[1]}, **options)
        eval_questions = list(range(min(config.eval.questions, len(held_out[0]))))
    return Trainer(config, built.policy, env, built.algorithm, built.backend, engine=ScriptedEngine(RetrieveThenAnswerAgent),
                   eval_env=eval_env, eval_questions=eval_questions)


@pytest.mark.parametrize("timeout", [False, True])
def test_failed_searches_are_logged_and_warned(tmp_path, capsys, timeout):
    config = small_config("grpo", tmp_path, {"run.steps": 3, "eval.questions": 0, "env.max_new_tokens": 200})
    trainer = trainer_on_down_source(config, timeout)
    try:
        trainer.train()
    finally:
        trainer.close_environments()
    steps = records(tmp_path / "metrics.jsonl")
    assert [r["searches"] for r in steps] == [1.0, 1.0, 1.0]
    assert [r["searches/failed"] for r in steps] == [1.0, 1.0, 1.0]
    assert [r["searches/failed_share"] for r in steps] == [1.0, 1.0, 1.0]
    assert [r["searches/timed_out"] for r in steps] == [float(timeout)] * 3
    warned = warnings_in(capsys.readouterr().err)  # once, not at every step
    assert len(warned) == 1 and warned[0].startswith("warning: step 1: 100% of the searches failed")
    assert f"({100 if timeout else 0}% of those timed out)" in warned[0]


def test_failed_searches_are_counted_in_every_evaluation_and_said_beside_the_final_em(tmp_path):
    config = small_config("grpo", tmp_path, {"run.steps": 2, "eval.questions": 2, "eval.every": 1, "env.max_new_tokens": 200})
    trainer = trainer_on_down_source(config)
    try:
        result = trainer.train()
    finally:
        trainer.close_environments()
        if trainer.eval_env is not None:
            trainer.eval_env.close()
    evaluations = [r for r in records(tmp_path / "metrics.jsonl") if "eval/greedy/searches" in r]
    assert [r.get("stage") for r in evaluations] == ["start", None, "final"]  # start, periodic, final
    assert all(r["eval/greedy/searches/failed"] == r["eval/greedy/searches"] == 1.0 for r in evaluations)
    assert all(by_mode["greedy"].failed_searches == 1.0 for by_mode in result.evaluations.values())
    final = [line for line in result.report().splitlines() if line.startswith("final")]
    assert final and all("(searches failed)" in line for line in final), result.report()
    assert "searches failed in the evaluation (start greedy, start sampled, final greedy, final sampled)" in result.report()


def test_searches_that_work_are_not_failures(tmp_path, capsys):
    _, result = run(small_config("grpo", tmp_path, {"eval.questions": 0}))
    assert all(r["searches/failed"] == 0 and r["searches/timed_out"] == 0 for r in records(result.metrics_path))
    assert not warnings_in(capsys.readouterr().err)


# -- runs that never search ------------------------------------------------------------------------------
def scripted_run(config: TrainConfig, agent_class: type) -> list[dict]:
    """Train ``config`` with episodes played by the scripted ``agent_class``; the metrics log's records."""
    built = build_trainer(config)
    trainer = Trainer(config, built.policy, built.env, built.algorithm, built.backend, engine=ScriptedEngine(agent_class))
    try:
        trainer.train()
    finally:
        trainer.close_environments()
    return records(config.run.output_dir + "/metrics.jsonl")


def test_a_run_that_never_searches_is_logged_and_warned_once(tmp_path, capsys):
    config = small_config("grpo", tmp_path, {"run.steps": 5, "eval.questions": 0, "env.max_new_tokens": 200})
    steps = scripted_run(config, NoSearchAgent)
    assert [r["rollout/zero_search_frac"] for r in steps] == [1.0] * 5 and all(r["searches"] == 0 for r in steps)
    warned = warnings_in(capsys.readouterr().err)  # at the third step without a search, and not again
    assert len(warned) == 1, warned
    assert warned[0].startswith("warning: step 3: no episode searched in 3 steps in a row (rollout/zero_search_frac 1.0): "
                                "the policy answers without ever opening a search call (<search>), which the search-r1 protocol expects")


def test_a_run_that_searches_has_no_zero_search_share_and_no_warning(tmp_path, capsys):
    config = small_config("grpo", tmp_path, {"run.steps": 3, "eval.questions": 0, "env.max_new_tokens": 200})
    steps = scripted_run(config, RetrieveThenAnswerAgent)
    assert [r["rollout/zero_search_frac"] for r in steps] == [0.0] * 3
    assert not warnings_in(capsys.readouterr().err)


def test_the_no_search_warning_needs_steps_in_a_row_under_a_protocol_with_a_search_call():
    said: list[str] = []
    warning = NoSearchWarning("search-r1", "<search>", said.append)
    for step, share in enumerate([1.0, 1.0, 0.75, 1.0, 1.0], start=1):  # a step with a search starts the count again
        warning.check(step, {"rollout/zero_search_frac": share})
    assert said == []
    for step in (6, 7, 8):
        warning.check(step, {"rollout/zero_search_frac": 1.0})
    assert len(said) == 1 and said[0].startswith("warning: step 6: no episode searched in 3 steps in a row")
    silent = NoSearchWarning("no-tools", "", said.append)  # a protocol without a search call expects none
    for step in range(1, 6):
        silent.check(step, {"rollout/zero_search_frac": 1.0})
    assert len(said) == 1
    assert episodes_without_search([]) == {"rollout/zero_search_frac": 0.0}


# -- recipes that train less than they seem ----------------------------------------------------------
def test_a_warmup_longer_than_the_run_and_an_oversized_mini_batch_are_warned(tmp_path, capsys):
    config = small_config("grpo", tmp_path, {"eval.questions": 0, "optim.warmup_steps": 8, "optim.mini_batch_size": 64})
    run(config)
    assert warnings_in(capsys.readouterr().err) == [
        "warning: optim.warmup_steps (8) is longer than run.steps (2): the learning rate only reaches 25% of "
        "optim.learning_rate",
        "warning: optim.mini_batch_size (64) is larger than a step's rows (rollout.questions_per_step 2 x "
        "algorithm.group_size 2 = 4): each update pass is one optimiser step over the whole rollout",
    ]


def test_a_warmup_within_the_run_and_a_fitting_mini_batch_are_not_warned(tmp_path):
    assert recipe_warnings(small_config("grpo", tmp_path, {"optim.warmup_steps": 2, "optim.mini_batch_size": 4})) == []
    assert recipe_warnings(small_config("grpo", tmp_path, {"optim.warmup_ratio": 1.0})) == []


# -- the console off a terminal ------------------------------------------------------------------------
def test_progress_and_evaluation_lines_without_a_bar_and_no_transformers_bars(tmp_path, capsys):
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()  # as in a fresh process: the run itself must turn them off
    run(small_config("grpo", tmp_path, {"run.print_every": 1}))
    err = capsys.readouterr().err
    assert "Writing model shards" not in err and "it/s" not in err
    assert hf_logging.is_progress_bar_enabled()  # restored after the run
    lines = err.splitlines()
    progress = [line for line in lines if line.startswith("step ")]
    assert [line.split()[:2] for line in progress] == [["step", "1/2"], ["step", "2/2"]]
    for word in ("reward", "em", "searches", "failed", "tokens/s", "elapsed", "left"):
        assert f"  {word} " in progress[0]
    evaluations = [line for line in lines if line.startswith("eval ")]
    assert [line.split(":")[0] for line in evaluations] == ["eval start (step 0)", "eval final (step 2)"]
    assert "greedy em " in evaluations[0] and "sampled em " in evaluations[0]


def test_print_every_zero_prints_no_progress_lines(tmp_path, capsys):
    run(small_config("grpo", tmp_path, {"run.print_every": 0, "eval.questions": 0}))
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("step ")]


# -- sampled episodes -------------------------------------------------------------------------------------
def test_sampled_episodes_are_written_as_text(tmp_path):
    _, result = run(small_config("grpo", tmp_path, {"run.sample_every": 1, "eval.questions": 0}))
    samples = records(tmp_path / SAMPLES_FILE)
    assert [s["step"] for s in samples] == [1, 1, 2, 2]
    for sample in samples:
        assert set(sample) == {"step", "question", "golden_answers", "text", "answer", "reward", "reward_components",
                               "end_reason", "searches"}
        assert sample["question"] and sample["golden_answers"] and isinstance(sample["text"], str)
        assert isinstance(sample["reward_components"], dict)
    assert samples[0]["question"] != samples[1]["question"]  # two questions, not two samples of one


def test_no_samples_by_default_in_a_short_run_and_long_texts_are_cut(tmp_path):
    run(small_config("grpo", tmp_path, {"eval.questions": 0}))
    assert not (tmp_path / SAMPLES_FILE).exists()
    long = "a" * (MAX_TEXT_CHARS * 2)
    cut = _cut(long)
    assert len(cut) < MAX_TEXT_CHARS + 50 and "characters cut" in cut and _cut("short") == "short"


# -- an earlier run in the output folder ------------------------------------------------------------------
def test_a_new_run_into_a_folder_holding_a_run_is_refused_unless_overwrite(tmp_path, capsys):
    config = small_config("grpo", tmp_path, {"eval.questions": 0, "run.steps": 1, "run.sample_every": 1})
    run(config)
    before = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match=r"already holds a run \(metrics.jsonl\): pass --run.resume true"):
        run(config)
    assert (tmp_path / "metrics.jsonl").read_text() == before

    capsys.readouterr()
    assert main(tiny_argv(tmp_path, "--run.steps", "1", "--eval.questions", "0")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: run.output_dir {str(tmp_path)!r} already holds a run")

    _, result = run(config.updated({"run.overwrite": True, "run.sample_every": 0}))
    assert result.step == 1 and len(records(result.metrics_path)) == 1
    assert not (tmp_path / SAMPLES_FILE).exists()  # the old run's samples went with it


def test_resume_and_overwrite_together_are_refused():
    with pytest.raises(ValueError, match="give run.resume or run.overwrite, not both"):
        TrainConfig().updated({"run.resume": True, "run.overwrite": True})


# -- output locations ---------------------------------------------------------------------------------------
def test_an_output_folder_that_cannot_be_written_is_one_error_line_naming_it(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    target = blocker / "run"
    assert main(tiny_argv(target)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: run.output_dir {str(target)!r} is not writable: "), err
    with pytest.raises(OSError, match="is not writable"):
        run(small_config("grpo", target))


def test_a_full_disk_at_a_checkpoint_is_one_error_line_naming_it(tmp_path, capsys, monkeypatch):
    import errno

    import agents.training.checkpoint as checkpoint_module

    def full_disk(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_module, "save_checkpoint", full_disk)
    assert main(tiny_argv(tmp_path, "--eval.questions", "0")) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: could not write the checkpoint {tmp_path / 'checkpoint.pt'}: No space left on device"]


def test_durations_read_as_a_person_writes_them():
    from agents.training.console_log import format_duration

    assert [format_duration(s) for s in (0, 42, 185, 3725)] == ["0s", "42s", "3m05s", "1h02m"]


def test_the_environment_workers_death_is_one_error_line_naming_how_it_ended(tmp_path, capsys, monkeypatch):
    import os
    import signal

    from search_env.worker import EnvWorker

    submit = EnvWorker.submit

    def killed_first(worker, *args, **kwargs):
        os.kill(worker._process.pid, signal.SIGKILL)  # the OOM killer's way
        worker._process.join(10)
        return submit(worker, *args, **kwargs)

    monkeypatch.setattr(EnvWorker, "submit", killed_first)
    assert main(tiny_argv(tmp_path, "--eval.questions", "0", "--rollout.env_worker", "true")) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith("error: the environment worker (pid ") and errors[0].endswith("died: killed by SIGKILL")


def test_a_really_full_small_filesystem_at_a_checkpoint_is_one_error_line(tmp_path, capsys):
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        assert main(tiny_argv(disk / "run", "--eval.questions", "0")) == 1
    finally:
        subprocess.run(["umount", str(disk)], check=True)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: could not write the checkpoint {disk / 'run' / 'checkpoint.pt'}: No space left on device"], err
    assert "Traceback" not in err
