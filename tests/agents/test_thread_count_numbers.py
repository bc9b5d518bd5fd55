"""Importing ``agents`` makes matrix products independent of torch's thread count (MKL's strict numerical
reproducibility), checked in a fresh process whose environment does not set it: a product with a long
reduction, the shape of a weight gradient, on one thread and on two. Without the setting, an AVX-512 CPU
gives results that differ in their last bits."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT, skip_without

skip_without("agents", "torch")

_SCRIPT = """
import os
import agents, torch
print(os.environ["MKL_CBWR"])
generator = torch.Generator().manual_seed(0)
a, b = torch.randn(96, 1000, generator=generator), torch.randn(1000, 384, generator=generator)
products = []
for threads in (1, 2):
    torch.set_num_threads(threads)
    products.append(a @ b)
print(torch.equal(*products))
"""


def test_products_are_the_same_on_one_and_two_threads_after_importing_agents():
    env = {key: value for key, value in os.environ.items() if key not in ("MKL_CBWR", "MKL_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["AUTO,STRICT", "True"]


def test_a_setting_of_the_users_is_kept():
    env = {**os.environ, "MKL_CBWR": "COMPATIBLE"}
    out = subprocess.run([sys.executable, "-c", "import os, agents; print(os.environ['MKL_CBWR'])"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "COMPATIBLE", out.stderr
