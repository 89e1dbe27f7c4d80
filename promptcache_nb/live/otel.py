"""A live OpenTelemetry receiver: agents export their telemetry to it, their API calls land in a Lab as they happen.

OTLP/HTTP (the OpenTelemetry protocol over HTTP, ``http/json`` and ``http/protobuf``) on loopback, one endpoint
per signal: ``POST /v1/logs`` (Claude Code, Codex and Gemini CLI events, GenAI semantic-conventions events),
``/v1/traces`` (GenAI spans) and ``/v1/metrics`` (answered, counted, not stored: agents' token metrics are sums over
a window, never one request, and the same calls arrive as log events); ``POST /`` takes a JSON export of any signal
(its top-level list names it), for exporters that post every signal to the endpoint as configured. Bodies are JSON
(``Content-Type: application/json``) or protobuf (``application/x-protobuf``, decoded with the
``opentelemetry-proto`` package: ``pip install 'promptcache-nb[otel]'``), ``Content-Encoding: gzip`` or none.

Each export is mapped by the OTLP importer's own mapping (:meth:`~promptcache_nb.readers.otlp.OtlpReader.export`,
the rules in :mod:`promptcache_nb.readers.otlp`) and its requests stored as a usage-first import stores them
(measured usage, cost, the cause usage alone shows; one session per agent session id), **in one transaction per
POST**: all of an export's requests or none. The export is also appended, as one line of OTLP JSON, to a spool file
(``<store>.otel/<start time>-<pid>.jsonl`` beside a store file; a temporary folder for an in-memory Lab;
``spool=`` to choose): that line is the log the stored requests were read from, so analysing a session later
(``lab.analyze``, opening it) reads them again from it, and ``lab.import_log`` of the spool stores the same rows. A
POST whose store transaction fails has its spool line removed.

Answers: 200 with an empty ``Export*ServiceResponse`` (JSON or protobuf, as asked); a record the mapping could not
read (a token count that is not one) is left out and reported in ``partialSuccess`` (OTLP's way to say so; the
export's other records are stored). A payload that is not an OTLP export (malformed JSON or protobuf, the wrong
top-level shape, an unsupported encoding) gets **400** with one line (``{"code": 3, "message": ...}``) and stores
nothing; a body over :data:`MAX_OTLP_BODY_BYTES` (compressed, or once decompressed) gets **413**; an unsupported
``Content-Type`` 415.

One Lab, one connection: the receiver stores through the Lab it is given, from its server thread. DuckDB runs one
call at a time on a connection and refuses a second instead of waiting, so a notebook query on the same Lab at the
instant an export is being stored can fail with "connection is busy" (run it again); an export refused that way
gets **503** with ``Retry-After``, which OTLP exporters retry. Heavy notebook work on a Lab that receives is best
kept between exports, or done on another store; ``promptcache-nb otel`` holds its store alone.

Keys: agents may send credentials in headers (``OTEL_EXPORTER_OTLP_HEADERS``). Only ``Content-Type`` and
``Content-Encoding`` are read; no header is logged, stored or echoed. The spool holds the export bodies as the
agent sent them (resource attributes such as ``user.email`` included): it is your telemetry, on your disk.
"""

from __future__ import annotations

import base64
import importlib
import json
import logging
import os
import tempfile
import threading
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import PromptCacheError
from ..readers import ImportedRequest, SkippedLine
from ..readers.otlp import OtlpReader
from ._asgi import REQUEST_TIMEOUT, BodyError, read_body
from ._serving import LoopbackServer


class ReceivingLab(Protocol):
    """What the receiver needs of the Lab it stores into (a :class:`~promptcache_nb.Lab`, which sits above the
    live stage: named by what it does, never imported)."""

    path: str
    store: Any

    def store_records(self, records: Sequence[ImportedRequest], *, format: str, file: str) -> Any:  # noqa: A002
        ...

log = logging.getLogger("promptcache_nb.otel")

__all__ = ["MAX_OTLP_BODY_BYTES", "OtlpBatch", "OtlpReceiver"]

