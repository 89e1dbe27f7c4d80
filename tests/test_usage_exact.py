"""Usage figures are exact on anyone's logs (issue 21): server-side compaction's iterations counted, an unreported
TTL split kept unknown and named, counts of any size stored, bad counts refused by name, and prices never a
look-alike."""

from __future__ import annotations

import math
import warnings
from datetime import UTC, datetime

import duckdb
import pytest

import promptcache_nb as pc
from promptcache_nb.analysis import request_prices, resimulate
from promptcache_nb.analysis.prices import price_model_id, prices_for
from promptcache_nb.dialects import usage_from_anthropic, usage_from_openai
from promptcache_nb.errors import ContextWindowWarning, PromptCacheError, UnpricedModelWarning, UsageError
from promptcache_nb.pipeline import REPORTED_COST_SOURCE
from promptcache_nb.store import _migrations
from promptcache_nb.usage import MAX_TOKENS, TTL_SPLIT_UNKNOWN_NOTE, Usage

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def anthropic_body(model: str = "claude-sonnet-4-6") -> dict:
    return {"model": model, "max_tokens": 4096,
            "system": [{"type": "text", "text": "You are a helpful assistant. Be very brief."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Now say hello.",
                                                       "cache_control": {"type": "ephemeral", "ttl": "5m"}}]}]}


def chat_body(model: str) -> dict:
    return {"model": model, "messages": [{"role": "system", "content": "You are a billing agent."},
                                         {"role": "user", "content": "Reconcile the March ledger."}]}


# -- server-side compaction: usage.iterations ---------------------------------------------------------------
#: The response usage of a threshold compaction, in the shape the compaction docs give ("Understanding usage"):
#: the top level is the message iteration (180 in, 8 out, nothing cached); the compaction iteration wrote the
#: whole 55,096-token prefix to the cache. These are the figures of a recorded claude-sonnet-4-6 call.
COMPACTION_USAGE = {
    "input_tokens": 180, "output_tokens": 8, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0,
    "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
    "iterations": [
        {"type": "compaction", "input_tokens": 100, "output_tokens": 82, "cache_read_input_tokens": 0,
         "cache_creation_input_tokens": 55096,
         "cache_creation": {"ephemeral_5m_input_tokens": 55096, "ephemeral_1h_input_tokens": 0}},
        {"type": "message", "input_tokens": 180, "output_tokens": 8, "cache_read_input_tokens": 0,
         "cache_creation_input_tokens": 0,
         "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}},
    ],
    "service_tier": "standard",
}


def test_compaction_iterations_are_counted_as_the_docs_define():
    # the docs' own example: the top level (23,000 in / 1,000 out) leaves out the 180,000 / 3,500 compaction
    docs = {"input_tokens": 23000, "output_tokens": 1000,
            "iterations": [{"type": "compaction", "input_tokens": 180000, "output_tokens": 3500},
                           {"type": "message", "input_tokens": 23000, "output_tokens": 1000}]}
    u = usage_from_anthropic(docs, source="imported")
    assert (u.input_tokens, u.output_tokens) == (203000, 4500)  # the sum across all iterations
    u = usage_from_anthropic(COMPACTION_USAGE, source="imported")
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens, u.output_tokens) == (
        280, 0, 55096, 90)
    assert (u.cache_creation_5m_input_tokens, u.cache_creation_1h_input_tokens) == (55096, 0)
    assert u.raw == COMPACTION_USAGE  # the payload is kept unchanged


def test_iterations_without_a_compaction_leave_the_top_level_as_reported():
    # with the beta on, every response carries iterations; without a new compaction the top level is exact
    plain = {"input_tokens": 40, "output_tokens": 5, "cache_read_input_tokens": 1200, "cache_creation_input_tokens": 0,
             "iterations": [{"type": "message", "input_tokens": 40, "output_tokens": 5,
                             "cache_read_input_tokens": 1200, "cache_creation_input_tokens": 0}]}
    u = usage_from_anthropic(plain)
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens, u.output_tokens) == (
        40, 1200, 0, 5)


def test_a_compaction_call_costs_what_the_api_billed(tmp_path):
    with pc.Lab(tmp_path / "c.duckdb", progress=False) as lab:
        s = lab.session(model="claude-sonnet-4-6")
        t = s.record(anthropic_body(), at=T0, usage=COMPACTION_USAGE)
        # 55,096 written at $3.75/MTok + 280 in at $3 + 90 out at $15: $0.21, not the top level's $0.0007
        assert t.cost_usd == pytest.approx(0.2088, abs=1e-4)
        row = lab.sql("select cache_creation_input_tokens w, input_tokens i, output_tokens o from turns").iloc[0]
        assert (row.w, row.i, row.o) == (55096, 280, 90)


