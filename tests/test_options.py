"""Typed options: strategy and cache-model parameters are pydantic models with ``extra="forbid"``, checked
where they enter (``lab.session``, ``get_cache_model``), so a misspelt one fails with one line naming the
valid ones; configs stored before the check still load."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb.cache import cache_model_class, cache_model_names, check_cache_params
from promptcache_nb.strategies import strategy_class, strategy_names
from promptcache_nb.strategies._lore import DELTA_BUDGET_TOKENS

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
HOST = "You are the billing support assistant. Answer precisely and cite the ticket. " * 150


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_misspelt_strategy_option_names_the_valid_ones() -> None:
    with pc.Lab(progress=False) as lab:
        with pytest.raises(pc.InvalidOptionError) as info:
            lab.session("durable_delta", system=HOST, strategy_params={"delta_budget_token": 400})
        assert one_line(info) == (
            "strategy 'durable_delta': unknown option 'delta_budget_token' (did you mean 'delta_budget_tokens'?); "
            "valid options: delta_budget_tokens")
        assert info.value.options == ("delta_budget_token",) and info.value.valid == ("delta_budget_tokens",)
        with pytest.raises(pc.InvalidOptionError, match=r"strategy 'naive': unknown option 'delta_budget_token'; "
                                                        r"valid options: \(none\)"):
            lab.session(strategy_params={"delta_budget_token": 400})  # naive takes no options at all
        assert lab.sessions().empty  # nothing was stored


def test_misspelt_cache_option_names_the_valid_ones() -> None:
    with pytest.raises(pc.InvalidOptionError) as info:
        pc.get_cache_model("openai", idle_tll="5m")
    assert one_line(info) == (
        "cache model 'openai': unknown option 'idle_tll' (did you mean 'idle_ttl'?); valid options: idle_ttl, "
        "idle_ttl_max, increment, max_age, min_tokens, prompt_cache_key, retention, routing_tokens")
    assert isinstance(info.value, ValueError)  # catchable as before the check (a ValueError for a bad value)
    with pc.Lab(progress=False) as lab, pytest.raises(pc.InvalidOptionError, match="'num_block'"):
        lab.session(cache="vllm", model="claude-sonnet-4-5", system=HOST, cache_params={"num_block": 64})


@pytest.mark.parametrize(("name", "params", "problem"), [
    ("openai", {"idle_ttl": "5 mins"}, "option 'idle_ttl'='5 mins': not a duration"),
    ("openai", {"retention": "1d"}, "option 'retention'='1d': Input should be 'in_memory' or '24h'"),
    ("vllm", {"num_blocks": "many"}, "option 'num_blocks'='many': Input should be a valid integer"),
    ("vllm", {"block_size": 0}, "option 'block_size'=0: Input should be greater than or equal to 1"),
    ("anthropic", {"client_ttls": ("5m", "2h")}, "option 'client_ttls'"),
    ("deepseek", {"lifetime": [6]}, "option 'lifetime'=[6]: not a duration"),
])
def test_a_wrong_value_fails_in_one_line(name: str, params: dict, problem: str) -> None:
    with pytest.raises(pc.InvalidOptionError) as info:
        pc.get_cache_model(name, **params)
    assert problem in one_line(info)
    assert "valid options: " in str(info.value)


def test_valid_values_are_coerced_and_kept() -> None:
    assert pc.get_cache_model("openai", idle_ttl=timedelta(minutes=3)).idle_ttl == 180.0
    assert pc.get_cache_model("openai", idle_ttl=600, max_age="2h").idle_ttl == 600.0
    assert check_cache_params("vllm", {"num_blocks": "64"}) == {"num_blocks": 64}
    assert check_cache_params("vllm", None) == {}  # defaults are not spelled out
    with pc.Lab(progress=False) as lab:
        s = lab.session("durable_delta", system=HOST, strategy_params={"delta_budget_tokens": "50"})
        assert s.config["strategy_params"] == {"delta_budget_tokens": 50}


@pytest.mark.parametrize("name", cache_model_names())
def test_cache_options_are_declared_once(name: str) -> None:
    """The nested Options model is the one declaration: the signature and the docstring's Args come from it,
    and the instance reads its values from ``self.options``."""
    cls = cache_model_class(name)
    params = {p.name: p.default for p in inspect.signature(cls).parameters.values()
              if p.kind is inspect.Parameter.KEYWORD_ONLY}
    fields = cls.Options.model_fields
    assert set(fields) == set(params)
    assert issubclass(cls.Options, pc.CacheModel.Options) and cls.Options is not pc.CacheModel.Options
    for field_name, field in fields.items():
        assert field.description, f"{name}.{field_name} has no description"
        assert field.default == params[field_name], field_name
        assert f"    {field_name} (default " in (cls.__doc__ or ""), field_name
    assert cls.Options.model_config["extra"] == "forbid"
    assert cls().options == cls.Options()


def test_constructor_keywords_build_the_options() -> None:
    cache = pc.AnthropicCache(lookback=5, client_ttls=("1h", "5m"))
    assert cache.options.lookback == 5 and cache.options.client_ttls == ("1h", "5m")
    with pytest.raises(pc.InvalidOptionError) as info:
        pc.OpenAICache(idle_ttl="2h")
    assert one_line(info).startswith("cache model 'openai': option 'idle_ttl_max'='1h': idle_ttl (2h) exceeds "
                                     "idle_ttl_max (1h)")
    with pytest.raises(pc.InvalidOptionError) as info:
        pc.OpenAICache(idle_ttl="2h", idle_ttl_max="3h")
    assert one_line(info).startswith("cache model 'openai': option 'max_age'='1h': idle_ttl (2h) exceeds max_age")
    with pytest.raises(pc.InvalidOptionError, match="strategy 'durable_delta': unknown option 'budget'"):
        strategy_class("durable_delta")(budget=3)
    assert strategy_class("durable_delta")(delta_budget_tokens=7).options.delta_budget_tokens == 7


@pytest.mark.parametrize("name", strategy_names())
def test_strategy_options_forbid_unknown_names(name: str) -> None:
    options = strategy_class(name).Options
    assert options.model_config["extra"] == "forbid"
    assert all(f.description for f in options.model_fields.values())
    expected = {"delta_budget_tokens"} if name in ("volatile_delta", "durable_delta") else set()
    assert set(options.model_fields) == expected
    if expected:
        assert options.model_fields["delta_budget_tokens"].default == DELTA_BUDGET_TOKENS


def test_a_config_stored_before_the_check_still_loads(tmp_path: Path) -> None:
    """A session stored with a misspelt option (silently ignored then) resumes and steps as it did."""
    db = tmp_path / "old.duckdb"
    with pc.Lab(db, progress=False) as lab:
        s = lab.session("durable_delta", system=HOST, start=T0, strategy_params={"delta_budget_tokens": 400})
        s.step("hello", reply="hi")
        old = {**s.config, "strategy_params": {"delta_budget_token": 400}, "cache_params": {}}
        lab.store.update_session_config(s.id, old)
        sid = s.id
    with pc.Lab(db, progress=False) as lab:
        s = lab.session(id=sid)
        t = s.step("again", reply="ok")
        assert t.index == 1 and t.usage.cache_read_input_tokens > 0


def test_resimulate_checks_cache_params() -> None:
    with pc.Lab(progress=False) as lab:
        s = lab.session(system=HOST, start=T0)
        s.step("hello", reply="hi")
        with pytest.raises(pc.InvalidOptionError, match="'lifetme'.*did you mean 'lifetime'"):
            pc.resimulate(lab, s.id, cache="deepseek", lifetme="1h")
        assert len(pc.resimulate(lab, s.id, cache="deepseek", lifetime="1h")) == 1
