"""The rooms of ``agents`` import one way: policies <- rollout <- scripted and learners <- training <- the
``agents.train`` command, and scripted <- baselines (the LLM baselines write the scripted agents' dialect);
and no package of the library imports ``benchmarks``."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

#: What each room may import of ``agents`` besides itself.
ALLOWED = {
    "policies": set(),
    "rollout": {"policies"},
    "scripted": {"rollout"},
    "learners": {"rollout"},
    "training": {"policies", "rollout", "scripted", "learners"},
    "baselines": {"rollout", "scripted"},
}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (inside functions and ``TYPE_CHECKING`` blocks too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_a_room_imports_only_the_rooms_below_it(room: str) -> None:
    wrong = []
    for path in sorted((REPO_ROOT / "agents" / room).rglob("*.py")):
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "agents" and len(parts) > 1 and parts[1] != room and parts[1] not in ALLOWED[room]:
                wrong.append(f"{path.relative_to(REPO_ROOT)} imports {module}")
    assert wrong == []


def test_no_library_package_imports_benchmarks() -> None:
    wrong = [f"{path.relative_to(REPO_ROOT)} imports {module}"
             for package in ("search_env", "agents", "rewards") for path in sorted((REPO_ROOT / package).rglob("*.py"))
             for module in imported_modules(path) if module.split(".")[0] == "benchmarks"]
    assert wrong == []


def test_rewards_import_nothing_else_of_the_project() -> None:
    wrong = [f"{path.relative_to(REPO_ROOT)} imports {module}" for path in sorted((REPO_ROOT / "rewards").rglob("*.py"))
             for module in imported_modules(path) if module.split(".")[0] in ("search_env", "agents", "benchmarks")]
    assert wrong == []
