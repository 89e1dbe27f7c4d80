"""How to apply each fix in the client that wrote the log: every (client, fix) pair has advice, API bodies get the
exact change, a client without a switch says so, and every source is cited in docs/provider_cache_rules.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from promptcache_nb.advice._fixes import FIX_NAMES, PARTIAL_TTL_ROLES, TTL_ROLES
from promptcache_nb.advice._howto import CLIENTS, HOWTO_FIXES, SOURCES, HowTo, how_to_apply
from promptcache_nb.errors import UnknownNameError

DOC = (Path(__file__).resolve().parent.parent / "docs" / "provider_cache_rules.md").read_text(encoding="utf-8")
SECTION = DOC.split("## Applying a fix in each client", 1)[1].split("\n## ", 1)[0]

AGENTS = ("claude-code", "codex", "pi", "gemini-cli", "opencode", "cline", "openclaw")
#: Every importer and dialect name, plus a client nobody knows.
NAMES = (*sorted(CLIENTS), "my-own-agent")
#: The details a finding may carry: each TTL cut, 5m everywhere, each keep-warm TTL, each capture dialect.
DETAILS: tuple[dict[str, object] | None, ...] = (
    None, *({"through": r} for r in (*TTL_ROLES, *PARTIAL_TTL_ROLES)), {"through": None}, {"ttl": "1h"},
    {"dialect": "openai-chat"}, {"dialect": "anthropic"})
CASES = [(c, f, d) for c in NAMES for f in HOWTO_FIXES for d in DETAILS]


def test_every_fix_and_the_new_findings_have_a_how_to() -> None:
    assert set(FIX_NAMES) < set(HOWTO_FIXES)
    assert {"provider_miss", "stagger"} <= set(HOWTO_FIXES)
    assert set(AGENTS) <= set(CLIENTS.values())


@pytest.mark.parametrize(("client", "fix", "detail"), CASES)
def test_every_pair_has_short_cited_advice(client: str, fix: str, detail: dict[str, object] | None) -> None:
    got = how_to_apply(client, fix, detail=detail)
    assert isinstance(got, HowTo)
    assert got.text.strip() and got.switch != ""
    # one or two sentences (a known client's advice; an unknown one gets a lead-in clause before it)
    sentences = re.findall(r"[.!?](?:\s|$)", got.text)
    assert 1 <= len(sentences) <= 2, got.text
    assert got.source.startswith("https://") and got.source in SECTION, got.source


def test_every_source_is_cited_in_the_rules_section() -> None:
    assert [name for name, url in SOURCES.items() if url not in SECTION] == []


@pytest.mark.parametrize("client", ["anthropic", "har", "vcr", "exchanges", "otlp", "my-own-agent"])
@pytest.mark.parametrize(("through", "block"), [("tools", "tools[-1]"), ("system", "system[-1]"),
                                                ("messages", "newest message"), ("prefix", "system[-1]"),
                                                ("conversation", "newest message")])
def test_api_ttl_advice_is_the_exact_cache_control_change(client: str, through: str, block: str) -> None:
    got = how_to_apply(client, "ttl", detail={"through": through})
    assert got.switch is not None
    assert got.switch.startswith('"cache_control": {"type": "ephemeral", "ttl": "1h"} on ')
    assert block in got.switch and block in got.text
    assert '"ttl": "1h"' in got.text
    assert got.source == SOURCES["anthropic"]


def test_api_ttl_names_the_breakpoints_left_at_five_minutes() -> None:
    assert "leave those on messages at 5m" in how_to_apply("anthropic", "ttl", detail={"through": "system"}).text
    assert "5m" not in how_to_apply("anthropic", "ttl", detail={"through": "messages"}).text.split("(")[0]
    five = how_to_apply("anthropic", "ttl", detail={"through": None})
    assert five.switch == '"cache_control": {"type": "ephemeral"}' and '"ttl"' not in five.switch


def test_openai_bodies_get_openai_fields() -> None:
    assert how_to_apply("openai-responses", "ttl").switch == '"prompt_cache_retention": "24h"'
    assert how_to_apply("har", "ttl", detail={"dialect": "openai-chat"}).switch == '"prompt_cache_retention": "24h"'
    assert how_to_apply("openai-chat", "ttl", detail={"through": None}).switch == '"prompt_cache_retention": "in_memory"'
    assert "prompt_cache_key" in (how_to_apply("openai-chat", "frozen_prefix").switch or "")
    assert "cache_control" not in (how_to_apply("openai-chat", "breakpoints").switch or "")


@pytest.mark.parametrize(("client", "fix", "label"), [
    ("codex", "ttl", "Codex CLI"), ("gemini-cli", "ttl", "Gemini CLI"), ("opencode", "ttl", "OpenCode"),
    ("cline", "ttl", "Cline"), ("claude-code", "breakpoints", "Claude Code"), ("claude-code", "keep_warm", "Claude Code"),
    ("pi", "breakpoints", "pi"), ("openclaw", "breakpoints", "OpenClaw"),
])
def test_a_client_without_a_switch_says_so(client: str, fix: str, label: str) -> None:
    got = how_to_apply(client, fix)
    assert got.switch is None
    assert got.text.startswith(f"{label} offers no setting for this; ")


@pytest.mark.parametrize("client", AGENTS)
@pytest.mark.parametrize("fix", HOWTO_FIXES)
def test_an_agent_client_either_names_a_switch_or_says_it_has_none(client: str, fix: str) -> None:
    got = how_to_apply(client, fix)
    assert (got.switch is None) == ("offers no setting for this" in got.text), got


@pytest.mark.parametrize(("client", "detail", "switch"), [
    ("claude-code", None, "ENABLE_PROMPT_CACHING_1H=1"),
    ("claude-code", {"through": None}, "FORCE_PROMPT_CACHING_5M=1"),
    ("claude-code", {"through": "prefix"}, "ENABLE_PROMPT_CACHING_1H=1"),
    ("pi", None, "PI_CACHE_RETENTION=long"),
    ("openclaw", None, 'agents.defaults.params.cacheRetention: "long"'),
    ("openclaw", {"through": None}, 'agents.defaults.params.cacheRetention: "short"'),
])
def test_documented_ttl_switches(client: str, detail: dict[str, object] | None, switch: str) -> None:
    got = how_to_apply(client, "ttl", detail=detail)
    assert got.switch == switch
    name = re.split(r"[=:]", switch, maxsplit=1)[0].split(".")[-1]
    assert name in SECTION, name  # the setting the advice names is the one the rules cite


def test_keep_warm_pings_below_the_ttl() -> None:
    assert '"max_tokens": 0, every 4m' in (how_to_apply("anthropic", "keep_warm").switch or "")
    assert "every 59m" in (how_to_apply("anthropic", "keep_warm", detail={"ttl": "1h"}).switch or "")
    assert how_to_apply("openclaw", "keep_warm", detail={"ttl": "1h"}).switch == 'agents.defaults.heartbeat.every: "59m"'


def test_the_claude_agent_sdk_moves_volatile_sections() -> None:
    got = how_to_apply("claude-code", "tail_volatile")
    assert got.switch is not None and "excludeDynamicSections: true" in got.switch
    assert got.source == SOURCES["claude-agent-sdk"]


def test_provider_misses_cite_the_back_to_back_report() -> None:
    for client in ("claude-code", "pi", "anthropic", "har"):
        got = how_to_apply(client, "provider_miss")
        assert got.switch is None and "40 %" in got.text and got.source == SOURCES["back-to-back"]


def test_a_session_source_names_its_client() -> None:
    by_source = how_to_apply("claude-code:/home/me/.claude/projects/x:y/a.jsonl", "ttl")
    assert by_source == how_to_apply("claude-code", "ttl")
    assert how_to_apply("Codex:rollout.jsonl", "ttl") == how_to_apply("codex", "ttl")
    unknown = how_to_apply("my-own-agent:log.jsonl", "breakpoints")
    assert unknown.text.startswith("'my-own-agent:log.jsonl' is not a client we know")
    assert unknown.switch == how_to_apply("anthropic", "breakpoints").switch


def test_bad_input_is_a_one_line_error() -> None:
    with pytest.raises(UnknownNameError, match=r"^unknown fix 'ttls'; valid: .*keep_warm.*stagger") as e:
        how_to_apply("pi", "ttls")
    assert "\n" not in str(e.value)
    with pytest.raises(UnknownNameError, match="through"):
        how_to_apply("anthropic", "ttl", detail={"through": "history"})
    with pytest.raises(UnknownNameError, match="ttl"):
        how_to_apply("anthropic", "keep_warm", detail={"ttl": "2h"})
