"""Provider prompt-cache models: one module per provider, a registry by name."""

from __future__ import annotations

from typing import Any

from ..errors import UnknownCacheModelError
from ._base import REASONS, CacheModel, CacheResult
from .anthropic import AnthropicCache
from .deepseek import DeepSeekCache
from .openai import OpenAICache
from .vllm import VLLMCache

_REGISTRY: dict[str, type[CacheModel]] = {
    cls.name: cls for cls in (AnthropicCache, OpenAICache, DeepSeekCache, VLLMCache)
}


def register_cache_model(cls: type[CacheModel]) -> type[CacheModel]:
    _REGISTRY[cls.name] = cls
    return cls


def cache_model_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def get_cache_model(name: str | CacheModel, **params: Any) -> CacheModel:
    """A fresh cache model by name (``anthropic``...), or the instance itself."""
    if isinstance(name, CacheModel):
        return name
    cls = _REGISTRY.get(name)
    if cls is None:
        raise UnknownCacheModelError(name, list(_REGISTRY))
    return cls(**params)


__all__ = [
    "REASONS",
    "AnthropicCache",
    "CacheModel",
    "CacheResult",
    "DeepSeekCache",
    "OpenAICache",
    "VLLMCache",
    "cache_model_names",
    "get_cache_model",
    "register_cache_model",
]
