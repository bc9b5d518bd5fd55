"""DeepSpeed under faults: a lock file left in torch's extensions folder by a run killed while DeepSpeed
compiled its CPU op never holds a later run (the op is not compiled at all), and a checkpoint resumed with
another number of ranks is one ``error:`` line for the whole run, said before the engine reads a file."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
skip_without("deepspeed", "deepspeed")
from tests.agents.training.torchrun import ROOT, TINY_RUN, free_port, rank_env  # noqa: E402

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]


def test_a_lock_left_by_a_killed_build_holds_no_run_and_another_rank_count_is_one_line(tmp_path):
    extensions = tmp_path / "torch_extensions"
    # What a run killed while DeepSpeed built its shared-memory op leaves: the build folder's lock (torch waits for it).
    lock = extensions / "deepspeed_shm_comm" / "lock"  # TORCH_EXTENSIONS_DIR holds the build folders itself
    lock.parent.mkdir(parents=True)
    lock.touch()
    env = {**rank_env(), "TORCH_EXTENSIONS_DIR": str(extensions)}
    out = tmp_path / "run"
    train = ["-m", "agents.train", "--run.backend", "deepspeed", "--backend.zero_stage", "2", *TINY_RUN,
             "--eval.questions", "0", "--run.output_dir", str(out)]
    one = subprocess.run([sys.executable, *train, "--run.stop_after", "1"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)  # on the old code: waits on the lock until killed
    assert one.returncode == 0, one.stderr[-3000:]
    assert lock.exists()  # nobody waited on it, nobody took it

    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                          "127.0.0.1", "--master_port", str(free_port()), *train, "--run.resume", "true"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode != 0
    errors = [line for line in (two.stdout + two.stderr).splitlines() if "error" in line.lower() and "rank" in line]
    folder = out / "checkpoints" / "step-1"
    assert [line for line in errors if line.startswith("error:")] == [
        f"error: checkpoint {folder} was written by 1 ranks; this run has 2: resume it with 1 ranks "
        "(torchrun --nproc_per_node 1)"], two.stderr[-3000:]
    ranks_said = two.stderr.split("failed (exitcode")[0]  # before torchrun's own report (and its traceback)
    assert "Traceback" not in ranks_said, ranks_said[-3000:]
