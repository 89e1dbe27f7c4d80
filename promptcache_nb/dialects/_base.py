"""The :class:`Dialect` protocol: everything that knows one API's wire format, behind one interface.

A dialect is one request format (Anthropic Messages, OpenAI Chat Completions, OpenAI Responses): how to tell a
body is its own, split it into the canonical segments the request layer hashes and diffs (and rebuild it from
them), which shapes its API refuses, how its native usage payload reads as a :class:`~promptcache_nb.usage.Usage`,
its server-sent events (read and written) and its error body. Elsewhere no code asks which format it holds: it
asks the body's dialect object (``dialects.get(name)``, ``dialects.detect(body)``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..usage import Usage, UsageSource
    from ._problems import Problems
    from ._sse import Pairs, StreamSummary

#: The names of the wire formats (``PreparedRequest.dialect``, ``ImportedRequest.dialect``, the stored shape).
DialectName = Literal["anthropic", "openai-chat", "openai-responses"]

#: What one segment of a request is (module docstring of :mod:`promptcache_nb.request`): ``tool``, ``system``,
#: ``schema`` (an OpenAI structured-output schema), ``msg-start`` (first block of an Anthropic message), ``msg``
#: (a later block), ``msg-str`` (string content), ``msg-empty``, ``msg-whole`` (a whole Chat message), ``item`` (a
#: Responses input item) and ``unlogged`` (the measured prefix a partial log lacks).
SegmentKind = Literal["tool", "system", "schema", "msg-start", "msg", "msg-str", "msg-empty", "msg-whole", "item",
                      "unlogged"]

#: One segment as a dialect names it: (path, kind, role, element).
Unit = tuple[str, SegmentKind, "str | None", Any]


class SegmentSink(Protocol):
    """What a dialect's :meth:`Dialect.segment` writes into: the request layer's builder (``prepare``)."""

    body: dict[str, Any]
    shape: dict[str, Any]

    def seg(self, path: str, kind: SegmentKind, role: str | None, element: Any) -> None:
        """One segment."""
        ...

    def section(self, key: str, units: list[Any], emit: Callable[[int, Any], None], *, scalar: bool = False
                ) -> None:
        """One top-level field's units (tools, system blocks, messages...), each turned into segments by ``emit``
        (units equal to the previous request's reuse its segments instead)."""
        ...



@dataclass(frozen=True)
class ProviderDiagnosis:
    """The provider's own word on one request's cache prefix, from its response's ``diagnostics``.

    Attributes:
        reason: a ``PROVIDER_MISS_REASONS`` value (``dialects.anthropic``), ``NO_DIVERGENCE`` (compared,
            nothing diverged) or ``PENDING`` (the comparison had not finished).
        missed_tokens: the provider's estimate of the input tokens after the divergence point
            (``cache_missed_input_tokens``, the ``*_changed`` reasons only), else None.
    """

    reason: str
    missed_tokens: int | None = None


@runtime_checkable
class Dialect(Protocol):
    """One API's request format. Implementations: :mod:`.anthropic`, :mod:`.openai_chat`, :mod:`.openai_responses`.

    Attributes:
        name: the dialect's name (:data:`DialectName`).
        provider: ``anthropic`` or ``openai``: the vendor whose cache model an imported request defaults to.
        list_key: the top-level key of the conversation (``messages``, Responses ``input``).
        only_keys: top-level keys only this API has (the first evidence :func:`~promptcache_nb.dialects.detect`
            reads).
        volatile_fields: top-level fields that never affect what the prefix cache matches.
        field_levels: top-level fields that invalidate the cache from a level on (``model`` -> ``tools``).
        limit_fields: the output-limit fields (a non-negative integer each).
        limits_nullable: whether those limits may be ``null`` (no limit).
        implicit_caching: no explicit cache writes: whatever a request does not read it sends again (OpenAI).
        count_tokens_endpoint: the API has a token-counting endpoint (``/v1/messages/count_tokens``).
        stream_placeholder_usage: a stream cut short reports a placeholder output count (Anthropic's
            ``message_start``), so its usage is not final.
        logged_usage_counts: the counts a logged usage object must carry to be read (an importer skips one without).
        fast_path: ``prepare(trusted=True)`` may take the per-message reuse path for bodies built by strategies.
        whole_units: each unit of :attr:`list_key` is one segment (the OpenAI formats).
        scalar_keys: segment kind -> the top-level key of a one-segment section (``schema`` -> ``text``).
        cache_diagnostics: the API explains a cache miss when a request names its previous response (Anthropic's
            ``diagnostics``, docs/provider_cache_rules.md#anthropic-cache-diagnostics).
    """

    name: DialectName
    provider: str
    list_key: str
    only_keys: frozenset[str]
    volatile_fields: tuple[str, ...]
    field_levels: Mapping[str, str]
    limit_fields: tuple[str, ...]
    limits_nullable: bool
    implicit_caching: bool
    count_tokens_endpoint: bool
    stream_placeholder_usage: bool
    logged_usage_counts: tuple[str, ...]
    fast_path: bool
    whole_units: bool
    scalar_keys: Mapping[str, str]
    cache_diagnostics: bool

    def segment(self, sink: SegmentSink) -> Sequence[str]:
        """Split ``sink.body`` into segments in cache-prefix order, recording its shape; the top-level keys
        segmented. Raises ValueError, one line naming the field, on a shape it cannot segment."""
        ...

    def units_width(self, units: list[Any]) -> int:
        """How many segments these units of :attr:`list_key` make."""
        ...

    def system_count(self, body: Mapping[str, Any], shape: Mapping[str, Any], rest: Mapping[str, Any]) -> int:
        """How many segments the system level holds (system blocks, schema, instructions)."""
        ...

    def rebuild(self, body: dict[str, Any], shape: Mapping[str, Any], chain: list[tuple[str, str | None, Any]]
                ) -> dict[str, Any]:
        """Fill ``body`` (the other top-level fields) from its shape and (kind, role, element) chain."""
        ...

    def required_fields(self, body: Mapping[str, Any], *, count_tokens: bool) -> list[str]:
        """The top-level fields a complete body must have."""
        ...

    def validate(self, body: Mapping[str, Any], out: Problems, partial: bool, skip: int, prev_len: int) -> None:
        """Add the API's refusals of ``body`` to ``out`` in body order (see ``validate_request``)."""
        ...

    def usage(self, payload: Any, *, source: UsageSource) -> Usage:
        """The native ``usage`` object (dict or SDK model) as a :class:`~promptcache_nb.usage.Usage`."""
        ...

    def reply(self, response: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """The reply content of a (non-streamed) response body."""
        ...

    def owns_stream_event(self, name: str | None, data: Any) -> bool:
        """Whether one server-sent event is this API's."""
        ...

    def sse_parse(self, pairs: Pairs) -> StreamSummary:
        """Summarise a complete stream: final usage, response id, model, rebuilt content."""
        ...

    def sse_write(self, response: dict[str, Any], *, include_usage: bool = True) -> list[bytes]:
        """The stream of server-sent events the API sends for ``response`` (a complete response body)."""
        ...

    def error_body(self, status: int, message: str, request_id: str) -> bytes:
        """The API's JSON error body for an HTTP ``status``."""
        ...

    def diagnosis(self, request: Mapping[str, Any] | None, diagnostics: Any) -> ProviderDiagnosis | None:
        """The provider's own diagnosis of a request's cache prefix, from the request body and its response's
        ``diagnostics`` value; None when the API has none or nothing was reported."""
        ...


#: Where one segment goes back in its body: the top-level key, and as what. ``value``: the element itself, joining
#: the key's list when the shape says it was one, else the key's value; ``message``: a message of its own
#: (``{"role", "content": element}``); ``first block``: a message whose content list starts with it; ``next block``:
#: the next block of the last message's content.
Placement = tuple[str, Literal["value", "message", "first block", "next block"]]


def rebuild_from_chain(body: dict[str, Any], shape: Mapping[str, Any], chain: list[tuple[str, str | None, Any]],
                       placements: Mapping[str, Placement], dialect: str) -> dict[str, Any]:
    """``body`` (the other top-level fields) filled from its stored shape and segment chain: every key the shape
    says was a list starts empty, and each segment goes where ``placements`` puts its kind. An unlogged prefix has
    no place in the body; another kind is refused (ValueError)."""
    for key in {key for key, _ in placements.values()}:
        if shape.get(key) == "list":
            body[key] = []
    for kind, role, element in chain:
        where = placements.get(kind)
        if where is None:
            if kind != "unlogged":
                raise ValueError(f"unknown segment kind {kind!r} for {dialect}")
            continue
        key, as_ = where
        if as_ == "value":
            joined = body.get(key)
            if isinstance(joined, list):
                joined.append(element)
            else:
                body[key] = element
        elif as_ == "message":
            body[key].append({"role": role, "content": element})
        elif as_ == "first block":
            body[key].append({"role": role, "content": [element]})
        else:
            body[key][-1]["content"].append(element)
    return body


class DialectBase:
    """What every built-in :class:`Dialect` does the same way: its repr and its rebuild (from its
    :attr:`placements`). (Which format a body is written in is the registry's question,
    :func:`~promptcache_nb.dialects.detect`: its evidence order needs every dialect at once.)"""

    name: DialectName
    cache_diagnostics = False
    #: segment kind -> where it goes back in the body (:data:`Placement`)
    placements: Mapping[str, Placement]

    def __repr__(self) -> str:
        return f"<dialect {self.name}>"

    def rebuild(self, body: dict[str, Any], shape: Mapping[str, Any], chain: list[tuple[str, str | None, Any]]
                ) -> dict[str, Any]:
        return rebuild_from_chain(body, shape, chain, self.placements, self.name)

    def diagnosis(self, request: Mapping[str, Any] | None, diagnostics: Any) -> ProviderDiagnosis | None:
        return None