def test_a_malformed_iteration_is_refused_by_name():
    with pytest.raises(UsageError, match=r"^usage\.iterations\[0\]: must be an object, got str$"):
        usage_from_anthropic({"input_tokens": 1, "output_tokens": 1, "iterations": ["compaction"]})
    with pytest.raises(UsageError, match=r"^usage\.iterations\[1\]\.cache_creation_input_tokens: must be a "):
        usage_from_anthropic({"input_tokens": 1, "output_tokens": 1, "iterations": [
            {"type": "message"}, {"type": "compaction", "cache_creation_input_tokens": -3}]})


# -- a write without its 5m/1h split -----------------------------------------------------------------------
def test_an_unreported_ttl_split_stays_unknown_and_is_named():
    u = usage_from_anthropic({"input_tokens": 12, "output_tokens": 30, "cache_read_input_tokens": 0,
                              "cache_creation_input_tokens": 4000}, source="imported")
    assert u.cache_creation_input_tokens == 4000
    assert (u.cache_creation_5m_input_tokens, u.cache_creation_1h_input_tokens) == (None, None)
    assert not u.ttl_split_known and u.notes == (TTL_SPLIT_UNKNOWN_NOTE,)
    assert "cache_creation" not in u.to_anthropic()  # never re-emitted as a 5m write
    split = usage_from_anthropic({"input_tokens": 12, "output_tokens": 30, "cache_creation_input_tokens": 4000,
                                  "cache_creation": {"ephemeral_5m_input_tokens": 0,
                                                     "ephemeral_1h_input_tokens": 4000}})
    assert split.ttl_split_known and split.notes == ()
    nothing = usage_from_anthropic({"input_tokens": 12, "output_tokens": 30, "cache_creation_input_tokens": 0})
    assert nothing.ttl_split_known and (nothing.cache_creation_5m_input_tokens, nothing.notes) == (0, ())


def test_an_unreported_split_is_stored_null_priced_at_5m_with_a_note(tmp_path):
    bedrock = {"input_tokens": 12, "output_tokens": 30, "cache_read_input_tokens": 0,
               "cache_creation_input_tokens": 4000}
    five_min = {**bedrock, "cache_creation": {"ephemeral_5m_input_tokens": 4000, "ephemeral_1h_input_tokens": 0}}
    with pc.Lab(tmp_path / "t.duckdb", progress=False) as lab:
        t = lab.session(model="claude-sonnet-4-6").record(anthropic_body(), at=T0, usage=bedrock)
        ref = lab.session(model="claude-sonnet-4-6").record(anthropic_body(), at=T0, usage=five_min)
        assert t.cost_usd == pytest.approx(ref.cost_usd)  # the 5-minute rate, as the note says
        rows = lab.sql("select cache_creation_input_tokens w, cache_creation_5m_input_tokens w5, "
                       "cache_creation_1h_input_tokens w1, notes from turns order by session_id").itertuples()
        unsplit, split = list(rows)
        assert unsplit.w == 4000 and pd_null(unsplit.w5) and pd_null(unsplit.w1)
        assert unsplit.notes == TTL_SPLIT_UNKNOWN_NOTE and pd_null(split.notes)
        s = lab.session(id=t.session_id)
        assert s.turns().notes[0] == TTL_SPLIT_UNKNOWN_NOTE
        back = s.turn(0).usage
        assert not back.ttl_split_known and back.notes == (TTL_SPLIT_UNKNOWN_NOTE,)


def pd_null(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value) in ("<NA>", "NaT")


# -- counts of any size ----------------------------------------------------------------------------------
def test_a_count_above_int32_stores_and_reads_back_exactly(tmp_path):
    big = 3_000_000_000
    with pc.Lab(tmp_path / "b.duckdb", progress=False) as lab:
        s = lab.session(model="claude-sonnet-4-6")
        with pytest.warns(ContextWindowWarning):  # stored as given, with the warning it deserves
            s.record(anthropic_body(), at=T0, usage={"input_tokens": 10, "output_tokens": 5,
                                                     "cache_read_input_tokens": big, "cache_creation_input_tokens": 0})
        assert int(lab.sql("select cache_read_input_tokens r from turns").r[0]) == big
        assert s.turn(0).usage.cache_read_input_tokens == big
        assert int(s.turns().cache_read_input_tokens[0]) == big


