"""How to apply a fix in the client that wrote the log: its setting, environment variable or practice, or, for a
client that sends its own API bodies, the exact body change.

Every switch named here is documented by the client or the provider; where a client offers none the text says so
plainly. The sources are cited in docs/provider_cache_rules.md#applying-a-fix-in-each-client.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UnknownNameError
from ._fixes import FIX_NAMES, PARTIAL_TTL_ROLES, TTL_ROLES

#: Every finding a how-to exists for: the fixes, the provider's own misses, and staggering parallel requests.
HOWTO_FIXES: tuple[str, ...] = (*FIX_NAMES, "provider_miss")  # FIX_NAMES holds stagger

#: Where each claim comes from (every URL is listed in docs/provider_cache_rules.md#applying-a-fix-in-each-client).
SOURCES: dict[str, str] = {
    "anthropic": "https://platform.claude.com/docs/en/build-with-claude/prompt-caching",
    "openai": "https://developers.openai.com/api/docs/guides/prompt-caching",
    "claude-code": "https://code.claude.com/docs/en/prompt-caching",
    "claude-agent-sdk": "https://code.claude.com/docs/en/agent-sdk/modifying-system-prompts",
    "codex": "https://github.com/openai/codex/issues/6698",
    "codex-cache-key": "https://github.com/openai/codex/issues/25604",
    "pi": "https://pi.dev/docs/latest/environment-variables",
    "gemini": "https://ai.google.dev/gemini-api/docs/caching",
    "opencode": "https://github.com/anomalyco/opencode/issues/5416",
    "opencode-code": "https://github.com/anomalyco/opencode/blob/dev/packages/opencode/src/provider/transform.ts",
    "cline-code": "https://github.com/cline/cline/blob/main/src/core/api/providers/anthropic.ts",
    "openclaw": "https://docs.openclaw.ai/reference/prompt-caching",
    "back-to-back": "https://github.com/anthropics/anthropic-sdk-python/issues/1451",
}

#: A session's importer (the ``format`` in its ``source``, ``format:file``) or a body dialect -> the client whose
#: settings apply. Captures of raw API traffic (HAR, VCR cassettes, exchanges, OTLP) are API clients: the bodies'
#: dialect (``detail["dialect"]``) decides. Anything else gets the API advice too.
CLIENTS: dict[str, str] = {
    "claude-code": "claude-code", "codex": "codex", "pi": "pi", "gemini-cli": "gemini-cli", "opencode": "opencode",
    "cline": "cline", "openclaw": "openclaw",
    "anthropic": "anthropic", "openai": "openai", "openai-chat": "openai", "openai-responses": "openai",
    "har": "api", "vcr": "api", "exchanges": "api", "otlp": "api",
}

_LABELS = {"claude-code": "Claude Code", "codex": "Codex CLI", "pi": "pi", "gemini-cli": "Gemini CLI",
           "opencode": "OpenCode", "cline": "Cline", "openclaw": "OpenClaw"}

#: Where each TTL cut's last breakpoint sits in an Anthropic Messages body (``detail["through"]``).
_BLOCKS = {
    "tools": "the last tool (`tools[-1]`)",
    "system": "the last system block (`system[-1]`; a string `system` becomes one text block)",
    "messages": "the last content block of the newest message (or the top-level `cache_control`)",
    "prefix": "the last system block (`system[-1]`), where the prefix ends",
    "conversation": "the last content block of the newest message",
}

#: A partial body's TTL roles (the client's assumed breakpoints) in words.
_ROLE_NAMES = {"prefix": "the prefix (tools and system prompt)", "conversation": "the conversation"}


@dataclass(frozen=True)
class HowTo:
    """How to apply one fix in one client."""

    text: str
    """One or two sentences: what to change, in the client's own terms."""
    switch: str | None
    """The exact setting, environment variable or body change; None when the client offers none."""
    source: str
    """The documentation the switch (or its absence) is taken from."""


