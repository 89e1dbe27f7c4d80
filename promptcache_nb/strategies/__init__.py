"""Context strategies: one module per design, each citing the system it reproduces; a registry."""

from __future__ import annotations

from typing import Any

from .._registry import Registry
from ..errors import UnknownStrategyError
from ._base import DeltaTable, Strategy, StrategyContext
from .append_only import AppendOnly
from .clock_at_tail import ClockAtTail
from .clock_in_system import ClockInSystem
from .durable_delta import DurableDelta
from .naive import Naive
from .rewrite_knowledge import RewriteKnowledge
from .volatile_delta import VolatileDelta

#: Strategies by name, in teaching order; plugins join from the ``promptcache_nb.strategies`` entry points.
STRATEGY_REGISTRY: Registry[type[Strategy]] = Registry("strategy", "promptcache_nb.strategies",
                                                       unknown=UnknownStrategyError)


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    """Register a strategy class under its ``name`` (a class decorator); a package can instead declare an
    entry point in the ``promptcache_nb.strategies`` group."""
    return STRATEGY_REGISTRY.register(cls)


# Teaching order: each design fixes what the previous one breaks.
for _cls in (Naive, ClockInSystem, ClockAtTail, AppendOnly, RewriteKnowledge, VolatileDelta, DurableDelta):
    register_strategy(_cls)
del _cls


def strategy_names() -> tuple[str, ...]:
    """Names in teaching order (the order they were registered; plugins last)."""
    return STRATEGY_REGISTRY.names()


def get_strategy(name: str | Strategy, **options: Any) -> Strategy:
    """A strategy by name, built with ``options`` (or the instance itself)."""
    if isinstance(name, Strategy):
        return name
    return strategy_class(name)(**options)


def strategy_class(name: str) -> type[Strategy]:
    """The registered class of a strategy name; raises UnknownStrategyError listing the valid ones."""
    return STRATEGY_REGISTRY.lookup(name)


__all__ = [
    "STRATEGY_REGISTRY", "DeltaTable", "Strategy", "StrategyContext", "get_strategy", "register_strategy",
    "strategy_class", "strategy_names",
]
