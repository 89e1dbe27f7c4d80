"""Key redaction: the one place that knows what a credential looks like, in a URL or in text.

Everything that prints, logs or stores a URL (the recording proxy's lines and repr, the simulator's log records
and 404 texts, a capture's calls, a live backend's errors) passes it through :func:`redact_url` first; a text
that may echo a URL (an upstream's error body) through :func:`scrub` with that URL's :func:`url_secrets`.

A credential is recognised two ways:

- by name: a ``name=value`` component whose name looks like a credential (:data:`SECRET_NAME`: ``key``,
  ``api_key``, ``token``, ``secret``...) in the query string, the fragment (``#access_token=``) or the path
  (``/v1/models;key=…``, a segment ``key=…``) — Gemini's ``?key=AIza…`` is one;
- by value (:data:`KEY_PATTERNS`): Anthropic, OpenAI and Google keys, bearer tokens, JSON Web Tokens, anywhere,
  percent-encoded or not.

Credentials in the authority (``https://user:password@host``) are dropped.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import unquote_plus

__all__ = ["KEY_PATTERNS", "REDACTED", "SECRET_NAME", "RedactUrlFilter", "redact_json", "redact_keys", "redact_url",
           "redact_url_logs", "scrub", "url_secrets"]

#: A header or URL parameter whose name matches this carries a credential.
SECRET_NAME = re.compile(r"key|token|secret|auth|cookie|password|passwd|session|signature|credential|sig$",
                         re.IGNORECASE)
#: What replaces a credential.
REDACTED = "[redacted]"
#: Credentials recognised by their value (what, regular expression), in URLs always and in the recording
#: proxy's logged bodies with ``redact_bodies``. A match must not follow a letter or digit (``task-…`` holds no
#: ``sk-`` key).
KEY_PATTERNS: tuple[tuple[str, str], ...] = (
    ("Anthropic API key (sk-ant-api03-…, sk-ant-admin01-…)", r"sk-ant-[A-Za-z0-9_\-]{8,}"),
    ("OpenAI API key (sk-…, sk-proj-…, sk-svcacct-…, sk-admin-…)", r"sk-[A-Za-z0-9_\-]{16,}"),
    ("Google API key (AIza…)", r"AIza[0-9A-Za-z_\-]{30,}"),
    ("bearer token (Bearer …)", r"[Bb]earer[ +]+[A-Za-z0-9._~+/=\-]{8,}"),
    ("JSON Web Token (eyJ….eyJ….…)", r"eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*"),
)
KEY_VALUE = re.compile("(?<![A-Za-z0-9])(?:" + "|".join(f"(?:{p})" for _, p in KEY_PATTERNS) + ")")
#: What separates the components of a URL whose values are checked one by one.
_URL_SEPARATORS = re.compile(r"([/?&;#=,:])")
#: What separates path segments and their parameters, as written or percent-encoded (``%3B``: a server's access
#: log shows the path so).
_PATH_SEPARATORS = re.compile(r"(/|;|%3[Bb])")
_EQUALS = re.compile(r"(=|%3[Dd])")
#: ``scheme://user:password@``: the credentials part of an authority.
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)([^/?#@]*)@")
#: Shorter values named as secrets are not scrubbed from echoed text: ``key=1`` would blank every "1".
_MIN_ECHOED = 6


def redact_keys(text: str) -> str:
    """``text`` with every :data:`KEY_PATTERNS` match replaced by ``[redacted]``."""
    return KEY_VALUE.sub(REDACTED, text)


def redact_url(url: str) -> str:
    """A URL (or a path) as it may be shown: ``user:password@`` dropped, query and fragment components whose name
    looks like a credential dropped, path parameters so named (``;key=…``) blanked, and every component whose
    value is a key — in the path, the query or a fragment, percent-encoded or not — replaced by ``[redacted]``.
    An ordinary URL comes back unchanged.

    Example:
        >>> redact_url("https://api.example.com/v1/messages?beta=true;key=abc#sk-ant-api03-0123456789")
        'https://api.example.com/v1/messages?beta=true#[redacted]'
        >>> redact_url("https://gw.example.com/v1;key=hunter2/messages")
        'https://gw.example.com/v1;key=[redacted]/messages'
    """
    url = _USERINFO.sub(r"\1", url)
    head, sep, rest = _split_path(url)
    head = "".join(name + REDACTED if value is not None else name for name, value in _path_parameters(head))
    if sep:
        rest = _drop_secret_parameters(rest)
        url = f"{head}{sep}{rest}" if rest else head
    else:
        url = head
    parts = _URL_SEPARATORS.split(url)
    for i in range(0, len(parts), 2):
        part = parts[i]
        if KEY_VALUE.search(part):
            parts[i] = redact_keys(part)
        elif ("%" in part or "+" in part) and KEY_VALUE.search(unquote_plus(part)):
            parts[i] = REDACTED  # a key percent-encoded, or "Bearer%20…"
    return "".join(parts)


def url_secrets(url: str) -> list[str]:
    """The credentials :func:`redact_url` removes from ``url`` (as written and percent-decoded), longest first:
    what an answer that echoes the URL (a 404 naming the path) must not keep either — pass them to :func:`scrub`."""
    found: set[str] = set()
    for text in (url, unquote_plus(url)):
        found.update(m.group(0) for m in KEY_VALUE.finditer(text))
        userinfo = _USERINFO.match(text)
        if userinfo and ":" in userinfo.group(2):
            found.add(userinfo.group(2).partition(":")[2])
        head, _, rest = _split_path(_USERINFO.sub(r"\1", text))
        named = [(n, v) for n, v in _path_parameters(head) if v is not None]
        named += [(n, v) for n, eq, v in (p.partition("=") for p in re.split(r"[&;?#]", rest)) if eq]
        found.update(v for n, v in named if SECRET_NAME.search(n))
    return sorted((s for s in found if len(s) >= _MIN_ECHOED), key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with each of ``secrets`` (e.g. :func:`url_secrets`) and every :data:`KEY_PATTERNS` match replaced
    by ``[redacted]``."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return redact_keys(text)


def redact_json(value: Any, redact: Any = redact_keys) -> Any:
    """A parsed JSON value with ``redact`` (default :func:`redact_keys`) applied to every string and object key
    (in place for objects and arrays; iterative, so any nesting depth ``json`` parsed is fine)."""
    if isinstance(value, str):
        return redact(value)
    stack = [value] if isinstance(value, dict | list) else []
    while stack:
        node = stack.pop()
        for k, v in list(node.items()) if isinstance(node, dict) else enumerate(node):
            if isinstance(v, str):
                node[k] = redact(v)
            elif isinstance(v, dict | list):
                stack.append(v)
        if isinstance(node, dict):
            for k in [k for k in node if redact(k) != k]:
                node[redact(k)] = node.pop(k)
    return value


class RedactUrlFilter(logging.Filter):
    """Shows every URL argument of a log record (an ``httpx.URL``, a string that is a path or an absolute URL)
    through :func:`redact_url`: httpx, the SDKs and uvicorn's access log name each request's URL."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_url(str(a)) if _is_url(a) else a for a in record.args)
        return True