def how_to_apply(client: str, fix: str, *, detail: Mapping[str, Any] | None = None) -> HowTo:
    """How to apply ``fix`` in ``client``.

    ``client``: a session's ``source`` (``claude-code:/path/x.jsonl``), its importer name or a body dialect
    (:data:`CLIENTS`); an unknown client gets the API advice. ``detail``: ``through`` (ttl: the last role with
    1h breakpoints, :data:`~._fixes.TTL_ROLES` or :data:`~._fixes.PARTIAL_TTL_ROLES`; None: 5m everywhere),
    ``ttl`` (keep_warm: the TTL the pings keep alive, ``5m`` or ``1h``), ``dialect`` (an API capture's bodies).

    Example:
        >>> how_to_apply("claude-code:/logs/a.jsonl", "ttl").switch
        'ENABLE_PROMPT_CACHING_1H=1'
    """
    if fix not in HOWTO_FIXES:
        raise UnknownNameError("fix", fix, HOWTO_FIXES)
    d = dict(detail or {})
    through = d.get("through", "messages")
    if through is not None and through not in (*TTL_ROLES, *PARTIAL_TTL_ROLES):
        raise UnknownNameError("ttl cut (detail['through'])", str(through), (*TTL_ROLES, *PARTIAL_TTL_ROLES))
    if d.get("ttl", "5m") not in ("5m", "1h"):
        raise UnknownNameError("ttl (detail['ttl'])", str(d["ttl"]), ("1h", "5m"))
    name = client.split(":", 1)[0].strip().lower()
    kind = CLIENTS.get(name, "api")
    if kind in _CLIENT:
        return _CLIENT[kind](fix, d)
    if kind == "api":
        kind = "openai" if str(d.get("dialect", "")).startswith("openai") else "anthropic"
    got = _API[kind](fix, d)
    if name in CLIENTS:  # a body dialect, or a capture of raw API traffic: the body change is the advice
        return got
    return HowTo(f"{client!r} is not a client we know; if it sends the requests' bodies itself: {got.text}",
                 got.switch, got.source)


# -- API bodies -------------------------------------------------------------------------------
def _join(words: tuple[str, ...]) -> str:
    return " and ".join(words) if len(words) < 3 else f"{', '.join(words[:-1])} and {words[-1]}"


def _ping_every(d: Mapping[str, Any]) -> str:
    """TTL − 1 min: the ping interval that keeps an entry of that TTL alive."""
    return "59m" if d.get("ttl", "5m") == "1h" else "4m"


def _anthropic(fix: str, d: Mapping[str, Any]) -> HowTo:
    src = SOURCES["anthropic"]
    if fix == "frozen_prefix":
        return HowTo("Send `tools` in one stable order (sorted by name) and `system` and `tools` byte-identical on "
                     "every request; never re-render a message already sent, since a changed byte rebuilds everything "
                     "after it.", 'sort "tools" by "name"; re-send "system" and "tools" unchanged', src)
    if fix == "tail_volatile":
        return HowTo("Take the lines that change between requests (clock, counters, runtime info) out of `system` and "
                     "add them as a text block on the newest user message, where they stay in history.",
                     'volatile lines: from "system" to a text block of messages[-1].content', src)
    if fix == "durable_deltas":
        return HowTo("Keep `system` at its first bytes for the whole session and send each later change as a text "
                     "block (changed and superseded lines) on the newest user message.",
                     '"system" pinned; changes as a text block of messages[-1].content', src)
    if fix == "breakpoints":
        return HowTo("Mark the last tool, the last system block and the last content block of the newest message "
                     "(3 of the 4 breakpoints a request may carry).",
                     '"cache_control": {"type": "ephemeral"} on tools[-1], system[-1] and '
                     'messages[-1].content[-1]', src)
    if fix == "ttl":
        through = d.get("through", "messages")
        if through is None:
            return HowTo("Keep every breakpoint at the default 5-minute TTL: drop `\"ttl\": \"1h\"` from each "
                         "`cache_control` (1h writes cost 2x base input, 5m 1.25x).",
                         '"cache_control": {"type": "ephemeral"}', src)
        roles = PARTIAL_TTL_ROLES if through in PARTIAL_TTL_ROLES else TTL_ROLES
        hour = roles[:roles.index(through) + 1]
        after = roles[roles.index(through) + 1:]
        hour, after = tuple(_ROLE_NAMES.get(r, r) for r in hour), tuple(_ROLE_NAMES.get(r, r) for r in after)
        rest = f", and leave those on {_join(after)} at 5m" if after else ""
        return HowTo(f"Set `\"ttl\": \"1h\"` in the `cache_control` of the breakpoints on {_join(hour)}, the last "
                     f"one being {_BLOCKS[through]}{rest}; every 1h breakpoint must come before every 5m one.",
                     f'"cache_control": {{"type": "ephemeral", "ttl": "1h"}} on {_BLOCKS[through]}', src)
    if fix == "keep_warm":
        every = _ping_every(d)
        return HowTo(f"Through an idle gap, re-send the previous body with `max_tokens: 0` every {every}: it reads the "
                     "cache (refreshing it) and returns no output.",
                     f'previous body with "max_tokens": 0, every {every} while idle', src)
    if fix == "provider_miss":
        return HowTo("No body change prevents this: the provider rebuilt a prefix the request left unchanged "
                     "(identical requests sent back to back were reported to miss about 40 % of the time); for "
                     "parallel requests with one prefix, send one first and the rest once its response has begun.",
                     None, SOURCES["back-to-back"])
    # stagger
    return HowTo("Send the first of a batch of same-prefix requests alone and the others once its response has "
                 "begun (an entry is readable only then; requests sent before it all pay full price).",
                 "start the parallel requests after the first one's first streamed event", src)


