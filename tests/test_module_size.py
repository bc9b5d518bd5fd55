"""No module of the library is over 500 lines: past that a module holds more than one job, and a reader
who opens it for one of them reads the others. A module that grows past it is split by job."""
from __future__ import annotations

from tests.conftest import REPO_ROOT

#: The most lines a module may have.
MAX_LINES = 500
#: The packages the limit holds for (the tests are not held to it).
PACKAGES = ("search_env", "agents", "rewards", "benchmarks")


def test_no_module_of_the_library_is_over_500_lines() -> None:
    sizes = {str(path.relative_to(REPO_ROOT)): len(path.read_text(encoding="utf-8").splitlines())
             for package in PACKAGES for path in sorted((REPO_ROOT / package).rglob("*.py"))}
    assert len(sizes) > 100  # the packages were found
    over = {path: lines for path, lines in sizes.items() if lines > MAX_LINES}
    assert not over, f"over {MAX_LINES} lines: {over}"
