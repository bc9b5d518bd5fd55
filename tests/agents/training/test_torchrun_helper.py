"""The DeepSpeed tests' ``torchrun`` helper runs a launch again only when a rank died of gloo's teardown
abort, once: a rank that aborts that way on the first launch passes on the second, one that fails any
other way (or that way every time) fails the test."""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch")
from tests.agents.training.torchrun import TEARDOWN_ABORT, torchrun  # noqa: E402

#: Rank 1 dies of SIGABRT after printing ``message``, while ``marker`` (a path) does not exist yet
#: (``always``: whether or not it exists); it creates the marker first.
RANK_SCRIPT = """
import os, sys
marker, message, always = sys.argv[1], sys.argv[2], sys.argv[3] == "always"
if os.environ["RANK"] == "1" and (always or not os.path.exists(marker)):
    open(marker, "w").close()
    print(message, file=sys.stderr, flush=True)
    os.abort()
"""


def _launch(tmp_path, message: str, mode: str) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    torchrun(2, str(script), str(tmp_path / "marker"), message, mode, timeout=120)


def test_a_teardown_abort_is_run_again_once(tmp_path):
    _launch(tmp_path, TEARDOWN_ABORT, "once")
    assert (tmp_path / "marker").exists()  # the first launch did abort


@pytest.mark.parametrize("message, mode", [("some other failure", "once"), (TEARDOWN_ABORT, "always")])
def test_other_aborts_and_repeated_ones_fail(tmp_path, message, mode):
    with pytest.raises(AssertionError, match="SIGABRT"):
        _launch(tmp_path, message, mode)
