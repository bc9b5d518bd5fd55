"""Where the virtualenvs that ``.ci/gem_venv.sh`` and ``.ci/vllm_venv.sh`` build live, as those scripts
place them: ``$VARIABLE`` when it is set, else ``searchqa-gym/NAME`` in the user's cache folder
(``$XDG_CACHE_HOME``, else ``~/.cache``). Benchmarks only look there; the scripts build."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["venv_dir"]


def venv_dir(variable: str, name: str) -> Path:
    """The folder of the virtualenv named ``name`` (``gem-venv``, ``vllm-venv``), overridden by ``$variable``."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return Path(os.environ.get(variable, cache / "searchqa-gym" / name))
