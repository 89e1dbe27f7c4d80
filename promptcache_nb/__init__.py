"""promptcache_nb — see why an LLM agent's prompt cache hits or misses, and what it costs.

The public API; everything else is internal. ``import promptcache_nb as pc``.
"""

from __future__ import annotations

from . import analysis, plots, widgets  # noqa: E402,I001 - subpackages: pc.plots.plot_savings, pc.widgets.Stepper
from ._data import data_path
from ._types import KnowledgeEntry, RequestRecord
from .analysis import Change, Observation, Prices, compare_df, efficiency, prices_for, summarize
from .analysis.calibrate import Calibration, CalibrationWarning, calibrate, load_calibration
from .analysis.gate import CacheCheck, assert_cache_stable
from .analysis.resimulate import compare_caches, resimulate
from .analysis.whatif import keep_warm, rebuilds, ttl_whatif
from .cache import (
    CacheModel,
    CacheResult,
    DeepSeekCache,
    OpenAICache,
    VLLMCache,
    cache_model_names,
    get_cache_model,
    register_cache_model,
)
from .errors import (
    APIConnectionError,
    APIError,
    AuthenticationError,
    BodyValidationError,
    ContextWindowWarning,
    ImportFormatError,
    InvalidOptionError,
    InvalidRequestError,
    KnowledgeError,
    OverloadedError,
    PriceError,
    PromptCacheError,
    PromptCacheWarning,
    RateLimitError,
    ScenarioError,
    SessionError,
    StoreError,
    StoreLockedError,
    UnknownCacheModelError,
    UnknownModelError,
    UnknownStrategyError,
    UnpricedModelWarning,
    UsageError,
)
from .importers import ImportedRequest, ImportResult
from .lab import Lab
from .live import Backend, BackendResponse, DirectSimulator, SimulatorServer, TokenCount, count_tokens
from .live.capture import Capture, capture
from .request import PrefixDiff, PreparedRequest, Segment, canonical_bytes, prepare
from .request.diff import diff
from .scenario import Scenario, ToolCall, load_scenario
from .session import KnowledgeBook, Session, Turn
from .strategies import Strategy, StrategyContext, register_strategy, strategy_names
from .tokens import (
    BPETokenizer,
    CalibratedTokenizer,
    CharsTokenizer,
    HeuristicTokenizer,
    ModelTokenizer,
    Tokenizer,
    tokenizer_family,
)
from .usage import Usage

__version__ = "0.1.0"


def __getattr__(name: str):
    # Live registries: strategies and cache models registered later are listed too.
    if name == "STRATEGIES":
        return strategy_names()
    if name == "CACHE_MODELS":
        return cache_model_names()
    if name == "AnthropicBackend":  # imports the anthropic SDK (~1.5 s): only when asked for
        from .live.anthropic_backend import AnthropicBackend

        return AnthropicBackend
    if name == "RecordingProxy":  # imports starlette, uvicorn and httpx: only when a proxy is asked for
        from .live.proxy import RecordingProxy

        return RecordingProxy
    raise AttributeError(f"module 'promptcache_nb' has no attribute {name!r}")


__all__ = [
    "APIConnectionError",
    "APIError",
    "AnthropicBackend",
    "AuthenticationError",
    "BPETokenizer",
    "Backend",
    "BackendResponse",
    "BodyValidationError",
    "CACHE_MODELS",
    "CacheCheck",
    "CacheModel",
    "CacheResult",
    "CalibratedTokenizer",
    "Calibration",
    "CalibrationWarning",
    "Capture",
    "Change",
    "CharsTokenizer",
    "ContextWindowWarning",
    "DeepSeekCache",
    "DirectSimulator",
    "HeuristicTokenizer",
    "ImportFormatError",
    "ImportResult",
    "ImportedRequest",
    "InvalidOptionError",
    "InvalidRequestError",
    "KnowledgeBook",
    "KnowledgeEntry",
    "KnowledgeError",
    "Lab",
    "ModelTokenizer",
    "Observation",
    "OpenAICache",
    "OverloadedError",
    "PrefixDiff",
    "PreparedRequest",
    "PriceError",
    "Prices",
    "PromptCacheError",
    "PromptCacheWarning",
    "RateLimitError",
    "RecordingProxy",
    "RequestRecord",
    "STRATEGIES",
    "Scenario",
    "ScenarioError",
    "Segment",
    "Session",
    "SessionError",
    "SimulatorServer",
    "StoreError",
    "StoreLockedError",
    "Strategy",
    "StrategyContext",
    "TokenCount",
    "Tokenizer",
    "ToolCall",
    "Turn",
    "UnknownCacheModelError",
    "UnknownModelError",
    "UnknownStrategyError",
    "UnpricedModelWarning",
    "Usage",
    "UsageError",
    "VLLMCache",
    "analysis",
    "assert_cache_stable",
    "cache_model_names",
    "calibrate",
    "canonical_bytes",
    "capture",
    "compare_caches",
    "compare_df",
    "count_tokens",
    "data_path",
    "diff",
    "efficiency",
    "get_cache_model",
    "keep_warm",
    "load_calibration",
    "load_scenario",
    "plots",
    "prepare",
    "prices_for",
    "rebuilds",
    "register_cache_model",
    "register_strategy",
    "resimulate",
    "strategy_names",
    "summarize",
    "tokenizer_family",
    "ttl_whatif",
    "widgets",
]
