"""The data-parallel benchmark's memory target, counted (not timed): two ZeRO-3 ranks each hold at most 0.6x
the parameter and optimiser bytes of one process, all three setups in fp32 - 6N bytes against 12N for N
parameters (a shard of the parameters and of the AdamW moments, the master weights sharing the shard's
buffer), and ZeRO-2 8N (whole parameters, a shard of the moments)."""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
skip_without("deepspeed", "deepspeed")

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]


def test_zero3_ranks_hold_at_most_six_tenths_of_one_process(tmp_path):
    from benchmarks.data_parallel import run

    common = ["--hidden", "128", "--layers", "2", "--steps", "1"]
    single = run("single", 1, ["--backend", "torch"], tmp_path, common)[0]["held_bytes"]
    zero2 = max(r["held_bytes"] for r in run("zero2", 2, ["--backend", "deepspeed", "--zero", "2"], tmp_path, common))
    zero3 = max(r["held_bytes"] for r in run("zero3", 2, ["--backend", "deepspeed", "--zero", "3"], tmp_path, common))
    assert zero3 <= 0.6 * single
    assert zero3 / single == pytest.approx(6 / 12, abs=0.01) and zero2 / single == pytest.approx(8 / 12, abs=0.01)
