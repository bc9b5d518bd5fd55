"""Progress bars only where someone watches; ``--help`` with defaults and without markup; a usage error in one line."""
from __future__ import annotations

import argparse
import io

import pytest

from search_env.console import PROGRESS_ENV, CommandParser, HelpFormatter, nearest_flags, plain_text, progress, progress_enabled
from tests.conftest import skip_without


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_follow_whether_stderr_is_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert progress_enabled() is False
    monkeypatch.setattr("sys.stderr", _Terminal())
    assert progress_enabled() is True
    monkeypatch.setattr("sys.stderr", None)  # pythonw and some daemons have no stderr at all
    assert progress_enabled() is False


@pytest.mark.parametrize(("setting", "expected"), [("1", True), ("yes", True), ("ON", True), ("0", False), ("false", False), ("off", False)])
def test_the_environment_variable_forces_bars_either_way(monkeypatch: pytest.MonkeyPatch, setting: str, expected: bool) -> None:
    monkeypatch.setenv(PROGRESS_ENV, setting)
    monkeypatch.setattr("sys.stderr", _Terminal() if not expected else io.StringIO())  # the opposite of what it asks
    assert progress_enabled() is expected


def test_the_caller_overrides_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROGRESS_ENV, "1")
    assert progress_enabled(False) is False
    monkeypatch.setenv(PROGRESS_ENV, "0")
    assert progress_enabled(True) is True


def test_a_bad_setting_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROGRESS_ENV, "maybe")
    with pytest.raises(ValueError, match=r"\$SEARCHQA_PROGRESS must be one of .* got 'maybe'"):
        progress_enabled()


def test_a_disabled_bar_writes_nothing_and_still_iterates(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    assert list(progress(range(3), desc="x")) == [0, 1, 2]
    with progress(total=5, desc="manual") as bar:
        bar.update(5)
    assert err.getvalue() == ""


def test_a_forced_bar_draws_on_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    skip_without("agents", "tqdm")  # the dense extra brings it too
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setenv(PROGRESS_ENV, "1")
    assert list(progress(range(4), desc="counting", mininterval=0)) == [0, 1, 2, 3]
    assert "counting" in err.getvalue() and "4/4" in err.getvalue()


def test_help_shows_defaults_and_keeps_the_description_as_written() -> None:
    parser = argparse.ArgumentParser(description="line one\n  line two", formatter_class=HelpFormatter)
    parser.add_argument("--episodes", type=int, default=100, help="questions per run")
    parser.add_argument("--fast", action="store_true", help="skip the slow part")
    parser.add_argument("--cache", default=None, help="where to keep it (unset: nowhere)")
    text = parser.format_help()
    assert "line one\n  line two" in text
    assert "questions per run (default: 100)" in text
    assert "skip the slow part\n" in text and "(unset: nowhere)\n" in text  # flags and None defaults say nothing more


def test_help_shows_no_sphinx_or_restructuredtext_markup() -> None:
    description = "**The ladder** (``--ladder quick``) runs rungs of :mod:`benchmarks.common.ladder` (:data:`~a.b.RUNGS`)."
    parser = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter)
    parser.add_argument("--window", type=int, default=3, help="steps of :func:`~benchmarks.common.collapse.rolling_mean`, ``3``")
    text = parser.format_help()
    assert "The ladder (--ladder quick) runs rungs of benchmarks.common.ladder (RUNGS)." in text
    assert "steps of rolling_mean, 3 (default: 3)" in " ".join(text.split())
    assert plain_text("2 ** 3 and **bold**") == "2 ** 3 and bold"  # an operator is not emphasis


def test_a_usage_error_is_one_line_naming_the_nearest_option(capsys: pytest.CaptureFixture[str]) -> None:
    parser = CommandParser(prog="python -m tool", formatter_class=HelpFormatter)
    for flag in ("--episodes", "--jobs", "--output-dir", "--seed", "--bootstrap-reps"):
        parser.add_argument(flag)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--episodez", "3", "--jobz", "2"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err == ("python -m tool: error: unrecognized arguments: --episodez 3 --jobz 2 (--episodez: did you mean --episodes?; "
                   "--jobz: did you mean --jobs?) (python -m tool --help lists the options)\n")
    assert nearest_flags("unrecognized arguments: --zzz", ["--episodes"]) == "unrecognized arguments: --zzz"  # nothing near
