"""The one registry type: adding, a clash, a module imported again, built-in names that load on their
first lookup, and the unknown-name error every registry raises."""
from __future__ import annotations

import sys

import pytest

from rewards import Registry, UnknownNameError
from rewards.registry import UnknownNameError as FromPresetRegistry


def first(x):
    return x


def test_add_lookup_and_names():
    table: Registry[object] = Registry("widget")
    assert table.add("one", first) is first and table.lookup("one") is first and table["one"] is first
    assert table.add("one", first) is first  # the same value again: harmless
    with pytest.raises(ValueError, match=r"^widget 'one' is already registered \(tests.rewards.test_name_registry.first\); "
                                         r"pass replace=True to replace it$"):
        table.add("one", len)
    assert table.add("one", len, replace=True) is len
    with pytest.raises(ValueError, match="^a widget needs a non-empty name, got ''$"):
        table.add("", first)
    with pytest.raises(UnknownNameError) as info:
        table.lookup("onw")
    assert str(info.value) == "unknown widget 'onw'; known: one; did you mean 'one'?"
    copy = table.copy()
    copy.add("two", first)
    assert (copy.kind, copy.names(), table.names()) == ("widget", ["one", "two"], ["one"])


def test_a_definition_imported_again_replaces_the_old_one():
    namespace: dict = {"__name__": "plugin"}
    code = "def score(x):\n    return x\n"
    exec(code, namespace)
    old = namespace["score"]
    exec(code, namespace)  # the same module imported again: a new function defined at the same place
    table: Registry[object] = Registry("widget")
    table.add("score", old)
    assert table.add("score", namespace["score"]) is namespace["score"]

    def score(x):  # defined in a function: another definition each call, never taken for the old one
        return x

    with pytest.raises(ValueError, match="already registered"):
        table.add("score", score)


def test_a_built_in_name_is_listed_and_its_module_imported_on_first_lookup(tmp_path, monkeypatch):
    (tmp_path / "lazy_widget_module.py").write_text(
        "from tests.rewards.test_name_registry import WIDGETS\nWIDGETS.add('lazy', 'loaded')\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "lazy_widget_module" not in sys.modules
    assert WIDGETS.has("lazy") and "lazy" not in WIDGETS and WIDGETS.names() == ["lazy"]
    assert WIDGETS.lookup("lazy") == "loaded" and "lazy_widget_module" in sys.modules
    sys.modules.pop("lazy_widget_module")


def test_the_error_is_one_type_wherever_it_is_imported_from():
    assert FromPresetRegistry is UnknownNameError and issubclass(UnknownNameError, (LookupError, ValueError))


WIDGETS: Registry[str] = Registry("widget", built_in={"lazy": "lazy_widget_module"})
