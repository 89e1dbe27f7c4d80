"""Provider prompt-cache models: one module per provider, a registry by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._registry import Registry
from ..errors import UnknownCacheModelError
from ._base import CacheModel, CacheResult
from ._reasons import REASONS, Reason, explain_reason
from .anthropic import AnthropicCache
from .bedrock import BedrockCache
from .deepseek import DeepSeekCache
from .gemini import GeminiCache
from .openai import OpenAICache
from .vllm import VLLMCache

#: Cache models by name; plugins join from the ``promptcache_nb.cache_models`` entry points.
CACHE_MODEL_REGISTRY: Registry[type[CacheModel]] = Registry("cache model", "promptcache_nb.cache_models",
                                                            unknown=UnknownCacheModelError)


def register_cache_model(cls: type[CacheModel]) -> type[CacheModel]:
    """Register a cache model class under its ``name`` (a class decorator); a package can instead declare an
    entry point in the ``promptcache_nb.cache_models`` group."""
    return CACHE_MODEL_REGISTRY.register(cls)


for _cls in (AnthropicCache, OpenAICache, DeepSeekCache, VLLMCache, GeminiCache, BedrockCache):
    register_cache_model(_cls)
del _cls


def cache_model_names() -> tuple[str, ...]:
    """Every registered cache model name, sorted."""
    return tuple(sorted(CACHE_MODEL_REGISTRY.names()))


def cache_model_class(name: str) -> type[CacheModel]:
    """The registered class of a cache model name; raises UnknownCacheModelError listing the valid ones."""
    return CACHE_MODEL_REGISTRY.lookup(name)


def check_cache_params(name: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """``params`` validated against the cache model's :attr:`~CacheModel.Options`: the options set, with
    their validated values. Raises :class:`~promptcache_nb.InvalidOptionError` (one line naming the valid
    options) on an unknown name or a wrong type."""
    cls = cache_model_class(name)
    return cls.Options.check(params, owner=f"cache model {name!r}").explicit()


def get_cache_model(name: str | CacheModel, **params: Any) -> CacheModel:
    """A fresh cache model by name (``anthropic``...), or the instance itself.

    ``params`` are the cache model's options (:attr:`CacheModel.Options`); an unknown or mistyped one
    raises :class:`~promptcache_nb.InvalidOptionError` naming the valid ones.

    Example:
        >>> import promptcache_nb as pc
        >>> pc.get_cache_model("openai", idle_ttl="10m").idle_ttl
        600.0
    """
    if isinstance(name, CacheModel):
        if params:
            raise TypeError("pass cache parameters to the cache model's constructor, not with an instance")
        return name
    return cache_model_class(name)(**params)  # the constructor checks the options


__all__ = [
    "CACHE_MODEL_REGISTRY",
    "REASONS",
    "AnthropicCache",
    "BedrockCache",
    "CacheModel",
    "CacheResult",
    "DeepSeekCache",
    "GeminiCache",
    "OpenAICache",
    "Reason",
    "VLLMCache",
    "cache_model_class",
    "cache_model_names",
    "check_cache_params",
    "explain_reason",
    "get_cache_model",
    "register_cache_model",
]
