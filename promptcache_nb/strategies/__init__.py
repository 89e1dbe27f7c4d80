"""Context strategies: one module per design, each citing the system it reproduces; a registry."""

from __future__ import annotations

from ..errors import UnknownStrategyError
from ._base import DeltaTable, Strategy, StrategyContext
from .append_only import AppendOnly
from .clock_at_tail import ClockAtTail
from .clock_in_system import ClockInSystem
from .durable_delta import DurableDelta
from .naive import Naive
from .rewrite_knowledge import RewriteKnowledge
from .volatile_delta import VolatileDelta

_REGISTRY: dict[str, type[Strategy]] = {}


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    _REGISTRY[cls.name] = cls
    return cls


# Teaching order: each design fixes what the previous one breaks.
for _cls in (Naive, ClockInSystem, ClockAtTail, AppendOnly, RewriteKnowledge, VolatileDelta, DurableDelta):
    register_strategy(_cls)


def strategy_names() -> tuple[str, ...]:
    """Names in teaching order (the order they were registered)."""
    return tuple(_REGISTRY)


def get_strategy(name: str | Strategy) -> Strategy:
    if isinstance(name, Strategy):
        return name
    cls = _REGISTRY.get(name)
    if cls is None:
        raise UnknownStrategyError(name, list(_REGISTRY))
    return cls()


def strategy_class(name: str) -> type[Strategy]:
    if name not in _REGISTRY:
        raise UnknownStrategyError(name, list(_REGISTRY))
    return _REGISTRY[name]


__all__ = [
    "DeltaTable", "Strategy", "StrategyContext", "get_strategy", "register_strategy",
    "strategy_class", "strategy_names",
]
