"""The documentation site builds with warnings as errors, and its generated reference pages list what the
code defines: every ``agents.train`` option of the config groups, every metrics-glossary entry and every
registered protocol."""
from __future__ import annotations

import dataclasses
import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import skip_without

ROOT = Path(__file__).resolve().parent.parent

skip_without("docs", "sphinx", "myst_parser", "furo")
skip_without("agents", "torch", "transformers", "jsonargparse")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The HTML site, built from scratch as CI builds it (``-W``: any warning fails the build)."""
    out = tmp_path_factory.mktemp("docs")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-d", str(out / "doctrees"),
                           str(ROOT / "docs"), str(out / "html")], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return out / "html"


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def test_the_cli_page_lists_every_option_of_the_config_groups(site):
    from agents.training.config import GROUPS

    text = _text(site / "reference" / "cli.html")
    assert "--run.steps" in text and "--rollout.engine" in text and "--algorithm.kl_coef" in text
    missing = [f"--{group}.{f.name}" for group, cls in GROUPS.items() for f in dataclasses.fields(cls) if f"--{group}.{f.name}" not in text]
    assert not missing, missing
    assert "--engine.replicas" in text  # a chosen group's field (vllm-server's), from its registered options


def test_the_glossary_lists_every_metric_entry(site):
    from agents.training.metric_keys import METRIC_KEYS

    text = _text(site / "reference" / "metrics.html")
    assert "time/step" in text and "eval/{decoding}/em" in text
    assert [entry.pattern for entry in METRIC_KEYS if entry.pattern not in text] == []


def test_the_protocols_table_lists_every_registered_protocol(site):
    from search_env.protocols import available_protocols, get_protocol

    text = _text(site / "reference" / "protocols.html")
    assert "<|begin_of_query|>" in text  # r1-searcher's call tag, its | kept inside the table cell
    assert [name for name in available_protocols() if name not in text or get_protocol(name).call_open not in text] == []


def test_the_pages_are_built(site):
    for page in ("index", "getting-started", "concepts", "results", "reference/api"):
        assert (site / f"{page}.html").is_file(), page
    assert "python -m agents.train --config agents/configs/demo.yaml" in _text(site / "getting-started.html")
    assert "class search_env.env.SearchQAEnv" in _text(site / "reference" / "api.html").replace("\n", " ")


def test_the_figures_page_shows_every_figure_with_its_results_section(site):
    text = _text(site / "figures.html")
    figures = sorted((ROOT / "benchmarks" / "figures").glob("*.png"))
    assert figures
    for figure in figures:
        assert figure.name in text and (site / "_images" / figure.name).is_file(), figure.name
    assert "In the results: RL algorithms side by side" in text  # the section naming algorithms_heldout_em_2hop.png


def test_the_benchmarks_page_lists_every_command(site):
    from benchmarks.__main__ import COMMANDS

    text = _text(site / "reference" / "benchmarks.html")
    assert [name for name in COMMANDS if f"python -m benchmarks.{name}" not in text] == []


def test_every_howto_guide_is_built_and_listed_on_the_howto_index(site):
    guides = sorted(page.stem for page in (ROOT / "docs" / "howto").glob("*.md") if page.stem != "index")
    assert len(guides) >= 8, guides
    index = (site / "howto" / "index.html").read_text(encoding="utf-8")
    assert [g for g in guides if not (site / "howto" / f"{g}.html").is_file() or f'href="{g}.html"' not in index] == []


def test_getting_started_quotes_the_readme_install_lines_whole(site):
    """Its literal includes cut README.rst at marker sentences: each of the README's install lines (the two
    commands and the GPU install) shows whole, so a moved marker cannot quote the wrong text."""
    text = _text(site / "getting-started.html")
    readme = (ROOT / "README.rst").read_text(encoding="utf-8")
    lines = [line.strip() for line in readme.splitlines() if line.strip().startswith("python3 -m venv .venv")]
    assert len(lines) == 3, lines
    assert [line for line in lines if line not in text] == []
    assert "$SEARCHQA_GYM_CACHE" in text and "~/.cache/searchqa_gym" in text  # where the converted SmolLM2 is kept