#: The largest export body accepted, compressed or decompressed (16 MiB; an agent's batch of a few hundred events is
#: well under 1 MiB). Larger bodies get 413 and are not read further.
MAX_OTLP_BODY_BYTES = 16 * 1024 * 1024
#: The top-level list of each signal's export request, in its OTLP JSON encoding.
_EXPORT_LISTS = {"logs": "resourceLogs", "traces": "resourceSpans", "metrics": "resourceMetrics"}
#: The turns columns a batch hands its listeners (what the live monitor shows).
#: Where a follower in another process reads what the receiver stored (:class:`OtlpFollower`).
FOLLOW_PATH = "/pcnb/v1/batches"
#: Exports a receiver keeps for its followers.
RECENT_BATCHES = 1000
BATCH_COLUMNS = ("session_id", "idx", "sent_at", "model", "request_id", "usage_source", "input_tokens",
                 "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens", "cost_usd",
                 "cost_no_cache_usd", "broke", "dedupe_key")


class _Refused(Exception):
    """An export this receiver will not take: the HTTP status and one line saying why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class OtlpBatch:
    """One export the receiver took (one POST).

    Attributes:
        signal: ``logs``, ``traces`` or ``metrics``.
        received_at: when it arrived (UTC).
        items: log records, spans or metric data points in it.
        requests: API requests found among them.
        stored: requests stored now.
        duplicates: requests stored already (an exporter's retry of an export).
        rejected: records the mapping could not read (reported to the agent in ``partialSuccess``).
        reasons: why, one line each.
        session_ids: the sessions it stored requests into.
        rows: the stored requests' ``turns`` rows (:data:`BATCH_COLUMNS`), oldest first (read when the receiver
            has a listener: :meth:`OtlpReceiver.subscribe`).
    """

    signal: str
    received_at: datetime
    items: int
    requests: int = 0
    stored: int = 0
    duplicates: int = 0
    rejected: int = 0
    reasons: tuple[str, ...] = ()
    session_ids: tuple[str, ...] = ()
    rows: tuple[dict[str, Any], ...] = field(default=(), repr=False)

    def line(self) -> str:
        """One line for a terminal: what arrived and what was stored."""
        what = {"logs": "log records", "traces": "spans", "metrics": "metric points"}[self.signal]
        text = f"{self.received_at:%H:%M:%S} {self.signal}: {self.items} {what}"
        if self.signal != "metrics":
            text += (f", {self.requests} API requests, {self.stored} stored in {len(self.session_ids)} session(s)"
                     + (f", {self.duplicates} already stored" if self.duplicates else ""))
        else:
            text += " (not stored: requests come from the log events)"
        if self.rejected:
            text += f", {self.rejected} rejected ({self.reasons[0]})"
        return text


class OtlpReceiver(LoopbackServer):
    """Receive OTLP/HTTP exports from agents and store their API calls in ``lab`` as they arrive.

    Args:
        lab: the Lab to store into (its store must be writable).
        host: interface to bind; loopback by default. Binding anything else logs a warning: anyone who can reach
            the port can write into your store.
        port: TCP port; 0 picks a free one (read :attr:`url`). Agents' OTLP/HTTP default is 4318.
        spool: the folder of the spool files (see the module docstring); default beside the store.
        max_body_bytes: larger bodies (compressed or not) get 413.
        request_timeout: seconds a client has to send the request headers, and then the body.

    Example:
        >>> with pc.live.OtlpReceiver(lab) as otel:  # doctest: +SKIP
        ...     print(otel.env["claude"])  # the variables that point Claude Code at it
        ...     monitor = pc.widgets.Monitor(otel); display(monitor)
    """

    def __init__(self, lab: ReceivingLab, *, host: str = "127.0.0.1", port: int = 0, spool: str | Path | None = None,
                 max_body_bytes: int = MAX_OTLP_BODY_BYTES, request_timeout: float = REQUEST_TIMEOUT) -> None:
        self.lab = lab
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.request_timeout = request_timeout
        self._spool_dir = Path(spool) if spool is not None else None
        #: the spool file of this run (created on start)
        self.spool_path: Path | None = None
        #: exports taken since start, and requests stored from them
        self.batches = 0
        self.stored = 0
        self._lines = 0
        self._ids_seen: set[str] = set()
        self._reader = OtlpReader()
        self._lock = threading.Lock()  # one export stored at a time, in arrival order
        self._listeners: list[Callable[[OtlpBatch], None]] = []
        # what a follower in another process (OtlpFollower, GET /pcnb/v1/batches) has not read yet: numbered
        # exports, kept (with their rows) only once someone follows, the last RECENT_BATCHES of them
        self._recent: deque[tuple[int, OtlpBatch]] = deque(maxlen=RECENT_BATCHES)
        self._recent_seq = 0
        self._followed = False
        self._server = None
        self._made_spool: tuple[Path, Path | None] = (Path(), None)

    # -- lifecycle (start, close, stop, with: live/_serving.py) -----------------------------------
    _thread_name = "promptcache-otel"
    _network_warning = ("the OTLP receiver listens on %s: anyone who can reach it can write into its Lab's store; "
                        "bind 127.0.0.1 unless you mean it")

    def _serve_app(self) -> Any:
        """Create this run's spool file before serving: fail at start, not at the first export, when the store is
        read-only or the spool cannot be written."""
        if self.lab.store.read_only:
            raise PromptCacheError(f"the receiver stores into the Lab, whose store is read-only "
                                   f"({self.lab.store.read_only_why})")
        folder = self._spool_dir or _default_spool_dir(self.lab.path)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        spool = (folder / f"{stamp}-{os.getpid()}.jsonl").resolve()
        made = not folder.exists()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            spool.touch()
        except OSError as exc:
            raise PromptCacheError(f"cannot create the receiver's spool in {folder} ({exc.strerror or exc}): "
                                   "pass spool= a writable folder") from None
        self._made_spool = (spool, folder if made else None)
        self.spool_path = spool
        self._lines, self._ids_seen = 0, set()
        # "/" too: some exporters post every signal to the endpoint as configured (Gemini CLI's http exporters in
        # versions that do not append /v1/<signal>); a JSON export says which signal it is
        routes = [Route(path, self._endpoint, methods=["POST"]) for path in ("/", *(f"/v1/{s}" for s in _EXPORT_LISTS))]
        routes.append(Route(FOLLOW_PATH, self._follow_endpoint, methods=["GET"]))
        return Starlette(routes=routes)

    def _not_served(self) -> None:
        """The port could not be bound: the spool made for this run goes too."""
        spool, folder = self._made_spool
        spool.unlink(missing_ok=True)
        if folder is not None:
            folder.rmdir()
        self.spool_path = None

    @property
    def url(self) -> str:
        """``http://host:port``: the OTLP/HTTP endpoint base (agents append ``/v1/logs``...)."""
        return self._url("receiver")

    @property
    def env(self) -> dict[str, dict[str, str]]:
        """The environment variables that point each agent at :attr:`url`, by agent (``claude``, ``gemini``;
        Codex reads its ``[otel]`` table in ``~/.codex/config.toml`` instead: see docs/otel.md)."""
        url = self.url
        return {
            "claude": {"CLAUDE_CODE_ENABLE_TELEMETRY": "1", "OTEL_LOGS_EXPORTER": "otlp",
                       "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_ENDPOINT": url},
            "gemini": {"GEMINI_TELEMETRY_ENABLED": "true", "GEMINI_TELEMETRY_TARGET": "local",
                       "GEMINI_TELEMETRY_OTLP_PROTOCOL": "http", "GEMINI_TELEMETRY_OTLP_ENDPOINT": url},
        }

    def subscribe(self, fn: Callable[[OtlpBatch], None]) -> Callable[[], None]:
        """Call ``fn(batch)`` after each export is stored (in the receiver's thread); returns the unsubscribe
        function. An exception in ``fn`` is logged, never returned to the agent."""
        self._listeners.append(fn)

        def unsubscribe() -> None:
            if fn in self._listeners:
                self._listeners.remove(fn)

        return unsubscribe

    def __repr__(self) -> str:
        where = self.url if self.running else "stopped"
        return f"OtlpReceiver({where}, store={self.lab.path!r}, batches={self.batches}, stored={self.stored})"

    # -- one export ---------------------------------------------------------------------------
    async def _endpoint(self, request: Request) -> Response:
        path_signal = request.url.path.rsplit("/", 1)[-1] or None  # None: posted to "/"
        protobuf = request.headers.get("content-type", "").split(";")[0].strip().lower() == "application/x-protobuf"
        try:
            body = await read_body(request, limit=self.max_body_bytes, timeout=self.request_timeout)
            signal, doc = self._decode(path_signal, body, request.headers.get("content-type", ""),
                                       request.headers.get("content-encoding", ""))
            # stored on the server's thread: exports are taken one at a time, in the order they arrive
            batch = self._take(signal, doc)
        except BodyError as exc:
            return _error(exc.status, exc.message)
        except _Refused as exc:
            return _error(exc.status, exc.message)
        except Exception as exc:  # noqa: BLE001 - one line to the agent and the log; the server keeps serving
            if _busy(exc):  # the Lab's connection was running another call (the notebook's): 503, which exporters retry
                return _error(503, "the store is busy with another call; retry", retry_after=1)
            message = f"the export could not be stored ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
            log.error("%s", message)
            return _error(500, message)
        if self._followed:
            with self._lock:
                self._recent_seq += 1
                self._recent.append((self._recent_seq, batch))
        for fn in list(self._listeners):
            try:
                fn(batch)
            except Exception:
                log.exception("a listener of the OTLP receiver failed")
        return _answer(signal, batch, protobuf=protobuf)

    async def _follow_endpoint(self, request: Request) -> Response:
        """``GET /pcnb/v1/batches?after=N``: the exports stored after number N, with their rows, as JSON; without
        ``after``, none, and the number to ask after next (a follower sees what arrives from when it starts)."""
        with self._lock:
            self._followed = True
            latest = self._recent_seq
            after = request.query_params.get("after")
            try:
                since = latest if after is None else int(after)
            except ValueError:
                return _error(400, f"after={after!r} is not a whole number")
            batches = [_batch_json(b) for seq, b in self._recent if seq > since]
        return Response(json.dumps({"next": latest, "batches": batches}), media_type="application/json")

    def _decode(self, signal: str | None, body: bytes, content_type: str, encoding: str
                ) -> tuple[str, dict[str, Any]]:
        """The export's signal and the export as an OTLP JSON document, or :class:`_Refused`. ``signal`` None (a
        POST to ``/``): the JSON document's top-level list says which."""
        coding = encoding.strip().lower()
        if coding == "gzip":
            body = _gunzip(body, self.max_body_bytes)
        elif coding not in ("", "identity"):
            raise _Refused(400, f"Content-Encoding {coding!r} is not supported (send gzip or none)")
        kind = content_type.split(";")[0].strip().lower()
        if kind == "application/json":
            try:
                doc = json.loads(body)
            except (ValueError, RecursionError) as exc:
                where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
                raise _Refused(400, f"the body is not valid JSON{where}: {str(exc).split(':')[0][:120]}") from None
        elif kind == "application/x-protobuf":
            if signal is None:
                raise _Refused(400, "post a protobuf export to /v1/logs, /v1/traces or /v1/metrics (its bytes do "
                                    "not say which signal they are)")
            doc = _from_protobuf(signal, body)
        else:
            raise _Refused(415, f"Content-Type {kind or '(none)'!r} is not an OTLP encoding: send application/json "
                                "or application/x-protobuf")
        if signal is None:
            signal = next((s for s, key in _EXPORT_LISTS.items() if isinstance(doc, dict) and key in doc), None)
            if signal is None:
                raise _Refused(400, "not an OTLP export: expected an object with a 'resourceLogs', 'resourceSpans' "
                                    "or 'resourceMetrics' list")
        key = _EXPORT_LISTS[signal]
        if not isinstance(doc, dict) or not isinstance(doc.get(key, []), list):
            raise _Refused(400, f"not an OTLP {signal} export: expected an object with a {key!r} list")
        for i, resource in enumerate(doc.get(key, [])):
            if not isinstance(resource, dict):
                raise _Refused(400, f"{key}[{i}] is not an object")
        return signal, doc

    def _take(self, signal: str, doc: dict[str, Any]) -> OtlpBatch:
        now = datetime.now(UTC)
        if signal == "metrics":
            return OtlpBatch(signal, now, _metric_points(doc))
        with self._lock:
            assert self.spool_path is not None  # started
            spool = str(self.spool_path)
            line = self._lines + 1
            ids_before = set(self._ids_seen)
            try:
                records = list(self._reader.export(doc, spool, lambda k: f"{spool}:{line}", self._ids_seen))
            except RecursionError:  # an attribute value nested thousands deep
                self._ids_seen = ids_before
                raise _Refused(400, "an attribute value is nested too deeply to read") from None
            requests = [r for r in records if isinstance(r, ImportedRequest)]
            reasons = tuple(r.reason for r in records if isinstance(r, SkippedLine))
            items = _items(doc, signal)
            if not requests:
                self._ids_seen = ids_before
                self.batches += 1
                return OtlpBatch(signal, now, items, rejected=len(reasons), reasons=reasons)
            text = json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n"
            with open(spool, "ab") as fh:
                offset = fh.tell()
                fh.write(text.encode("utf-8", errors="surrogatepass"))
            try:
                result = self.lab.store_records(requests, format="otlp", file=spool)
            except BaseException:
                # nothing of the export is stored: its spool line goes too (analysis would read it again)
                with open(spool, "r+b") as fh:
                    fh.truncate(offset)
                self._ids_seen = ids_before
                raise
            self._lines = line
            self.batches += 1
            self.stored += result.new
            reasons += tuple(r["reason"] for r in result.skipped)
            rows = self._rows(result.session_ids, {r.dedupe_key for r in requests}, min(r.at for r in requests)) \
                if (self._listeners or self._followed) and result.new else ()  # a read only for someone to hear it
        return OtlpBatch(signal, now, items, len(requests), result.new, result.duplicates, len(reasons), reasons,
                         tuple(result.session_ids), rows)

    def _rows(self, session_ids: list[str], keys: set[str], since: datetime) -> tuple[dict[str, Any], ...]:
        store = self.lab.store
        rows = [r for sid in session_ids for r in store.turn_rows(sid, BATCH_COLUMNS, since=since)
                if r["dedupe_key"] in keys]
        return tuple(sorted(rows, key=lambda r: (r["sent_at"], r["session_id"], r["idx"])))