def test_m009_widens_the_token_columns_of_an_older_store(tmp_path, monkeypatch):
    path = str(tmp_path / "old.duckdb")
    older = [m for m in _migrations.MIGRATIONS if m.__name__ < "m009"]
    con = duckdb.connect(path)
    monkeypatch.setattr(_migrations, "MIGRATIONS", older)
    _migrations.migrate(con)
    monkeypatch.undo()
    con.execute("INSERT INTO blocks VALUES ('h', 'rest', '{}', 7, 2)")
    assert _migrations.migrate(con) == [m.__name__ for m in _migrations.MIGRATIONS if m.__name__ >= "m009"]
    types = dict(con.execute("select column_name, data_type from information_schema.columns "
                             "where table_name = 'turns'").fetchall())
    for column in ("total_tokens", "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
                   "cache_creation_5m_input_tokens", "cache_creation_1h_input_tokens", "output_tokens",
                   "ideal_cache_read", "diverge_token", "shared_prefix_tokens", "previous_cache_read"):
        assert types[column] == "BIGINT", column
    assert types["notes"] == types["cost_source"] == "VARCHAR"
    assert con.execute("select tokens from blocks").fetchall() == [(7,)]
    con.close()


# -- bad counts: one line naming the field -----------------------------------------------------------------
BAD_COUNTS = [(-1, "must be a non-negative int, got -1"), ("12", "must be a non-negative int, got '12'"),
              (1.5, "must be a non-negative int, got 1.5"), (float("nan"), "must be a non-negative int, got nan"),
              (float("inf"), "must be a non-negative int, got inf"),
              (1e308, "must be a non-negative int, got 1e+308"),
              (MAX_TOKENS + 1, "1,000,000,000,001 tokens is not a plausible count")]


@pytest.mark.parametrize(("value", "problem"), BAD_COUNTS)
def test_bad_counts_are_one_line_errors_naming_the_field(value, problem):
    with pytest.raises(UsageError) as err:
        usage_from_anthropic({"input_tokens": 3, "output_tokens": 1, "cache_read_input_tokens": value})
    assert str(err.value).startswith(f"usage.cache_read_input_tokens: {problem}") and "\n" not in str(err.value)
    assert isinstance(err.value, ValueError | PromptCacheError)
    with pytest.raises(UsageError, match=r"^usage\.prompt_tokens_details\.cached_tokens: "):
        usage_from_openai({"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": value}})


@pytest.mark.parametrize(("value", "problem"), BAD_COUNTS)
def test_record_refuses_bad_counts_by_name_and_stores_nothing(value, problem):
    with pc.Lab(progress=False) as lab:
        s = lab.session(model="claude-sonnet-4-6")
        with pytest.raises(pc.errors.SessionError) as err:
            s.record(anthropic_body(), at=T0, usage={"input_tokens": 3, "output_tokens": value})
        assert str(err.value).startswith(f"request 0: usage.output_tokens: {problem}")
        with pytest.raises(UsageError, match=r"^Usage\.input_tokens: "):  # a Usage checks itself when built
            Usage(value, 0, 0, 0, 0, 1, "imported")
        assert lab.sql("select count(*) n from turns").n[0] == 0


def test_a_split_larger_than_its_total_is_refused_not_a_price_library_error():
    over = {"input_tokens": 3, "output_tokens": 1, "cache_creation_input_tokens": 100,
            "cache_creation": {"ephemeral_5m_input_tokens": 80, "ephemeral_1h_input_tokens": 70}}
    with pytest.raises(UsageError, match=r"^usage\.cache_creation: ephemeral_5m_input_tokens \(80\) \+ "
                                         r"ephemeral_1h_input_tokens \(70\) exceeds usage\.cache_creation_input_tokens"):
        usage_from_anthropic(over)
    with pc.Lab(progress=False) as lab:
        s = lab.session(model="claude-sonnet-4-6")
        with pytest.raises(pc.errors.SessionError, match=r"^request 0: usage\.cache_creation: .* exceeds "):
            s.record(anthropic_body(), at=T0, usage=over)
        with pytest.raises(UsageError, match=r"^Usage\.cache_creation: .* exceeds "):  # checked when built
            Usage(3, 0, 100, 80, 70, 1, "imported")
        assert lab.sql("select count(*) n from turns").n[0] == 0


