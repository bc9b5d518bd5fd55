"""``agents`` exports its extension hooks and every built-in algorithm's config, each the object its own
module defines, and the names it lists all resolve."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

import agents  # noqa: E402


def test_every_listed_name_resolves() -> None:
    missing = [name for name in agents.__all__ if getattr(agents, name, None) is None]
    assert missing == []


def test_the_extension_hooks_are_the_registries_own() -> None:
    from agents.learners.registry import register_advantage, register_algorithm, register_policy_loss
    from agents.rollout.engines import register_engine
    from agents.training.backends.base import register_backend
    from agents.training.callbacks import Callback

    hooks = {"register_algorithm": register_algorithm, "register_advantage": register_advantage,
             "register_policy_loss": register_policy_loss, "register_engine": register_engine,
             "register_backend": register_backend, "Callback": Callback}
    assert {name: getattr(agents, name) for name in hooks} == hooks
    assert set(hooks) <= set(agents.__all__)


def test_every_built_in_algorithms_config_is_exported() -> None:
    from agents.learners import ALGORITHMS

    configs = {cls.config_class.__name__: cls.config_class for cls in ALGORITHMS.values() if cls.__module__.startswith("agents.")}
    assert configs and {name: getattr(agents, name, None) for name in configs} == configs
    assert set(configs) <= set(agents.__all__) and "AlgorithmConfig" in agents.__all__
