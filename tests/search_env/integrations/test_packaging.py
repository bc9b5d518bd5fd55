"""The adapters stay opt-in: ``import search_env`` imports no trainer framework, the integrations import
nothing of ``agents`` (nor ``benchmarks``), and a missing framework names the extra that installs it."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from search_env._optional import MissingExtraError
from tests.agents.test_layering import imported_modules
from tests.conftest import REPO_ROOT

FRAMEWORKS = ("trl", "skyrl_gym", "gem", "verl", "transformers", "torch", "datasets")


def test_importing_the_package_imports_no_trainer_framework():
    code = ("import sys, search_env, gymnasium; gymnasium.make('SearchQA-v0', max_new_tokens=8).close(); "
            f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_the_integrations_use_search_env_and_rewards_only():
    wrong = [f"{path.name} imports {module}" for path in sorted((REPO_ROOT / "search_env" / "integrations").glob("*.py"))
             for module in imported_modules(path) if module.split(".")[0] in ("agents", "benchmarks")]
    assert wrong == []


@pytest.mark.parametrize("module,hidden,extra", [
    ("search_env.integrations.trl", "trl", "trl"),
    ("search_env.integrations.skyrl", "skyrl_gym", "skyrl"),
    ("search_env.integrations.gem", "gem", "gem"),
    ("search_env.integrations.verl_tool", "verl", "verl"),
])
def test_a_missing_framework_names_its_extra(monkeypatch, module, hidden, extra):
    for name in [name for name in sys.modules if name == module or name == hidden or name.startswith(hidden + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, hidden, None)
    with pytest.raises(MissingExtraError, match=rf"needs {hidden}: pip install 'searchqa-gym\[{extra}\]'$"):
        importlib.import_module(module)
