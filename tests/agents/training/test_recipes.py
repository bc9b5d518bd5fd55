"""The seed systems' recipes (agents/configs/*.yaml): each loads with yaml.safe_load into its algorithm's
config dataclass, uses only real fields with values of the field's type, names a real protocol and real
reward presets, leaves the model to the user, and agrees with the training facts of PROTOCOLS.md."""
from __future__ import annotations

import types
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, skip_without

skip_without("agents", "torch", "yaml")
import yaml  # noqa: E402

from rewards.registry import get as get_preset  # noqa: E402
from agents.learners import build_algorithm, lookup_algorithm  # noqa: E402
from search_env.protocols import get_protocol  # noqa: E402

CONFIGS = REPO_ROOT / "agents" / "configs"
RECIPES = ["r-search-grpo", "r1-searcher-reinforce-pp-baseline", "research-grpo", "search-r1-grpo", "search-r1-ppo"]

# Training facts stated in ../shared/PROTOCOLS.md that each recipe must carry.
FACTS = {
    "search-r1-ppo": dict(protocol="search-r1", gamma=1.0, lam=1.0, kl_estimator="k1", kl_in_reward=True, kl_coef=0.001,
                          critic_lr=1e-5, learning_rate=1e-6, clip_low=0.2, clip_high=0.2, loss_agg_mode="token-mean"),
    "search-r1-grpo": dict(protocol="search-r1", group_size=5, kl_estimator="k3", kl_in_reward=False, kl_coef=0.001,
                           learning_rate=1e-6, clip_low=0.2, clip_high=0.2, loss_agg_mode="token-mean"),
    "r1-searcher-reinforce-pp-baseline": dict(protocol="r1-searcher", group_size=16, learning_rate=2e-6,
                                              kl_estimator="k1", kl_in_reward=True, max_turns=8),
    "research-grpo": dict(protocol="research", reward="research", group_size=5, kl_estimator="k3", kl_in_reward=False,
                          kl_coef=0.001, learning_rate=1e-6),
    "r-search-grpo": dict(protocol="r-search", reward="r-search", group_size=5, kl_estimator="k3", kl_in_reward=False,
                          kl_coef=0.001, learning_rate=1e-6, max_turns=4),
}


def _load(name: str) -> dict:
    return yaml.safe_load((CONFIGS / f"{name}.yaml").read_text(encoding="utf-8"))


def _matches(value: object, annotation: object) -> bool:
    """Whether a YAML value fits a dataclass field's annotation (int is accepted for float)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin or annotation)


def test_the_recipe_set():
    assert sorted(p.stem for p in CONFIGS.glob("*.yaml")) == RECIPES


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_loads_into_its_config(name):
    data = _load(name)
    algo_cls, config_cls = lookup_algorithm(data["algo"])
    hints = typing.get_type_hints(config_cls)
    known = {f.name for f in fields(config_cls)}
    assert not set(data) - known, f"{name}: not fields of {config_cls.__name__}: {sorted(set(data) - known)}"
    for key, value in data.items():
        assert _matches(value, hints[key]), f"{name}: {key}={value!r} is not a {hints[key]}"  # e.g. 1e-6 reads as a str
    config = config_cls(**data)
    assert config.model == "???"  # left to the user; the CLI refuses to run with it
    assert isinstance(build_algorithm(config), algo_cls)
    get_protocol(config.protocol)
    presets = [config.reward] if config.reward else []
    presets += [preset for _, preset in config.reward_stages or []]
    assert presets, f"{name} names no reward"
    for preset in presets:
        get_preset(preset)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_carries_the_papers_training_facts(name):
    _, config_cls = lookup_algorithm(_load(name)["algo"])
    config = config_cls(**_load(name))
    assert {key: getattr(config, key) for key in FACTS[name]} == FACTS[name]


def test_r1_searcher_switches_from_stage_one_to_stage_two():
    stages = _load("r1-searcher-reinforce-pp-baseline")["reward_stages"]
    assert [preset for _, preset in stages] == ["r1-searcher-stage1", "r1-searcher-stage2"]
    assert stages[0][0] == 0 < stages[1][0]