def redact_url_logs(*names: str) -> None:
    """Put a :class:`RedactUrlFilter` on each named logger (once). A filter acts on the records logged to that very
    logger, not its children, so each logger that names URLs is listed."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactUrlFilter) for f in logger.filters):
            logger.addFilter(RedactUrlFilter())


def _is_url(arg: object) -> bool:
    if type(arg).__name__ == "URL":  # httpx.URL and its vendored copies
        return True
    return isinstance(arg, str) and (arg.startswith("/") or "://" in arg)


def _split_path(url: str) -> tuple[str, str, str]:
    """(everything before the query or fragment, the separator ``?`` / ``#`` or "", what follows it)."""
    at = re.search(r"[?#]", url)
    return (url, "", "") if at is None else (url[:at.start()], at.group(), url[at.end():])


def _path_parameters(head: str) -> list[tuple[str, str | None]]:
    """``head`` cut into pieces that join back to it; a piece ``name=`` whose name looks like a credential comes
    with its value (to be blanked), every other piece with None."""
    pieces: list[tuple[str, str | None]] = []
    scheme, slashes, rest = head.partition("://")
    if slashes:  # the authority holds no parameters
        authority, slash, rest = rest.partition("/")
        pieces.append((scheme + slashes + authority + slash, None))
        head = rest
    for token in _PATH_SEPARATORS.split(head):
        parts = _EQUALS.split(token, maxsplit=1)  # [name, "=", value], or [token]
        if len(parts) == 3 and parts[2] and SECRET_NAME.search(unquote_plus(parts[0])):
            pieces.append((parts[0] + parts[1], parts[2]))
        else:
            pieces.append((token, None))
    return pieces


def _drop_secret_parameters(query: str) -> str:
    """A query string (or fragment) without the ``name=value`` components whose name looks like a credential,
    whatever separates them (``&``, ``;``, another ``?``, ``#``); what is kept stays byte for byte."""
    tokens = re.split(r"([&;?#])", query)
    kept: list[str] = []
    for i in range(0, len(tokens), 2):
        sep, part = (tokens[i - 1] if i else ""), tokens[i]
        name, eq, _ = part.partition("=")
        if eq and SECRET_NAME.search(unquote_plus(name)):
            continue
        kept.append(sep + part)
    return "".join(kept).lstrip("&;")