# -- prices never a look-alike ------------------------------------------------------------------------------
def test_provider_prefixed_ids_resolve_through_provider_matching():
    assert price_model_id("anthropic/claude-sonnet-4.6") == ("openrouter", "anthropic/claude-sonnet-4.6")
    assert price_model_id("mistralai/mistral-large") == ("openrouter", "mistralai/mistral-large")
    assert price_model_id("openai/gpt-5") == ("openrouter", "openai/gpt-5")
    assert price_model_id("anthropic/claude-sonnet-4-5") == ("anthropic", "claude-sonnet-4-5")  # the vendor's
    assert price_model_id("claude-sonnet-4.6") == ("anthropic", "claude-sonnet-4-6")
    assert price_model_id("mistral-large-latest") == ("mistral", "mistral-large")
    for unknown in ("anthropic/claude-opus-4-9", "acme/quantum-1", "/gpt-5", "gpt-5/"):
        assert price_model_id(unknown) is None, unknown


def test_measured_traffic_is_never_priced_at_a_stand_in():
    gpt5 = prices_for("gpt-5")
    for model, own in (("mistral-large-latest", "genai-prices mistral/mistral-large"),
                       ("anthropic/claude-sonnet-4.6", "genai-prices openrouter/anthropic/claude-sonnet-4.6")):
        measured = request_prices("openai", model, measured=True)
        assert measured is not None and measured.source == own and measured != gpt5
    assert request_prices("openai", "acme/quantum-1", measured=True) is None
    # a simulation under another provider's cache is a what-if the user asked for: its stand-in stays
    assert request_prices("openai", "claude-sonnet-4-5") == gpt5


def test_recorded_openrouter_traffic_costs_its_own_model_or_the_reported_cost(tmp_path):
    usage = {"prompt_tokens": 2006, "completion_tokens": 300, "prompt_tokens_details": {"cached_tokens": 1920}}
    with pc.Lab(tmp_path / "o.duckdb", progress=False) as lab:
        s = lab.session(cache="openai", model="gpt-5")
        mistral = s.record(chat_body("mistral-large-latest"), at=T0, usage=usage, dialect="openai-chat")
        want = prices_for("mistral-large-latest").cost(usage_from_openai(usage), T0)
        assert mistral.cost_usd == pytest.approx(want) and mistral.cost_source == "genai-prices mistral/mistral-large"
        assert mistral.cost_usd != pytest.approx(prices_for("gpt-5").cost(usage_from_openai(usage), T0))
        sonnet = s.record(chat_body("anthropic/claude-sonnet-4.6"), at=T0, usage=usage, dialect="openai-chat")
        assert sonnet.cost_source == "genai-prices openrouter/anthropic/claude-sonnet-4.6"
        # unknown to the price table: the cost OpenRouter reported, labelled as such
        reported = s.record(chat_body("acme/quantum-1"), at=T0, usage={**usage, "cost": 0.0123},
                            dialect="openai-chat")
        assert (reported.cost_usd, reported.cost_no_cache_usd, reported.cost_source) == (
            0.0123, None, REPORTED_COST_SOURCE)
        # unknown and unreported: NULL, with the one warning
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            unknown = s.record(chat_body("acme/quantum-2"), at=T0, usage=usage, dialect="openai-chat")
        assert unknown.cost_usd is None and unknown.cost_source is None
        assert [w.category for w in caught] == [UnpricedModelWarning]
        stored = lab.sql("select cost_source from turns order by idx").cost_source.tolist()
        assert stored[:3] == ["genai-prices mistral/mistral-large",
                              "genai-prices openrouter/anthropic/claude-sonnet-4.6", REPORTED_COST_SOURCE]
        assert pd_null(stored[3])
        # re-simulated under its own cache, the measured traffic keeps its own prices: never gpt-5's
        df = resimulate(lab, s.id, cache="openai")
        assert df.cost_usd.isna().tolist() == [False, False, True, True]
        assert df.cost_usd[0] == pytest.approx(
            prices_for("mistral-large-latest").cost(usage_of(df, 0), df["sent_at"][0].to_pydatetime()))


def usage_of(df, i: int) -> Usage:
    r = df.iloc[i]
    return Usage(int(r.input_tokens), int(r.cache_read_input_tokens), int(r.cache_creation_input_tokens),
                 None, None, int(r.output_tokens), "simulated")