def _batch_json(batch: OtlpBatch) -> dict[str, Any]:
    """A batch as the follow endpoint sends it (times in ISO 8601)."""
    out = {k: getattr(batch, k) for k in OtlpBatch.__dataclass_fields__}
    out["received_at"] = batch.received_at.isoformat()
    out["rows"] = [{k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()} for row in batch.rows]
    return out


def _batch_from_json(doc: dict[str, Any]) -> OtlpBatch:
    """:func:`_batch_json`'s document as the batch again (times parsed, lists as tuples)."""
    values = {k: doc[k] for k in OtlpBatch.__dataclass_fields__ if k in doc}
    values["received_at"] = datetime.fromisoformat(doc["received_at"])
    values["reasons"], values["session_ids"] = tuple(values.get("reasons", ())), tuple(values.get("session_ids", ()))
    values["rows"] = tuple({k: datetime.fromisoformat(v) if k == "sent_at" and isinstance(v, str) else v
                            for k, v in row.items()} for row in values.get("rows", ()))
    return OtlpBatch(**values)


class OtlpFollower:
    """Follow an :class:`OtlpReceiver` running in another process (``promptcache-nb otel STORE`` in a terminal)
    from a notebook: the receiver holds the store's write lock, so the notebook cannot open the store, but it can
    ask the receiver what it stored. Polls ``url`` every ``interval`` seconds on a background thread while someone
    is subscribed; :class:`~promptcache_nb.widgets.Monitor` takes one (or the URL itself).

    Example:
        >>> monitor = pc.widgets.Monitor("http://127.0.0.1:4318")  # doctest: +SKIP
    """

    def __init__(self, url: str, *, interval: float = 1.0, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.interval = interval
        self.timeout = timeout
        self.error: str | None = None  # the last poll's failure, one line (None once a poll succeeds)
        self._listeners: list[Callable[[OtlpBatch], None]] = []
        self._next: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.poll()  # fail here, in one line, when nothing answers at url

    def poll(self) -> list[OtlpBatch]:
        """Ask once for what was stored since the last poll; hand each export to the subscribers."""
        params = {} if self._next is None else {"after": str(self._next)}
        try:
            answer = httpx.get(self.url + FOLLOW_PATH, params=params, timeout=self.timeout)
            answer.raise_for_status()
            doc = answer.json()
        except (httpx.HTTPError, ValueError) as exc:
            self.error = f"no OTLP receiver answers at {self.url} ({type(exc).__name__}: {exc})"
            if self._next is None:
                raise PromptCacheError(self.error + ": start one with `promptcache-nb otel STORE`") from None
            return []
        self.error = None
        self._next = int(doc["next"])
        batches = [_batch_from_json(b) for b in doc["batches"]]
        for batch in batches:
            for fn in list(self._listeners):
                try:
                    fn(batch)
                except Exception:
                    log.exception("a listener of the OTLP follower failed")
        return batches

    @property
    def running(self) -> bool:
        """Whether the receiver answered the last poll."""
        return self.error is None

    def subscribe(self, fn: Callable[[OtlpBatch], None]) -> Callable[[], None]:
        """Call ``fn(batch)`` for each export the receiver stores from now on (on the polling thread); returns the
        unsubscribe function. The thread runs while anyone is subscribed."""
        self._listeners.append(fn)
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="promptcache-otel-follow", daemon=True)
            self._thread.start()

        def unsubscribe() -> None:
            if fn in self._listeners:
                self._listeners.remove(fn)
            if not self._listeners:
                self.close()

        return unsubscribe

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def close(self) -> None:
        """Stop polling."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.timeout + self.interval)

    def __repr__(self) -> str:
        return f"OtlpFollower({self.url!r}, {'following' if self._thread and self._thread.is_alive() else 'idle'})"


def _default_spool_dir(store_path: str) -> Path:
    if store_path.startswith(":memory:"):
        return Path(tempfile.mkdtemp(prefix="promptcache-otel-"))
    return Path(store_path).expanduser().resolve().with_name(Path(store_path).name + ".otel")


def _gunzip(body: bytes, limit: int) -> bytes:
    """``body`` decompressed, refusing more than ``limit`` bytes out (a small bomb stays small)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
        if len(out) > limit:
            raise _Refused(413, f"the body decompresses to more than the limit of {limit} bytes")
        if not inflater.eof:
            raise _Refused(400, "the gzip body is truncated")
    except zlib.error as exc:
        raise _Refused(400, f"the body is not valid gzip ({exc})") from None
    return out


