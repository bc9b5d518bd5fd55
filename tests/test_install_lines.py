"""The README's install commands name extras that setup.py defines, and its GPU install keeps the machine's
CUDA build of PyTorch (no ``constraints.txt``, which pins the CPU build) while taking the GPU extras."""
from __future__ import annotations

import ast
import re

from tests.conftest import REPO_ROOT

README = (REPO_ROOT / "README.rst").read_text(encoding="utf-8")
INSTALL = re.compile(r'pip install (?P<constraints>-c constraints\.txt )?-e "\.\[(?P<extras>[^\]]+)\]"')


def setup_extras() -> set[str]:
    """The extras setup.py defines: the keys of its ``EXTRAS`` dict, and those it assigns one by one
    (``EXTRAS["all"] = ...``), read from its syntax tree without running it."""
    tree = ast.parse((REPO_ROOT / "setup.py").read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == "EXTRAS" and isinstance(node.value, ast.Dict):
                    names |= {key.value for key in node.value.keys if isinstance(key, ast.Constant)}
                if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id == "EXTRAS"
                        and isinstance(target.slice, ast.Constant)):
                    names.add(target.slice.value)
    return names


def test_setup_extras_are_read():
    assert {"agents", "deepspeed", "lora", "vllm", "all", "test"} <= setup_extras()


def test_every_install_line_names_extras_that_exist():
    lines = list(INSTALL.finditer(README))
    assert len(lines) >= 3
    for line in lines:
        extras = set(line["extras"].split(","))
        assert extras <= setup_extras(), (line[0], extras - setup_extras())


def test_the_gpu_install_keeps_cuda_torch_and_takes_the_gpu_extras():
    section = README[README.index("Installing on a GPU machine"):]
    gpu = INSTALL.search(section)
    assert gpu is not None and gpu["constraints"] is None  # constraints.txt would swap in the CPU build
    assert set(gpu["extras"].split(",")) == {"agents", "deepspeed", "lora", "vllm"}
    cpu_lines = [line for line in INSTALL.finditer(README) if line.start() < README.index("Installing on a GPU machine")]
    assert cpu_lines and all(line["constraints"] for line in cpu_lines)
