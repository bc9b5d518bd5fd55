"""The reward registry's unknown-name error: the type every registry of the project raises."""
from __future__ import annotations

import pickle

import pytest

import rewards


def test_an_unknown_preset_is_a_lookup_error_and_a_value_error_listing_the_known_names():
    with pytest.raises(rewards.UnknownNameError) as info:
        rewards.score("search-r2", "x", ["y"])
    error = info.value
    assert isinstance(error, LookupError) and isinstance(error, ValueError)
    known = ", ".join(rewards.available())
    assert str(error) == f"unknown reward preset 'search-r2'; known: {known}; did you mean 'search-r1'?"
    assert (error.kind, error.name, error.known) == ("reward preset", "search-r2", rewards.available())


def test_a_name_near_nothing_gets_no_suggestion():
    with pytest.raises(rewards.UnknownNameError) as info:
        rewards.value_range("zzzzzz")
    assert str(info.value) == f"unknown reward preset 'zzzzzz'; known: {', '.join(rewards.available())}"


def test_the_old_name_is_the_same_type_and_the_error_survives_pickling():
    assert rewards.UnknownPresetError is rewards.UnknownNameError
    error = rewards.UnknownNameError("reward preset", "serch-r1", ["search-r1", "research"])
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is rewards.UnknownNameError and str(copy) == str(error)
    assert str(error) == "unknown reward preset 'serch-r1'; known: research, search-r1; did you mean 'search-r1'?"


def test_replacing_a_preset_needs_replace_true():
    rewards.register("test-registry-replace", lambda response, golds, **_: 1.0, replace=True)
    with pytest.raises(ValueError, match="^reward preset 'test-registry-replace' is already registered .*; pass replace=True to replace it$"):
        rewards.register("test-registry-replace", lambda response, golds, **_: 2.0)
    rewards.register("test-registry-replace", lambda response, golds, **_: 2.0, replace=True)
    assert rewards.score("test-registry-replace", "x", ["y"]).total == 2.0