def _from_protobuf(signal: str, body: bytes) -> dict[str, Any]:
    """A protobuf export request as its OTLP JSON document (camelCase names, int64 as strings, ids in hex)."""
    message = _request_class(signal)()  # refuses the export (415) when opentelemetry-proto is not installed
    json_format, pb_message = _protobuf()
    try:
        message.ParseFromString(body)
    except (pb_message.DecodeError, ValueError, RecursionError) as exc:
        raise _Refused(400, f"the body is not a protobuf Export{signal.title()}ServiceRequest "
                            f"({str(exc)[:120]})") from None
    doc: dict[str, Any] = json_format.MessageToDict(message)
    _hex_ids(doc)
    return doc


def _protobuf() -> tuple[ModuleType, ModuleType]:
    """``google.protobuf``'s ``json_format`` and ``message`` modules: present with the export classes
    (:func:`_messages`), which say what to install when they are not."""
    from google.protobuf import json_format, message  # the optional otel extra: only protobuf exports need it

    return json_format, message


def _request_class(signal: str) -> Any:
    return _messages(signal)[0]


def _response_class(signal: str) -> Any:
    return _messages(signal)[1]


def _messages(signal: str) -> tuple[Any, Any]:
    """The signal's protobuf export request and response classes."""
    module, service = _SERVICES[signal]
    try:
        found = importlib.import_module(module)  # the optional opentelemetry-proto package: JSON exports need none
    except ImportError:
        raise _Refused(415, "protobuf exports need the opentelemetry-proto package (pip install "
                            "'promptcache-nb[otel]'), or set the agent's protocol to http/json") from None
    return getattr(found, f"Export{service}ServiceRequest"), getattr(found, f"Export{service}ServiceResponse")


