"""The answer-turn benchmark against GEM: a --quick run's report has the promised structure, the peer's
JSON-lines exchange and the ratios work (against a stand-in peer), and, in GEM's own virtualenv, GEM's
answer turn is measured beside ours. Structure only: no timing is asserted."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import answer_turn
from tests.conftest import REPO_ROOT

#: The side virtualenv these tests run in, built in the background from the start of the run (tests/side_venvs.py).
VENV_SCRIPTS = ("gem_venv.sh",)

OURS = {"answer_turn", "answer_turn_unwrapped", "chunk_3", "token"}


def check_figures(result: dict, names: set[str], rounds: int) -> None:
    assert set(result["figures"]) == names
    for name, figure in result["figures"].items():
        assert figure["label"] == answer_turn.FIGURES[name] and figure["unit"] == "µs"
        assert len(figure["values"]) == rounds and all(v > 0 for v in figure["values"])
        assert figure["min"] <= figure["median"] <= figure["max"]


def test_a_quick_run_without_gem_writes_our_figures_and_says_why_there_is_no_ratio(tmp_path: Path) -> None:
    result = answer_turn.main(["--quick", "--gem", "off", "--rounds", "2", "--repeats", "20", "--output-dir", str(tmp_path)])
    check_figures(result, OURS, rounds=2)
    assert result["ratio"] is None and result["ratio_unwrapped"] is None
    assert result["gem"] == {"status": "GEM left out (--gem off)", "version": None, "python": None}
    assert result["settings"]["text"] == answer_turn.TEXT and result["settings"]["answer_ids"] > 0
    assert "cpu" in result["machine"]
    saved = json.loads((tmp_path / "answer_turn.json").read_text(encoding="utf-8"))
    assert saved["figures"]["answer_turn"]["values"] == result["figures"]["answer_turn"]["values"]
    report = (tmp_path / "answer_turn.md").read_text(encoding="utf-8")
    assert "| ours: answer turn (chunk of ids), gym.make env |" in report and "No ratio: GEM did not run." in report


STAND_IN = """
    import json, sys
    spec = json.loads(sys.argv[1])
    assert spec["text"] and spec["answers"] and spec["question"]
    print(json.dumps({"ready": True, "gem_version": "stand-in", "python": "3.x"}), flush=True)
    for line in sys.stdin:
        print(json.dumps({"times_s": [4e-6] * json.loads(line)["repeats"]}), flush=True)
"""


def test_the_peer_exchange_and_the_ratios_with_a_stand_in_peer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GEM side's protocol (a spec argument, a ready line, one JSON line per round) with a stand-in that
    takes 4 µs per step: the ratio of each round is our median over 4 µs."""
    peer = tmp_path / "peer.py"
    peer.write_text(textwrap.dedent(STAND_IN), encoding="utf-8")
    monkeypatch.setattr(answer_turn, "_PEER", peer)
    monkeypatch.setattr(answer_turn, "gem_venv_python", lambda mode: (sys.executable, "a stand-in"))
    result = answer_turn.measure(rounds=2, repeats=10)
    check_figures(result, OURS | {"gem_answer_turn"}, rounds=2)
    assert result["figures"]["gem_answer_turn"]["values"] == pytest.approx([4.0, 4.0])
    for key, name in (("ratio", "answer_turn"), ("ratio_unwrapped", "answer_turn_unwrapped")):
        assert result[key]["values"] == pytest.approx([v / 4.0 for v in result["figures"][name]["values"]])
    assert result["gem"] == {"status": "a stand-in", "version": "stand-in", "python": "3.x"}
    assert "Ours / GEM, answer turn, gym.make env:" in answer_turn.format_markdown(result)


def test_a_peer_that_stops_is_reported_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    peer = tmp_path / "peer.py"
    peer.write_text("import sys; sys.exit('no gem here')\n", encoding="utf-8")
    monkeypatch.setattr(answer_turn, "_PEER", peer)
    with pytest.raises(RuntimeError, match="no gem here"):
        answer_turn.GemPeer(sys.executable, answer_turn.TEXT)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_gem_answer_turn_in_its_own_virtualenv(tmp_path: Path) -> None:
    """Builds GEM's venv with .ci/gem_venv.sh (cached; the first build downloads gem-llm and its pins) and
    runs the quick benchmark with GEM: its answer turn scores the same text as correct, and is measured."""
    build = subprocess.run(["bash", str(REPO_ROOT / ".ci" / "gem_venv.sh")], capture_output=True, text=True, timeout=1500)
    assert build.returncode == 0, f"building GEM's venv failed:\n{build.stderr[-4000:]}"
    result = answer_turn.main(["--quick", "--gem", "existing", "--rounds", "1", "--repeats", "50", "--output-dir", str(tmp_path)])
    check_figures(result, OURS | {"gem_answer_turn"}, rounds=1)
    assert result["gem"]["version"] == "0.1.0" and result["ratio"]["median"] > 0
    assert "GEM: ToolEnvWrapper.step on the answer text" in (tmp_path / "answer_turn.md").read_text(encoding="utf-8")
