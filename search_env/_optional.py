"""Optional packages: a missing one is reported with the extra that installs it.

The core install (``pip install searchqa-gym``) runs the environment on the built-in world with BM25;
dense retrieval, the server, parquet datasets and transformers tokenizers need extras. Importing them
inside :func:`requires_extra` turns a bare ``No module named 'faiss'`` into what to run instead.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["MissingExtraError", "requires_extra"]


class MissingExtraError(ModuleNotFoundError):
    """An optional package is not installed; the message names the extra that installs it. A
    ``ModuleNotFoundError``, so code that catches that (or ``ImportError``) still does."""


@contextlib.contextmanager
def requires_extra(extra: str, purpose: str) -> Iterator[None]:
    """Re-raise a ``ModuleNotFoundError`` from the imports in the block as :class:`MissingExtraError`
    saying ``"<purpose> needs <package>: pip install 'searchqa-gym[<extra>]'"``::

        with requires_extra("dense", "dense retrieval"):
            import faiss
    """
    try:
        yield
    except MissingExtraError:
        raise
    except ModuleNotFoundError as error:
        package = (error.name or "a package").partition(".")[0]
        raise MissingExtraError(f"{purpose} needs {package}: pip install 'searchqa-gym[{extra}]'", name=error.name) from error
