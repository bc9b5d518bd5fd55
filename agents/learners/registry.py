"""The algorithms ``--algo`` and recipes can name: a decorator adds one, so an algorithm defined in a
user's own module is reachable exactly as the built-in ones are::

    @register_algorithm
    class MyPG(Algorithm):
        name = "my-pg"
        config_class = MyPGConfig
        ...

(``python -m agents.train --import my_module --algo my-pg`` imports the module first.)
"""
from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from rewards import UnknownNameError

if TYPE_CHECKING:
    from agents.learners.base import Algorithm

__all__ = ["ALGORITHMS", "lookup_algorithm", "register_algorithm"]

ALGORITHMS: dict[str, type[Algorithm]] = {}
"""Algorithm name (``--algo``) -> algorithm class (its config class is ``cls.config_class``)."""

A = TypeVar("A", bound="type[Algorithm]")


def register_algorithm(cls: A, *, replace: bool = False) -> A:
    """Register ``cls`` under its ``name``; returns it, so it serves as a class decorator.

    Raises:
        ValueError: ``cls`` has no name, or the name is taken by another class (pass ``replace=True`` to
            override it on purpose).
    """
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name: set the class attribute name = '...'")
    known = ALGORITHMS.get(cls.name)
    if known is not None and known is not cls and not replace:
        raise ValueError(f"algorithm {cls.name!r} is already registered ({known.__module__}.{known.__qualname__}); "
                         "pass replace=True to override it")
    ALGORITHMS[cls.name] = cls
    return cls


def lookup_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class registered as ``name``.

    Raises:
        UnknownNameError: no algorithm has that name (the message lists the known ones).
    """
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise UnknownNameError("algorithm", name, ALGORITHMS) from None
