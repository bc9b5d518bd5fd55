"""The algorithms ``--algo`` and recipes can name, and the advantage estimators and policy losses they
are built from: a decorator adds one, so an algorithm defined in a user's own module is reachable exactly
as the built-in ones are::

    @register_algorithm
    class MyPG(Algorithm):
        name = "my-pg"
        config_class = MyPGConfig
        ...

(``python -m agents.train --import my_module --algo my-pg`` imports the module first.)

An algorithm that differs from another only in its advantage or its surrogate is one registered function
and a subclass naming it (as verl's ``register_adv_est`` / ``register_policy_loss``)::

    @register_advantage("my-adv")
    def my_advantage(batch, scores, config):      # -> (B, T) advantages, 0 off the trained tokens
        ...

    @register_policy_loss("my-loss")
    def my_loss(logprobs, old_logprobs, advantages, mask, config):   # -> core.PolicyLossTerms
        ...

A group-relative algorithm (:class:`~agents.learners.grpo.GRPO` and its subclasses) reads its estimator
from ``advantage_estimator``; every algorithm reads its surrogate from ``policy_loss_name``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, TypeVar

from rewards.name_registry import Registry

if TYPE_CHECKING:
    import torch

    from agents.learners.base import Algorithm
    from agents.learners.core import PolicyLossTerms

__all__ = [
    "ADVANTAGES", "ALGORITHMS", "AdvantageFn", "POLICY_LOSSES", "PolicyLossFn", "lookup_advantage", "lookup_algorithm",
    "lookup_policy_loss", "register_advantage", "register_algorithm", "register_policy_loss",
]

AdvantageFn = Callable[..., "torch.Tensor"]
"""``fn(batch, scores, config) -> advantages``: ``batch`` a :class:`~agents.rollout.batch.TrainBatch`,
``scores`` its (B,) episode scores as the algorithm shaped them (overlong penalty, KL in the reward),
``config`` the algorithm's config; returns (B, T) advantages, 0 on positions that are not trained."""

PolicyLossFn = Callable[..., "PolicyLossTerms"]
"""``fn(logprobs, old_logprobs, advantages, mask, config) -> PolicyLossTerms``: (B, T) tensors (``logprobs``
with grad, ``mask`` the trained mask) and the algorithm's config; the per-token loss it returns is
aggregated, weighted and logged by :meth:`~agents.learners.base.Algorithm.loss`."""

ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")
"""Advantage estimator name -> function (:data:`AdvantageFn`)."""

POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
"""Policy loss name -> function (:data:`PolicyLossFn`)."""

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")
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
    return ALGORITHMS.add(cls.name, cls, replace=replace)


def lookup_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class registered as ``name``.

    Raises:
        UnknownNameError: no algorithm has that name (the message lists the known ones).
    """
    return ALGORITHMS.lookup(name)


F = TypeVar("F", bound=Callable[..., Any])


def _registrar(table: Registry[Any], name: str, replace: bool) -> Callable[[F], F]:
    """A decorator adding its function to ``table`` under ``name`` (the name checked at once)."""
    if not name:
        raise ValueError(f"a {table.kind} needs a non-empty name")

    def add(fn: F) -> F:
        return table.add(name, fn, replace=replace)

    return add


def register_advantage(name: str, *, replace: bool = False) -> Callable[[F], F]:
    """Decorator registering an advantage estimator (:data:`AdvantageFn`) under ``name``.

    Raises:
        ValueError: the name is empty, or taken by another function (pass ``replace=True`` to override it).
    """
    return _registrar(ADVANTAGES, name, replace)


def lookup_advantage(name: str) -> AdvantageFn:
    """The advantage estimator registered as ``name``.

    Raises:
        UnknownNameError: none has that name (the message lists the known ones).
    """
    return ADVANTAGES.lookup(name)


def register_policy_loss(name: str, *, replace: bool = False) -> Callable[[F], F]:
    """Decorator registering a policy loss (:data:`PolicyLossFn`) under ``name``.

    Raises:
        ValueError: the name is empty, or taken by another function (pass ``replace=True`` to override it).
    """
    return _registrar(POLICY_LOSSES, name, replace)


def lookup_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name``.

    Raises:
        UnknownNameError: none has that name (the message lists the known ones).
    """
    return POLICY_LOSSES.lookup(name)