def _openai(fix: str, d: Mapping[str, Any]) -> HowTo:
    src = SOURCES["openai"]
    if fix == "frozen_prefix":
        return HowTo("Keep `tools` and the instructions byte-identical and in one order on every request, and send one "
                     "`prompt_cache_key` per conversation: the cache matches exact prefixes, routed by that key.",
                     '"prompt_cache_key": "<one value per conversation>"; "tools" and instructions unchanged', src)
    if fix == "tail_volatile":
        return HowTo("Take the lines that change between requests (clock, counters) out of the system/developer "
                     "instructions and add them to the newest user message, where they stay in history.",
                     "volatile lines: from the instructions to the newest user message", src)
    if fix == "durable_deltas":
        return HowTo("Keep the instructions at their first bytes and send each later change as text on the newest "
                     "user message.", "instructions pinned; changes on the newest user message", src)
    if fix == "breakpoints":
        return HowTo("GPT-5.6 and later take explicit breakpoints: mark the last content block of the instructions and "
                     "of the newest user message; earlier models cache automatically and take none.",
                     '"prompt_cache_breakpoint": {"mode": "explicit"} on the content block', src)
    if fix == "ttl":
        if d.get("through", "messages") is None:
            return HowTo("Keep the default in-memory retention (5-10 minutes idle, at most an hour).",
                         '"prompt_cache_retention": "in_memory"', src)
        return HowTo("Ask for extended retention (up to 24 hours) on models before GPT-5.6; GPT-5.6 and later keep "
                     "every breakpoint at least 30 minutes (`prompt_cache_options.ttl`, whose only value is 30m).",
                     '"prompt_cache_retention": "24h"', src)
    if fix == "keep_warm":
        return HowTo("OpenAI documents no pre-warming request: a ping is an ordinary request with the same prefix and "
                     f"`prompt_cache_key` every {_ping_every(d)}; extended retention (`\"prompt_cache_retention\": "
                     "\"24h\"`) usually covers the gap instead.", None, src)
    if fix == "provider_miss":
        return HowTo("Requests are routed by a hash of their opening and `prompt_cache_key`, and above about 15 per "
                     "minute for one prefix and key they overflow to other machines: keep one key per conversation and "
                     "spread bursts.", '"prompt_cache_key": "<one value per conversation>"', src)
    return HowTo("A prompt is cached on its machine only after it was processed: send the first of a batch of "
                 "same-prefix requests alone and the others once it has finished.",
                 "start the parallel requests after the first one completes", src)


_API: dict[str, Callable[[str, Mapping[str, Any]], HowTo]] = {"anthropic": _anthropic, "openai": _openai}


# -- agent clients ----------------------------------------------------------------------------
def _none(client: str, practice: str, source: str) -> HowTo:
    return HowTo(f"{_LABELS[client]} offers no setting for this; {practice}", None, source)


_WHO_MISSES = ("nothing in it changes a rebuild the provider made with the prefix unchanged: identical requests sent "
               "back to back were reported to miss about 40 % of the time.")
_STAGGER = ("same-prefix requests it starts together (sub-agents, parallel tasks) miss until the first one's response "
            "has begun, and it has no way to delay them.")


