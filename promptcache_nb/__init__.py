"""promptcache_nb — see why an LLM agent's prompt cache hits or misses, and what it costs.

The public API; everything else is internal. ``import promptcache_nb as pc``. The names a notebook uses most sit
here; the rest live in their subpackage: exceptions and warnings in ``pc.errors``, tokenizers in ``pc.tokens``,
prices and frames in ``pc.analysis``, backends in ``pc.live``, request internals in ``pc.request``, strategy and
cache-model registries in ``pc.strategies`` and ``pc.cache``. A name that moved off the top level still resolves
here, with one :class:`DeprecationWarning` naming its new spelling.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from . import advice, analysis, errors, fleet, plots, tokens, widgets  # noqa: E402,I001 - subpackages: pc.plots.plot_savings, pc.widgets.Stepper
from ._data import data_path
from .advice import advise, counterfactual, fidelity
from .analysis import Observation, compare_df, summarize
from .analysis.calibrate import calibrate
from .analysis.crosscheck import provider_crosscheck
from .analysis.gate import assert_cache_stable
from .analysis.resimulate import compare_caches, resimulate
from .analysis.whatif import keep_warm, rebuilds, ttl_whatif
from .cache import (
    AnthropicCache,
    CacheModel,
    DeepSeekCache,
    OpenAICache,
    get_cache_model,
)
from .cache import cache_model_names as _cache_model_names
from .errors import InvalidOptionError, PromptCacheError, StoreLockedError
from .ingest import ImportResult
from .ingest.capture import capture
from .lab import Lab
from .live import SimulatorServer, count_tokens
from .request import PrefixDiff
from .request.diff import diff
from .scenario import Scenario, load_scenario
from .session import Session
from .strategies import Strategy
from .strategies import strategy_names as _strategy_names
from .turn import Turn
from .usage import Usage

__version__ = "0.1.0"

#: Names that left the top level: old name -> where it lives now (relative to the package).
_MOVED = {
    **{name: f"errors.{name}" for name in (
        "APIConnectionError", "APIError", "AuthenticationError", "BodyValidationError", "CalibrationWarning",
        "ContextWindowWarning", "ImportFormatError", "InvalidRequestError", "KnowledgeError", "OverloadedError",
        "PriceError", "PromptCacheWarning", "RateLimitError", "ScenarioError", "SessionError", "StoreError",
        "UnknownCacheModelError", "UnknownModelError", "UnknownStrategyError", "UnpricedModelWarning",
        "UsageError",
    )},
    **{name: f"tokens.{name}" for name in (
        "BPETokenizer", "CalibratedTokenizer", "CharsTokenizer", "HeuristicTokenizer", "ModelTokenizer",
        "Tokenizer", "tokenizer_family",
    )},
    **{name: f"analysis.{name}" for name in (
        "Calibration", "Change", "Prices", "efficiency", "load_calibration", "prices_for",
    )},
    **{name: f"live.{name}" for name in ("Backend", "BackendResponse", "DirectSimulator", "TokenCount")},
    **{name: f"request.{name}" for name in ("PreparedRequest", "Segment", "canonical_bytes", "prepare")},
    "CacheResult": "cache.CacheResult",
    "VLLMCache": "cache.VLLMCache",  # made room for pc.fleet (issue 23); get_cache_model("vllm") is the usual way
    "cache_model_names": "cache.cache_model_names",
    "strategy_names": "strategies.strategy_names",
    "register_strategy": "strategies.register_strategy",  # plugins: the promptcache_nb.strategies entry point
    "register_cache_model": "cache.register_cache_model",  # plugins: the promptcache_nb.cache_models entry point
    "StrategyContext": "strategies.StrategyContext",
    "ImportedRequest": "readers.ImportedRequest",
    "ToolCall": "scenario.ToolCall",
    "KnowledgeBook": "session.KnowledgeBook",
    "KnowledgeEntry": "store.KnowledgeEntry",
    "RequestRecord": "pipeline.RequestRecord",
}
_warned: set[str] = set()


def __getattr__(name: str) -> Any:
    # Live registries: strategies and cache models registered later (plugins included) are listed too.
    if name == "STRATEGIES":
        return _strategy_names()
    if name == "CACHE_MODELS":
        return _cache_model_names()
    if name in ("AnthropicBackend", "RecordingProxy"):  # pc.live loads them when first asked for (heavy imports)
        return getattr(importlib.import_module(f"{__name__}.live"), name)
    new = _MOVED.get(name)
    if new is not None:
        module, _, attr = new.rpartition(".")
        value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        if name not in _warned:  # once per name: a loop over old code is not a wall of warnings
            _warned.add(name)
            warnings.warn(f"promptcache_nb.{name} moved: use pc.{new} (promptcache_nb.{new})", DeprecationWarning,
                          stacklevel=2)
        return value
    raise AttributeError(f"module 'promptcache_nb' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*__all__, "__version__"})


__all__ = [
    "AnthropicBackend",
    "AnthropicCache",
    "CACHE_MODELS",
    "CacheModel",
    "DeepSeekCache",
    "ImportResult",
    "InvalidOptionError",
    "Lab",
    "Observation",
    "OpenAICache",
    "PrefixDiff",
    "PromptCacheError",
    "RecordingProxy",
    "STRATEGIES",
    "Scenario",
    "Session",
    "SimulatorServer",
    "StoreLockedError",
    "Strategy",
    "Turn",
    "Usage",
    "advice",
    "advise",
    "analysis",
    "assert_cache_stable",
    "calibrate",
    "capture",
    "compare_caches",
    "compare_df",
    "count_tokens",
    "counterfactual",
    "data_path",
    "diff",
    "errors",
    "fidelity",
    "fleet",
    "get_cache_model",
    "keep_warm",
    "load_scenario",
    "plots",
    "provider_crosscheck",
    "rebuilds",
    "resimulate",
    "summarize",
    "tokens",
    "ttl_whatif",
    "widgets",
]
