"""The one registry type of the project, and the error of a name it does not hold.

Every table a user's module can add to by name - reward presets, protocols, algorithms, advantage
estimators, policy losses, rollout engines, training backends, search sources - is a :class:`Registry`,
so they all register, refuse a clash and report an unknown name the same way.

It lives here, in the lowest layer, because the dependency rule (benchmarks -> agents -> search_env ->
rewards) lets every layer import ``rewards`` and ``rewards`` import nothing of the project's: a module
of its own (this one imports nothing but the standard library) rather than inside the preset registry,
which uses it like every other table.
"""
from __future__ import annotations

import difflib
from importlib import import_module
from typing import Any, Generic, Iterable, Mapping, TypeVar

__all__ = ["Registry", "UnknownNameError", "defined_at", "same_definition"]

T = TypeVar("T")


class UnknownNameError(LookupError, ValueError):
    """A registry holds nothing of that name: both a failed lookup and a bad argument.

    Every registry of the project raises it, with one message shape: ``unknown <kind> 'x'; known: a, b,
    c``, followed by ``did you mean 'y'?`` when a known name is a near miss. ``kind``, ``name`` and
    ``known`` keep the parts.
    """

    def __init__(self, kind: str, name: object, known: Iterable[str]) -> None:
        self.kind, self.name, self.known = kind, name, sorted(known)
        message = f"unknown {kind} {name!r}; known: {', '.join(self.known)}"
        close = difflib.get_close_matches(name, self.known, n=1) if isinstance(name, str) else []
        if close:
            message += f"; did you mean {close[0]!r}?"
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:  # rebuilt from its parts (an environment worker pickles errors)
        return type(self), (self.kind, self.name, self.known)


class Registry(dict[str, T], Generic[T]):
    """Name -> plug-in (a function, a class, a dialect ...) of one ``kind``.

    A ``dict``, so that code which reads a table, or a test that patches or pops an entry, works as on
    any mapping; plug-ins go in through :meth:`add` and come out through :meth:`lookup`.

    ``built_in`` maps names to the modules that register them when imported: such a module (a heavy
    one: DeepSpeed's backend, vLLM's engine) loads on the first lookup of its name, and
    :meth:`names` lists its names before then.
    """

    def __init__(self, kind: str, *, built_in: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.kind = kind
        self.built_in = dict(built_in or {})

    def add(self, name: str, value: T, *, replace: bool = False) -> T:
        """Register ``value`` as ``name`` and return it.

        Registering an equal value again, or a function or class defined at the same place (a module
        imported again), replaces it silently; a name taken by another value raises ``ValueError`` unless
        ``replace=True``, so that two plug-ins cannot silently clash.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty name, got {name!r}")
        known = self.get(name)
        if known is not None and not replace and not (known is value or known == value or same_definition(known, value)):
            where = defined_at(known)
            owner = f" ({where})" if where else ""
            raise ValueError(f"{self.kind} {name!r} is already registered{owner}; pass replace=True to replace it")
        self[name] = value
        return value

    def lookup(self, name: str) -> T:
        """The value registered as ``name`` (importing its built-in module first when it has one);
        :class:`UnknownNameError`, one line with the known names, for another name."""
        if name not in self and name in self.built_in:
            import_module(self.built_in[name])  # registers it
        try:
            return self[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name
            raise UnknownNameError(self.kind, name, self.names()) from None

    def has(self, name: str) -> bool:
        """Whether ``name`` is registered, or built in and registered on its first lookup (imports nothing)."""
        return name in self or name in self.built_in

    def names(self) -> list[str]:
        """Every name, the built-in ones not yet imported included, sorted."""
        return sorted({*self, *self.built_in})

    def copy(self) -> Registry[T]:
        """A registry of the same kind with the same entries (a test's scratch copy)."""
        other: Registry[T] = Registry(self.kind, built_in=self.built_in)
        other.update(self)
        return other


def defined_at(value: object) -> str | None:
    """``module.qualified.name`` of a function or class (None for another value)."""
    qualname = getattr(value, "__qualname__", None)
    return f"{getattr(value, '__module__', '?')}.{qualname}" if isinstance(qualname, str) else None


def same_definition(known: object, value: object) -> bool:
    """Whether both are the same definition: one module imported twice (``--import`` of a module already
    imported under another name, a reload) defines its functions and classes anew."""
    where = defined_at(known)
    return where is not None and where == defined_at(value) and "<locals>" not in where
