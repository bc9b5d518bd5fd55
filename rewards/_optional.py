"""Optional packages of the model-based rewards: a missing one is reported with the extra that installs it.

(``rewards`` depends on nothing else in the project, so it keeps this small copy of the environment's
``search_env._optional`` rather than importing it.)
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["requires_extra"]


@contextlib.contextmanager
def requires_extra(extra: str, purpose: str) -> Iterator[None]:
    """Re-raise a ``ModuleNotFoundError`` from the imports in the block as a ``ModuleNotFoundError``
    saying ``"<purpose> needs <package>: pip install 'searchqa-gym[<extra>]'"``."""
    try:
        yield
    except ModuleNotFoundError as error:
        package = (error.name or "a package").partition(".")[0]
        raise ModuleNotFoundError(f"{purpose} needs {package}: pip install 'searchqa-gym[{extra}]'", name=error.name) from error
