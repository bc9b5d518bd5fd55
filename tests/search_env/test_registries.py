"""The protocol registry speaks like the reward registry: ``replace=True`` and ``UnknownNameError``."""
from __future__ import annotations

import pytest

import rewards
import search_env
from search_env import SearchQAEnv, UnknownNameError, available_protocols, get_protocol, register_protocol


def test_an_unknown_protocol_raises_the_reward_registrys_error_type():
    assert UnknownNameError is rewards.UnknownNameError
    with pytest.raises(UnknownNameError) as info:
        get_protocol("search-r2")
    assert isinstance(info.value, LookupError) and isinstance(info.value, ValueError)
    known = ", ".join(available_protocols())
    assert str(info.value) == f"unknown protocol 'search-r2'; known: {known}; did you mean 'search-r1'?"
    with pytest.raises(UnknownNameError, match="unknown protocol 'no-such-dialect'; known: "):
        SearchQAEnv("no-such-dialect", world_size=20)


def test_replacing_a_protocol_needs_replace_true():
    custom = get_protocol("search-r1").with_options(name="test-registries-custom")
    register_protocol(custom, replace=True)
    register_protocol(custom)  # the same dialect again: harmless
    with pytest.raises(ValueError, match="^protocol 'test-registries-custom' is already registered; pass replace=True to replace it$"):
        register_protocol(custom.with_options(top_k=2))
    changed = custom.with_options(top_k=1)
    assert register_protocol(changed, replace=True) is changed and get_protocol("test-registries-custom") is changed


def test_the_package_exports_the_error():
    assert "UnknownNameError" in search_env.__all__ and "UnknownNameError" in rewards.__all__
