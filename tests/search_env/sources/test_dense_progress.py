"""A dense index build off a terminal prints plain progress lines with its counts (and none where a bar
is drawn). The encoder is the tiny random BERT of :mod:`tests.search_env.sources.test_dense` (no
download); lines come at every batch (interval 0), so the counts do not depend on how fast it ran.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.conftest import skip_without

skip_without("dense", "torch", "transformers", "faiss")
from search_env import progress_lines  # noqa: E402
from search_env.sources.dense import DenseSource  # noqa: E402
from search_env.sources.encoders import TransformersEncoder  # noqa: E402
from tests.search_env.sources.test_dense import CORPUS, tiny_model_dir  # noqa: E402,F401  (a fixture)

LINE = re.compile(r"^(?P<desc>[^:]+): (?P<done>\d+)/(?P<total>\d+) \((?P<share>\d+)%\), \S+(?P<left>, ~\S+ left)?$")


@pytest.fixture
def encoder(tiny_model_dir: Path) -> TransformersEncoder:  # noqa: F811 - the imported fixture
    """Batches of 4: the 30 passages go as 7 batches of 4, then one of 2."""
    return TransformersEncoder(tiny_model_dir, precision="fp32", batch_size=4, workers=2, prefixes="none", backend="torch")


def test_a_dense_build_off_a_terminal_prints_lines_with_its_counts(
    encoder: TransformersEncoder, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SEARCHQA_PROGRESS", raising=False)
    monkeypatch.setattr(progress_lines, "LINE_INTERVAL_S", 0.0)  # a line at every batch, whatever the speed
    assert not sys.stderr.isatty()
    DenseSource(CORPUS, encoder)
    err = capsys.readouterr().err
    parsed = [LINE.match(line) for line in err.splitlines()]
    assert parsed and all(parsed), err
    encoding = [(int(m["done"]), int(m["total"]), int(m["share"])) for m in parsed if m["desc"] == "encoding passages"]
    assert encoding == [(n, 30, round(100 * n / 30)) for n in (4, 8, 12, 16, 20, 24, 28, 30)]
    assert all(m["left"] for m in parsed[:7]) and not parsed[7]["left"]  # time left until the last batch
    assert [(m["desc"], m["done"], m["total"]) for m in parsed[8:]] == [("indexing (flat)", "30", "30")]


def test_a_dense_build_with_a_bar_prints_no_lines(
    encoder: TransformersEncoder, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    skip_without("dense", "tqdm")
    monkeypatch.setattr(progress_lines, "LINE_INTERVAL_S", 0.0)
    DenseSource(CORPUS, encoder, show_progress=True)
    err = capsys.readouterr().err
    assert "encoding passages" in err and "indexing (flat)" in err  # tqdm's bars
    assert not any(LINE.match(line) for line in err.splitlines())