def _claude_code(fix: str, d: Mapping[str, Any]) -> HowTo:
    cc = SOURCES["claude-code"]
    if fix == "frozen_prefix":
        return _none("claude-code", "pick the model and effort at the start of a session, don't connect or disconnect "
                     "MCP servers (unless their tools are deferred) or add a bare-tool deny rule mid-session, and "
                     "`/compact` at natural breaks (`DISABLE_AUTOUPDATER=1` controls when upgrades land).", cc)
    if fix == "tail_volatile":
        return HowTo("In the Agent SDK, `excludeDynamicSections: true` on the `claude_code` preset (Python "
                     "`exclude_dynamic_sections`) moves the working directory, git status and memory paths from the "
                     "system prompt into the first user message; the interactive CLI has no such setting.",
                     'systemPrompt: {type: "preset", preset: "claude_code", excludeDynamicSections: true}',
                     SOURCES["claude-agent-sdk"])
    if fix == "durable_deltas":
        return _none("claude-code", "it already reads CLAUDE.md and the output style once per session (edits apply on "
                     "`/clear`, `/compact` or a restart) and adds plan mode, skills and file changes as messages.", cc)
    if fix == "breakpoints":
        return _none("claude-code", "it places its own cache breakpoints.", cc)
    if fix == "ttl":
        if d.get("through", "messages") is None:
            return HowTo("Force the 5-minute TTL (a subscription defaults to 1h for the main conversation).",
                         "FORCE_PROMPT_CACHING_5M=1", cc)
        if d.get("through") == "prefix":
            return HowTo("Claude Code has no per-breakpoint TTL; the closest it offers moves its whole main "
                         "conversation to the 1-hour TTL (a subscription already has it).",
                         "ENABLE_PROMPT_CACHING_1H=1", cc)
        return HowTo("On an API key, Bedrock, Google Cloud or Foundry, opt the main conversation into the 1-hour TTL "
                     "(in the shell or the `env` block of settings); a subscription already uses it for the main "
                     "conversation.", "ENABLE_PROMPT_CACHING_1H=1", cc)
    if fix == "keep_warm":
        return _none("claude-code", "the 1-hour TTL (`ENABLE_PROMPT_CACHING_1H=1`) keeps the cache through idle gaps "
                     "of up to an hour.", cc)
    if fix == "provider_miss":
        return _none("claude-code", _WHO_MISSES, SOURCES["back-to-back"])
    return _none("claude-code", "sub-agents started together each build their own cache, and a fork reads the "
                 "parent's cache only once the parent's request has begun.", cc)


def _codex(fix: str, d: Mapping[str, Any]) -> HowTo:
    oa = SOURCES["openai"]
    if fix in ("frozen_prefix", "tail_volatile", "durable_deltas"):
        return _none("codex", {
            "frozen_prefix": "the OpenAI cache needs an exact prefix, so keep AGENTS.md, MCP servers and the model "
                             "unchanged within a session.",
            "tail_volatile": "keep what changes per request out of AGENTS.md and custom instructions.",
            "durable_deltas": "edit AGENTS.md and instructions between sessions, not during one.",
        }[fix], oa)
    if fix == "breakpoints":
        return _none("codex", "OpenAI caches automatically and Codex places no explicit breakpoints.", oa)
    if fix == "ttl":
        return _none("codex", "it does not send `prompt_cache_retention` (openai/codex#6698, #25604 ask for it), so "
                     "the in-memory retention of 5-10 idle minutes applies.", SOURCES["codex"])
    if fix == "keep_warm":
        return _none("codex", "a cache kept in memory lasts 5-10 idle minutes, so come back within them.", oa)
    if fix == "provider_miss":
        return _none("codex", "it already sends one `prompt_cache_key` per thread; the provider rebuilt a prefix the "
                     "request left unchanged.", SOURCES["codex-cache-key"])
    return _none("codex", "same-prefix requests started together miss until the first has been processed.", oa)


def _pi(fix: str, d: Mapping[str, Any]) -> HowTo:
    src = SOURCES["pi"]
    if fix == "ttl":
        if d.get("through", "messages") is None:
            return HowTo("Leave `PI_CACHE_RETENTION` unset: the provider's default (short) retention applies.",
                         "unset PI_CACHE_RETENTION", src)
        return HowTo("Ask for the provider's extended cache retention where it is supported (on Anthropic models, "
                     "1-hour breakpoints).", "PI_CACHE_RETENTION=long", src)
    if fix == "keep_warm":
        return _none("pi", "`PI_CACHE_RETENTION=long` keeps the cache through longer idle gaps.", src)
    if fix == "provider_miss":
        return _none("pi", _WHO_MISSES, SOURCES["back-to-back"])
    if fix == "stagger":
        return _none("pi", "start parallel pi sessions on one prefix only once the first one's response has begun.",
                     SOURCES["anthropic"])
    return _none("pi", {
        "frozen_prefix": "keep AGENTS.md, the tools and the model unchanged within a session.",
        "tail_volatile": "keep what changes per request out of the custom system prompt and context files.",
        "durable_deltas": "edit context files between sessions, not during one.",
        "breakpoints": "it places its own cache breakpoints.",
    }[fix], src)


