"""The tests marked ``vllm`` say on the terminal when their virtualenv is being built and how long it took
(a silent build of minutes looked like a stalled test run), and say nothing when it is built already."""
from __future__ import annotations

import subprocess
from pathlib import Path

from tests.agents.rollout.vllm_venv import built_venv
from tests.conftest import REPO_ROOT

#: A stand-in for .ci/vllm_venv.sh: built once ``built`` exists beside it, building creates it.
FAKE_SCRIPT = """
here="$(dirname "$0")"
if [ "${1:-}" = "--check" ]; then [ -f "$here/built" ] && { echo "$here/venv"; exit 0; }; exit 1; fi
touch "$here/built"; echo "pip output" >&2; echo "$here/venv"
"""


def test_a_build_is_announced_with_how_to_leave_the_tests_out_and_timed(tmp_path: Path) -> None:
    script = tmp_path / "vllm_venv.sh"
    script.write_text(FAKE_SCRIPT)
    said: list[str] = []
    assert built_venv(script, said.append) == str(tmp_path / "venv")
    assert len(said) == 2, said
    assert said[0].startswith("building the vLLM virtualenv for the tests marked vllm (once, about 4 minutes")
    assert "-m 'not vllm' leaves these tests out" in said[0] and f"bash {script}" in said[0]
    assert said[1].startswith("built the vLLM virtualenv in ") and said[1].endswith(f" s: {tmp_path / 'venv'}")
    said.clear()
    assert built_venv(script, said.append) == str(tmp_path / "venv") and said == []  # built already: no line


def test_the_build_script_checks_without_building(tmp_path: Path) -> None:
    check = subprocess.run(["bash", str(REPO_ROOT / ".ci" / "vllm_venv.sh"), "--check", str(tmp_path / "venv")],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and check.stdout == "" and "is not built" in check.stderr
    assert list(tmp_path.iterdir()) == []  # nothing made, no lock file either