#: signal -> (the module of its protobuf export service, the service's name)
_SERVICES = {
    "logs": ("opentelemetry.proto.collector.logs.v1.logs_service_pb2", "Logs"),
    "traces": ("opentelemetry.proto.collector.trace.v1.trace_service_pb2", "Trace"),
    "metrics": ("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2", "Metrics"),
}


def _hex_ids(doc: dict[str, Any]) -> None:
    """Trace and span ids as OTLP JSON writes them (hex), not as protobuf's JSON mapping does (base64)."""
    def fix(obj: dict[str, Any]) -> None:
        for key in ("traceId", "spanId", "parentSpanId"):
            if isinstance(obj.get(key), str):
                obj[key] = base64.b64decode(obj[key]).hex()

    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                fix(span)
    for rl in doc.get("resourceLogs", []):
        for sl in rl.get("scopeLogs", []):
            for rec in sl.get("logRecords", []):
                fix(rec)


def _items(doc: dict[str, Any], signal: str) -> int:
    scopes, items = {"logs": ("scopeLogs", "logRecords"), "traces": ("scopeSpans", "spans")}[signal]
    return sum(len(s[items]) for r in doc.get(_EXPORT_LISTS[signal], []) for s in _as_list(r.get(scopes))
               if isinstance(s, dict) and isinstance(s.get(items), list))


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _metric_points(doc: dict[str, Any]) -> int:
    n = 0
    for rm in doc.get("resourceMetrics", []):
        for sm in _as_list(rm.get("scopeMetrics")):
            for metric in _as_list(sm.get("metrics")) if isinstance(sm, dict) else []:
                for kind in ("sum", "gauge", "histogram", "exponentialHistogram", "summary"):
                    data = metric.get(kind) if isinstance(metric, dict) else None
                    if isinstance(data, dict):
                        n += len(_as_list(data.get("dataPoints")))
    return n


