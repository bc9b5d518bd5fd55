"""Plain progress lines for long work off a terminal: count, share, elapsed and time left, at most one
per interval, none for work that ends sooner; a bar instead where one is drawn.

Lines run on a clock the test moves, so no verdict depends on how fast anything ran.
"""
from __future__ import annotations

import io
import sys

import pytest

from search_env.progress_lines import ProgressLines, format_duration, progress_meter
from tests.conftest import skip_without


class Clock:
    """A monotonic clock that moves only when the test says."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_come_once_per_interval_with_share_elapsed_and_time_left() -> None:
    clock, stream = Clock(), io.StringIO()
    lines = ProgressLines(13800, "encoding passages", interval_s=10.0, stream=stream, clock=clock)
    for seconds, done in [(4.0, 1000), (9.9, 2000), (41.0, 3000), (45.0, 3500), (51.0, 4000)]:
        clock.now = 100.0 + seconds
        lines.update(done - lines.done)
    assert stream.getvalue().splitlines() == [
        "encoding passages: 3000/13800 (22%), 41s, ~2m28s left",  # 41 s for 3000: 10800 more take 147.6 s
        "encoding passages: 4000/13800 (29%), 51s, ~2m05s left",
    ]
    clock.now = 100.0 + 130.0
    lines.update(9800)
    lines.close()
    assert stream.getvalue().splitlines()[-1] == "encoding passages: 13800/13800 (100%), 2m10s"
    assert lines.lines == 3


def test_work_shorter_than_the_interval_prints_nothing_even_at_close() -> None:
    clock, stream = Clock(), io.StringIO()
    with ProgressLines(30, "indexing (flat)", interval_s=10.0, stream=stream, clock=clock) as lines:
        clock.now += 9.0
        lines.update(30)
    assert stream.getvalue() == ""


def test_close_adds_no_line_when_the_last_one_had_the_final_count() -> None:
    clock, stream = Clock(), io.StringIO()
    with ProgressLines(10, "encoding passages", interval_s=1.0, stream=stream, clock=clock) as lines:
        clock.now += 2.0
        lines.update(10)
    assert stream.getvalue().splitlines() == ["encoding passages: 10/10 (100%), 2s"]


def test_durations_read_as_a_person_writes_them() -> None:
    assert [format_duration(s) for s in (0, 41.4, 147.6, 3720, -3)] == ["0s", "41s", "2m28s", "1h02m", "0s"]


def test_lines_off_a_terminal_and_a_bar_on_one(monkeypatch: pytest.MonkeyPatch) -> None:
    skip_without("dense", "tqdm")
    monkeypatch.delenv("SEARCHQA_PROGRESS", raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal
    assert isinstance(progress_meter(total=3, desc="x"), ProgressLines)
    assert isinstance(progress_meter(total=3, desc="x", show=False), ProgressLines)
    bar = progress_meter(total=3, desc="x", show=True)
    try:
        assert not isinstance(bar, ProgressLines) and bar.total == 3  # tqdm's
    finally:
        bar.close()
