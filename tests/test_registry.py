"""The one registry class: components by name in registration order, entry points loaded on the first miss or
listing, a broken or clashing plugin reported as a PluginWarning while everything else keeps working."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Any, ClassVar

import pytest

import promptcache_nb as pc
from promptcache_nb import _registry
from promptcache_nb._registry import Registry
from promptcache_nb.strategies.naive import Naive


class Impostor(Naive):
    name: ClassVar[str] = "naive"


class Extra(Naive):
    name: ClassVar[str] = "extra_naive"


def make(monkeypatch: pytest.MonkeyPatch, *values: str) -> Registry[Any]:
    eps = [EntryPoint(name=v.rpartition(":")[2].lower(), value=v, group="demo.group") for v in values]
    calls: list[str] = []

    def entry_points(*, group: str) -> list[EntryPoint]:
        calls.append(group)
        return eps if group == "demo.group" else []

    monkeypatch.setattr(_registry, "entry_points", entry_points)
    registry: Registry[Any] = Registry("strategy", "demo.group", unknown=pc.errors.UnknownStrategyError)
    registry.register(Naive)
    registry.calls = calls  # type: ignore[attr-defined]
    return registry


def test_a_registered_name_never_loads_the_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = make(monkeypatch, f"{__name__}:Extra")
    assert registry["naive"] is Naive and "naive" in registry
    assert registry.calls == []  # type: ignore[attr-defined]
    assert registry.lookup("extra_naive") is Extra  # a miss loads them, once
    assert registry.names() == ("naive", "extra_naive")
    assert registry.calls == ["demo.group"]  # type: ignore[attr-defined]


def test_an_unknown_name_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = make(monkeypatch)
    with pytest.raises(pc.errors.UnknownStrategyError, match=r"^unknown strategy 'nope'; valid: naive$"):
        registry.lookup("nope")


def test_a_broken_or_clashing_plugin_warns_and_the_rest_works(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = make(monkeypatch, "no_such_module_here:Thing", f"{__name__}:Impostor", f"{__name__}:Extra")
    with pytest.warns(pc.errors.PluginWarning) as caught:
        assert registry.names() == ("naive", "extra_naive")
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2
    assert "strategy plugin 'impostor'" in messages[0] and "already registered" in messages[0]
    assert "strategy plugin 'thing'" in messages[1] and "ModuleNotFoundError" in messages[1]
    assert registry["naive"] is Naive  # the built-in is never replaced by a plugin


def test_the_thin_register_functions_feed_the_registries() -> None:
    class Once(Naive):
        name: ClassVar[str] = "registry_test_once"

    try:
        assert pc.strategies.register_strategy(Once) is Once
        assert pc.STRATEGIES[-1] == "registry_test_once"
        assert pc.strategies.get_strategy("registry_test_once").options == Naive.Options()
    finally:
        pc.strategies.STRATEGY_REGISTRY._items.pop("registry_test_once")
    assert "registry_test_once" not in pc.STRATEGIES