def _answer(signal: str, batch: OtlpBatch, *, protobuf: bool) -> Response:
    """The export's OTLP response: empty, or a ``partialSuccess`` naming what was rejected."""
    answer: dict[str, Any] = {}
    if batch.rejected:
        count = {"logs": "rejectedLogRecords", "traces": "rejectedSpans", "metrics": "rejectedDataPoints"}[signal]
        answer["partialSuccess"] = {count: str(batch.rejected), "errorMessage": batch.reasons[0][:500]}
    if protobuf:
        json_format, _ = _protobuf()  # present: the request was protobuf
        message = json_format.ParseDict(answer, _response_class(signal)())
        return Response(message.SerializeToString(), media_type="application/x-protobuf")
    return Response(json.dumps(answer), media_type="application/json")


def _error(status: int, message: str, *, retry_after: int | None = None) -> Response:
    line = " ".join(message.split())  # one line, whatever the cause held
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return Response(json.dumps({"code": 3 if status == 400 else status, "message": line}), status_code=status,
                    media_type="application/json", headers=headers)


def _busy(exc: BaseException) -> bool:
    """True when DuckDB refused a call because the connection was running another one (DuckDB 2 refuses instead
    of waiting), here or in the exception's causes."""
    seen: BaseException | None = exc
    while seen is not None:
        if "connection is busy" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False

