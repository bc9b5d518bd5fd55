"""The side virtualenvs' background build (tests/side_venvs.py): which scripts the selected tests need, in
the order they need them, run one after another, and a build still running when the tests end is stopped."""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

from tests.side_venvs import BackgroundBuild, scripts_for, side_venv_modules_last


class _Item:
    def __init__(self, vllm: bool, scripts: tuple[str, ...] = (), nodeid: str = "tests/test_x.py::test") -> None:
        self._vllm, self.module = vllm, SimpleNamespace(VENV_SCRIPTS=scripts) if scripts else None
        self.nodeid = nodeid

    def get_closest_marker(self, name: str):
        return object() if name == "vllm" and self._vllm else None


def test_the_scripts_are_the_selected_tests_in_their_order_once_each():
    items = [_Item(False), _Item(False, ("gem_venv.sh",)), _Item(True), _Item(True), _Item(False, ("verl_venv.sh",)),
             _Item(False, ("gem_venv.sh",))]
    assert scripts_for(items) == ["gem_venv.sh", "vllm_venv.sh", "verl_venv.sh"]
    assert scripts_for([_Item(False)]) == []


def test_modules_that_need_a_venv_go_last_whole_and_in_order():
    plain_a, plain_b = _Item(False, nodeid="tests/a.py::t1"), _Item(False, nodeid="tests/b.py::t")
    vllm_one = _Item(True, nodeid="tests/v.py::t1")
    vllm_same_module = _Item(False, nodeid="tests/v.py::t2")  # not marked, but its module needs the venv
    gem = _Item(False, ("gem_venv.sh",), nodeid="tests/g.py::t")
    plain_a2 = _Item(False, nodeid="tests/a.py::t2")
    items = [vllm_one, vllm_same_module, plain_a, gem, plain_a2, plain_b]
    assert side_venv_modules_last(items) == [plain_a, plain_a2, plain_b, vllm_one, vllm_same_module, gem]


def _wait_for(path, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} was not written"
        time.sleep(0.05)


def test_the_scripts_run_one_after_another_and_a_running_one_is_stopped(tmp_path):
    (tmp_path / "a.sh").write_text(f"echo a >> {tmp_path}/order\n")
    (tmp_path / "b.sh").write_text(f"echo b >> {tmp_path}/order; touch {tmp_path}/b_done\n")
    build = BackgroundBuild(["a.sh", "b.sh"], tmp_path / "log", folder=tmp_path)
    build.process.wait(timeout=20)
    assert (tmp_path / "order").read_text().split() == ["a", "b"]
    (tmp_path / "slow.sh").write_text(f"touch {tmp_path}/started; sleep 60; touch {tmp_path}/finished\n")
    build = BackgroundBuild(["slow.sh"], tmp_path / "log", folder=tmp_path)
    _wait_for(tmp_path / "started")
    build.stop()
    assert build.process.returncode is not None and not (tmp_path / "finished").exists()
    deadline = time.monotonic() + 10  # the whole group ends, the script's sleep too
    while _group_alive(build.process.pid):
        assert time.monotonic() < deadline, "the build's process group outlived stop()"
        time.sleep(0.05)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
