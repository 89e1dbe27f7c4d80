"""Ask the provider why a request missed its cache: each Messages request names the previous response's id.

Anthropic's Messages API compares a request with the one whose response ``id`` it names in
``diagnostics.previous_message_id`` and says where they diverged (docs/provider_cache_rules.md
#anthropic-cache-diagnostics). :class:`DiagnosticsChain` is the one place that decides which id a request names:
the previous response of the same conversation, as our own analysis counts it (a capture's or a backend's session;
for the proxy, the session an import groups the request into). The capture, the recording proxy and
:class:`~promptcache_nb.live.AnthropicBackend` call it when told to (``diagnostics=True``); otherwise nothing here
runs and no request changes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from ..dialects.anthropic import DIAGNOSTICS_BETA, with_diagnostics

#: Conversations whose last response id a chain remembers (least recently used forgotten first).
MAX_CONVERSATIONS = 4096

ConversationKey = Callable[[Mapping[str, Any]], str]


def one_conversation(body: Mapping[str, Any]) -> str:
    """Every request is one conversation (a capture's or a backend's session)."""
    return ""


class DiagnosticsChain:
    """The last response id of each conversation, and the request bodies that name it.

    Args:
        conversation: the key of the conversation a request body belongs to (default: one conversation).

    Example:
        >>> chain = DiagnosticsChain()
        >>> chain.ask({"model": "m", "max_tokens": 1, "messages": []})["diagnostics"]
        {'previous_message_id': None}
        >>> chain.answered({"messages": []}, "msg_01")
        >>> chain.ask({"model": "m", "max_tokens": 1, "messages": []})["diagnostics"]
        {'previous_message_id': 'msg_01'}
    """

    def __init__(self, conversation: ConversationKey = one_conversation) -> None:
        self._conversation = conversation
        self._last: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def ask(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``body`` naming its conversation's previous response (null on the first request: it opts in)."""
        key = self._conversation(body)
        with self._lock:
            previous = self._last.get(key)
        return with_diagnostics(body, previous)

    def answered(self, body: Mapping[str, Any], response_id: str | None) -> None:
        """The response to ``body`` came back with ``response_id``: the conversation's next request names it."""
        if not response_id:
            return
        key = self._conversation(body)
        with self._lock:
            self._last[key] = response_id
            self._last.move_to_end(key)
            while len(self._last) > MAX_CONVERSATIONS:
                self._last.popitem(last=False)


def with_beta(value: str | None) -> str:
    """An ``anthropic-beta`` header value that also names :data:`DIAGNOSTICS_BETA` (kept once)."""
    names = [v.strip() for v in (value or "").split(",") if v.strip()]
    if DIAGNOSTICS_BETA not in names:
        names.append(DIAGNOSTICS_BETA)
    return ",".join(names)