def _gemini_cli(fix: str, d: Mapping[str, Any]) -> HowTo:
    src = SOURCES["gemini"]
    return _none("gemini-cli", {
        "frozen_prefix": "Gemini's implicit cache needs a common prefix, so keep GEMINI.md, the tools and the model "
                         "unchanged within a session.",
        "tail_volatile": "Gemini's implicit cache matches from the start, so keep what changes out of GEMINI.md.",
        "durable_deltas": "edit GEMINI.md between sessions, not during one.",
        "breakpoints": "Gemini's implicit caching takes no breakpoints.",
        "ttl": "Gemini's implicit caching has no TTL to choose.",
        "keep_warm": "Gemini's implicit caching favours requests with a common prefix sent close together.",
        "provider_miss": "implicit cache hits are not guaranteed; send same-prefix requests close together.",
        "stagger": "implicit cache hits are not guaranteed; send same-prefix requests close together.",
    }[fix], src)


def _opencode(fix: str, d: Mapping[str, Any]) -> HowTo:
    if fix == "ttl":
        return _none("opencode", "its breakpoints keep the 5-minute TTL (anomalyco/opencode#5416 asks for a setting).",
                     SOURCES["opencode"])
    if fix == "provider_miss":
        return _none("opencode", _WHO_MISSES, SOURCES["back-to-back"])
    if fix == "stagger":
        return _none("opencode", _STAGGER, SOURCES["anthropic"])
    if fix == "breakpoints":
        return _none("opencode", "it marks the first two system messages and the last two messages itself.",
                     SOURCES["opencode-code"])
    return _none("opencode", {
        "frozen_prefix": "keep AGENTS.md, MCP servers and the model unchanged within a session.",
        "tail_volatile": "keep what changes per request out of AGENTS.md and custom instructions.",
        "durable_deltas": "edit AGENTS.md and instructions between sessions, not during one.",
        "keep_warm": "come back within the 5-minute TTL.",
    }[fix], SOURCES["anthropic"])


def _cline(fix: str, d: Mapping[str, Any]) -> HowTo:
    if fix == "provider_miss":
        return _none("cline", _WHO_MISSES, SOURCES["back-to-back"])
    if fix == "stagger":
        return _none("cline", _STAGGER, SOURCES["anthropic"])
    if fix in ("breakpoints", "ttl", "keep_warm"):
        return _none("cline", {
            "breakpoints": "it marks the system prompt and the last two user messages itself.",
            "ttl": "its breakpoints carry no `ttl`, so Anthropic's 5-minute default applies.",
            "keep_warm": "come back within Anthropic's 5-minute TTL.",
        }[fix], SOURCES["cline-code"])
    return _none("cline", {
        "frozen_prefix": "keep .clinerules, MCP servers and the model unchanged within a task.",
        "tail_volatile": "keep what changes per request out of .clinerules and custom instructions.",
        "durable_deltas": "edit .clinerules between tasks, not during one.",
    }[fix], SOURCES["anthropic"])


def _openclaw(fix: str, d: Mapping[str, Any]) -> HowTo:
    src = SOURCES["openclaw"]
    if fix == "ttl":
        if d.get("through", "messages") is None:
            return HowTo("Use the provider's default cache window.",
                         'agents.defaults.params.cacheRetention: "short"', src)
        return HowTo("Ask for the long cache window (1-hour `cache_control` on Anthropic, `prompt_cache_retention: "
                     "24h` on OpenAI), globally, per model or per agent.",
                     'agents.defaults.params.cacheRetention: "long"', src)
    if fix == "keep_warm":
        every = _ping_every(d)
        return HowTo(f"Let the heartbeat keep the cache window warm through idle gaps, every {every} (below the TTL).",
                     f'agents.defaults.heartbeat.every: "{every}"', src)
    if fix == "tail_volatile":
        return _none("openclaw", "it splits the system prompt at a cache boundary; keep what changes (HEARTBEAT.md, "
                     "timestamps) below it.", src)
    if fix == "provider_miss":
        return _none("openclaw", _WHO_MISSES, SOURCES["back-to-back"])
    if fix == "stagger":
        return _none("openclaw", _STAGGER, SOURCES["anthropic"])
    return _none("openclaw", {
        "frozen_prefix": "keep the workspace files above its cache boundary unchanged within a session.",
        "durable_deltas": "keep the workspace files above its cache boundary unchanged within a session.",
        "breakpoints": "it places its own cache markers.",
    }[fix], src)


_CLIENT: dict[str, Callable[[str, Mapping[str, Any]], HowTo]] = {
    "claude-code": _claude_code, "codex": _codex, "pi": _pi, "gemini-cli": _gemini_cli, "opencode": _opencode,
    "cline": _cline, "openclaw": _openclaw,
}
