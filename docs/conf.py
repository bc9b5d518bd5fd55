"""Sphinx configuration of the SearchQA Gym documentation.

Why Sphinx: the code's docstrings are Google-style with reStructuredText roles (``:class:``, ``:mod:``,
``:func:``), which autodoc and napoleon render natively and cross-link, so the API reference is the
docstrings themselves. MyST lets the hand-written pages be Markdown and include ``benchmarks/RESULTS.md``
as it is. Pages generated from the code (the ``agents.train`` options and the metrics glossary) are written
before each build by ``_ext/generated_reference.py``.

No import is mocked: the documented modules import vLLM, DeepSpeed and the other optional packages only when
a run uses them, so autodoc needs the ``agents`` extra and no GPU.

Build: ``pip install -c constraints.txt -e ".[docs]"`` then ``sphinx-build -W --keep-going -b html docs docs/_build``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent / "_ext")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

project = "SearchQA Gym"
author = "SearchQA Gym authors"
copyright = "SearchQA Gym authors"
release = version = next(line.split('"')[1] for line in (ROOT / "search_env" / "__init__.py").read_text(encoding="utf-8").splitlines()
                         if line.startswith("__version__ = "))

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon",
              "sphinx.ext.viewcode", "generated_reference"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_ext"]
myst_heading_anchors = 3

# Google-style docstrings only; their Attributes sections document the dataclass fields.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# Cross-references to third-party classes (torch, gymnasium, transformers) stay plain text: no intersphinx
# (the build runs offline), so missing targets are not warnings.
nitpicky = False

html_theme = "furo"
html_title = f"SearchQA Gym {release}"
