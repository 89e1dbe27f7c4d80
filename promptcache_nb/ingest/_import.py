"""From readers' records to stored sessions: ``lab.import_log(paths)``.

Readers (one module per format) are pure; this module groups their requests into sessions, sizes the unlogged
prefix of partial bodies from measured usage, and writes each session's new requests in one transaction through
``Session.record`` (so imported requests get the same diff, observation, ideal read and cost as any other).
Re-importing a file adds only requests whose ``dedupe_key`` is not stored yet, so a growing log can be
re-imported as it grows.
"""

from __future__ import annotations

import html
import re
import warnings
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from .. import analysis as _analysis
from .._config import DEFAULT_ACCOUNT, SessionConfig
from .._lazy import pandas as pd
from .._shared import ScopeKey, scope_key
from .._types import HISTORY_FROM_PARENT, HISTORY_MISSING
from .._util import digest, gc_paused, progress_bar, user_stacklevel
from ..analysis.calibrate import FAMILY_COLUMNS, calibrate_families, needs_calibration
from ..analysis.cause import UsageOnly, usage_cause
from ..analysis.frames import html_table
from ..analysis.observe import usage_break
from ..analysis.rollups import session_summary
from ..cache import get_cache_model
from ..cache.anthropic import TTL_SECONDS, client_ttls_from_usage
from ..dialects import get as get_format
from ..errors import ImportFormatError, PromptCacheError, SessionError, UnpricedModelWarning, UsageError
from ..pipeline import reply_output_tokens, usage_record
from ..readers._jsonl import UnreadableLog
from ..readers._messages import append_message
from ..readers._registry import READERS, detect
from ..readers._types import ImportedRequest, SkippedLine
from ..request import BodyProblem, PreparedRequest, check_request
from ..request.diff import visible
from ._groups import LogFile, display_path, expand_paths, plan_groups
from ._prefixes import UnloggedPrefix, agreed_prefix, covers

if TYPE_CHECKING:

    from ..session import Session
    from ..workspace import Workspace

SKIPPED_COLUMNS = ["file", "line", "reason"]
NOTES_COLUMNS = ["file", "line", "note"]
FLAGGED_COLUMNS = ["file", "line", "path", "problem"]
#: One line wherever ``openclaw_breaks`` and ``rebuilds`` appear side by side.
BREAKS_VS_REBUILDS = ("rebuilds: the requests that broke the cache (sent again > 256 tokens it held, the verdict); "
                      "openclaw_breaks: OpenClaw's read-drop rule, a cross-check (the read fell ≥ 5 % and 1,000 "
                      "tokens, or to 0): it misses an agent that never reads its cache.")
#: ``input_tokens`` is only the uncached part of the input: say so wherever it is shown.
UNCACHED_NOTE = ("cache_read_pct = cache read / total input; total input = uncached input (input_tokens) + cache "
                 "read + cache write.")
_SHORT = {"claude-code": "cc", "codex": "codex", "vcr": "vcr", "har": "har", "exchanges": "proxy", "otlp": "otel",
          "pi": "pi", "openclaw": "claw"}


class SessionList(Sequence["Session"]):
    """The sessions an import stored, by id, each opened (``lab.open_session``) when first read and then kept.

    An import of a whole history must not hold every session it stored (each keeps its last request and its
    token counts): memory would grow with the folder, not with its largest session. ``ids`` never opens one.
    """

    def __init__(self, lab: Workspace | None = None, ids: Iterable[str] = ()) -> None:
        #: the Lab the sessions are opened in
        self.lab = lab
        self.ids: list[str] = list(ids)
        self._held: dict[int, Session] = {}

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> Session: ...
    @overload
    def __getitem__(self, index: slice) -> list[Session]: ...
    def __getitem__(self, index: int | slice) -> Session | list[Session]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self.ids))[index]]
        i = range(len(self.ids))[index]  # IndexError as a list says it
        s = self._held.get(i)
        if s is None:
            assert self.lab is not None  # a list with ids was given its Lab
            s = self._held[i] = self.lab.open_session(self.ids[i])
        return s

    def __iter__(self) -> Iterator[Session]:
        return (self[i] for i in range(len(self.ids)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SessionList):
            return self.ids == other.ids
        return isinstance(other, list) and list(self) == other

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"SessionList({self.ids!r})"


class _FrameField:
    """A DataFrame attribute of :class:`ImportResult` kept as rows until first read: an import that is only
    stored (a script, the benchmark) never loads pandas (about a second of CPU)."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = list(columns)
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = "_" + name

    def __get__(self, obj: Any, objtype: type | None = None) -> pd.DataFrame:
        if obj is None:
            return self  # the class attribute: the descriptor itself
        held = obj.__dict__.get(self.name)
        if held is None or isinstance(held, list):
            held = obj.__dict__[self.name] = _frame(held or [], self.columns)
        return held

    def __set__(self, obj: Any, value: pd.DataFrame | list[dict[str, Any]]) -> None:
        # the dataclass's __init__ passes the descriptor itself as the default: nothing given
        obj.__dict__[self.name] = None if isinstance(value, _FrameField) else value


@dataclass
class ImportResult:
    """What :meth:`Lab.import_log` did.

    Attributes:
        sessions: the sessions that received requests (new or grown), in import order (a
            :class:`SessionList`: each is opened when read; ``sessions.ids`` are their ids).
        requests: how many requests were stored now (already-stored requests are not counted).
        skipped: one row per line or entry not imported (``file``, ``line``, ``reason``).
        flagged: one row per problem of a stored body that the API would refuse (``file``, ``line``, ``path``,
            ``problem``; :func:`~promptcache_nb.request.validate_request`): a log holds what was sent, so the body
            is stored as logged, and its request's ``turns.body_problems`` keeps the problems. A body that is
            not JSON at all (NaN, a lone surrogate, nesting past the limit) is skipped instead.
        unknown_models: model ids the price library does not know (their requests have a NULL cost).
        files: the files read, with their format.
        calibrations: one row per tokenizer family of the imported models: the token-estimate calibration
            fitted on the lab's measured requests of that family, and whether it was saved
            (:func:`~promptcache_nb.analysis.calibrate.calibrate_families`; measured figures never change).
        notes: one row per assumption made reading a stored request's usage (``file``, ``line``, ``note``), e.g.
            a cache write logged without its 5m/1h split, priced at the 5-minute rate (``turns.notes``).
    """

    sessions: SessionList = field(default_factory=SessionList)
    requests: int = 0
    skipped: _FrameField = _FrameField(SKIPPED_COLUMNS)
    flagged: _FrameField = _FrameField(FLAGGED_COLUMNS)
    unknown_models: list[str] = field(default_factory=list)
    files: list[tuple[str, str]] = field(default_factory=list)
    already_stored: int = 0
    calibrations: _FrameField = _FrameField(FAMILY_COLUMNS)
    notes: _FrameField = _FrameField(NOTES_COLUMNS)
    #: the paths the user passed, resolved: ``source`` is shown relative to them (a folder: the path inside it;
    #: a file: its name)
    roots: list[Path] = field(default_factory=list)
    #: the last file group read filled its batch (sessions or requests): another group after it would have begun
    #: a new one (``_parallel``: where a run of file groups may end)
    ended_full_batch: bool = field(default=False, repr=False)

    def relative_source(self, source: str | None) -> str:
        """``source`` as the user would spell it: relative to the folder they passed, or the file's name."""
        return self._spelled(source, public=False)

    def _shown_source(self, source: str | None) -> str:
        """``source`` for a page others read: under a folder you passed, that folder's name and the path inside it
        (``claude_code/-home-dev-billing-service/<id>.jsonl``); else under your home folder, ``~/…``; else the
        file's name. Never an absolute path."""
        return self._spelled(source, public=True)

    def _spelled(self, source: str | None, *, public: bool) -> str:
        if not source:
            return ""
        prefix, sep, rest = source.partition(":")
        if sep and "/" not in prefix and "\\" not in prefix and len(prefix) > 1:  # "vcr:/path" (not "C:\\")
            return prefix + ":" + self._spelled(rest, public=public)
        path = Path(source)
        for root in self.roots:
            if path == root or path.is_relative_to(root):
                if public:
                    return (Path(root.name) / path.relative_to(root)).as_posix()
                return path.name if path == root else str(path.relative_to(root))
        if not public:
            return source
        home = Path.home()
        if path.is_relative_to(home):
            return "~/" + path.relative_to(home).as_posix()
        return path.name

    def _relative_files(self, df: pd.DataFrame) -> pd.DataFrame:
        if not len(df) or "file" not in df:
            return df
        # object dtype: pandas' pyarrow-backed default string dtype cannot hold a lone surrogate a name may carry
        return df.assign(file=pd.Series([self.relative_source(f) for f in df["file"]], index=df.index, dtype=object))

    def summary(self, *, full_paths: bool = False) -> pd.DataFrame:
        """One row per session, key columns first: session, requests, measured cache read %, ``openclaw_breaks``,
        ``rebuilds``, cost, then model, parent ("" when none) and source (relative to the paths you passed;
        ``full_paths=True`` adds ``source_path``, the full path).

        ``openclaw_breaks`` counts OpenClaw breaks (the cache read fell at least 5 % and 1,000 tokens below the
        previous read, or to 0 with nothing changed); ``rebuilds`` counts the requests that had to send again
        more than 256 tokens of what the previous request held (:func:`~promptcache_nb.rebuilds`). They differ:
        a small loss, or one after an earlier partial read, is a rebuild without a break; a read that fell
        because the prompt got shorter (a compaction) is a break without a rebuild.
        """
        columns = ["session", "requests", "cache_read_pct", "openclaw_breaks", "rebuilds", "cost_usd", "model",
                   "parent", "source"]
        if not self.sessions or self.sessions.lab is None:
            df = _frame([], [*columns, "source_path"])
        else:  # one query for every session imported (analysis.rollups: the one summary vocabulary)
            df = session_summary(self.sessions.lab, self.sessions.ids)
            df = df.assign(source_path=df["source"], source=df["source"].map(self.relative_source))
        return df[[*columns, "source_path"]] if full_paths else df[columns]

    def __repr__(self) -> str:
        flagged = f", {self._count('flagged')} body problems flagged" if self._count("flagged") else ""
        noted = f", {self._count('notes')} with notes" if self._count("notes") else ""
        return (f"ImportResult({len(self.sessions)} sessions, {self.requests} new requests, "
                f"{self.already_stored} already stored, {self._count('skipped')} skipped{flagged}{noted})")

    def _count(self, name: str) -> int:
        """Rows of a frame attribute, without building the DataFrame."""
        held = self.__dict__.get("_" + name)
        return 0 if held is None else len(held)

    def _repr_html_(self) -> str:
        # file names, models, skipped lines and body problems are data: escaped, invisible characters (and lone
        # surrogates) as
        # markers, as everywhere else (request.diff.visible)
        shown = html_table

        head = html.escape(repr(self))
        summary = self.summary(full_paths=True)
        # on hover, which folder passed it; the cell shows the path inside it. Never the absolute path: a notebook's
        # outputs are shared, and /home/<user> or /tmp/... says nothing to a reader on another machine
        table = shown(summary.drop(columns="source_path"))
        for rel, full in zip(summary["source"], summary["source_path"], strict=True):
            if rel and full:
                cell = f"<td>{html.escape(visible(rel))}</td>"
                hover = html.escape(visible(self._shown_source(full)), quote=True)
                table = table.replace(cell, f'<td title="{hover}">{html.escape(visible(rel))}</td>', 1)
        parts = [f"<div class='pcnb-import'><p><b>{head}</b> — token figures are <b>measured</b> "
                 "(usage reported by the endpoint)</p>", table, f"<p style='font-size:12px;color:#555'>"
                 f"{html.escape(BREAKS_VS_REBUILDS)} {html.escape(UNCACHED_NOTE)}</p>"]
        if self.unknown_models:
            parts.append("<p>Models without a price (cost NULL): "
                         + html.escape(visible(", ".join(self.unknown_models))) + "</p>")
        if len(self.skipped):
            parts.append(f"<details><summary>{len(self.skipped)} skipped</summary>"
                         + shown(self._relative_files(self.skipped)) + "</details>")
        if len(self.notes):
            parts.append(f"<details><summary>{len(self.notes)} requests priced with an assumption</summary>"
                         + shown(self._relative_files(self.notes)) + "</details>")
        if len(self.flagged):
            parts.append(f"<details><summary>{len(self.flagged)} body problems the API would refuse (stored as "
                         "logged)</summary>" + shown(self._relative_files(self.flagged)) + "</details>")
        return "".join(parts) + "</div>"


def session_id_for(fmt: str, session_key: str) -> str:
    """A deterministic session id: the same log imports into the same session every time."""
    key = (fmt + "\x1f" + session_key).encode()
    return f"{_SHORT.get(fmt, fmt)}-{digest(key, tag='imp')[:10]}"


def _parent_row(store: Any, fmt: str, first: ImportedRequest) -> dict[str, Any] | None:
    """The stored row of the parent session whose history ``first`` was rebuilt from (``history_from_parent``)."""
    if HISTORY_FROM_PARENT not in first.events or first.parent_key is None:
        return None
    row: dict[str, Any] | None = store.session_row(session_id_for(fmt, first.parent_key))
    return row


def _cache_params(reqs: list[ImportedRequest], parent: dict[str, Any] | None = None) -> dict[str, Any]:
    """A partial Anthropic log's cache parameters: the TTLs its client gave the breakpoints the log dropped,
    from the measured 5m/1h write split (``AnthropicCache(client_ttls=...)``). A compaction call whose history was
    rebuilt from its ``parent``'s log re-sent the parent's prompt with the parent's breakpoints, and its own writes
    (the tail only, no 1h write) say nothing of the prefix's TTL: it takes the parent's, and so shares the parent's
    simulated cache at import as it shared the provider's."""
    if _cache_model_for(reqs[0]) not in ("anthropic", "bedrock") or not any(r.partial for r in reqs):
        return {}
    if (parent is not None and parent["cache_model"] == _cache_model_for(reqs[0])
            and not any(r.usage.cache_creation_1h_input_tokens for r in reqs)):
        return dict(SessionConfig.from_stored(parent["config"]).cache_params)
    ttls = client_ttls_from_usage(r.usage for r in reqs)
    return {} if ttls is None else {"client_ttls": list(ttls)}


#: Provider names readers give (the agents' own spellings) whose cache model is not named alike.
#: (OpenTelemetry's ``gen_ai.provider.name`` values included: ``gcp.gemini``, ``aws.bedrock``...)
_PROVIDER_CACHE = {"google": "gemini", "google-gemini-cli": "gemini", "gemini-cli": "gemini", "gcp.gemini": "gemini",
                   "gcp.gen_ai": "gemini", "gcp.vertex_ai": "gemini", "amazon-bedrock": "bedrock", "aws": "bedrock",
                   "aws.bedrock": "bedrock"}


def _cache_model_for(req: ImportedRequest) -> str:
    """The cache model an imported request is simulated with: its provider's (a Bedrock model id is Bedrock's,
    whatever the log calls the provider; Bedrock's and Google's caches are modelled for Claude and Gemini models
    only), else its wire format's."""
    provider = (req.provider or "").lower()
    provider = _PROVIDER_CACHE.get(provider, provider)
    model = (req.model or "").lower()
    if _BEDROCK_MODEL.fullmatch(model) or (provider == "bedrock" and "claude" in model):
        return "bedrock"
    if provider == "gemini" and "gemini" not in model:
        return "anthropic" if "claude" in model else get_format(req.dialect).provider  # Claude on Vertex
    if provider in ("anthropic", "openai", "deepseek", "gemini"):
        return provider
    return get_format(req.dialect).provider


_BEDROCK_MODEL = re.compile(r"(?:[a-z]{2,6}\.)?anthropic\.claude-[a-z0-9.-]+-v\d+(?::\d+)?")


@dataclass(frozen=True)
class ImportOptions:
    """How an import reads and stores its logs: ``import_log``'s arguments but the paths and the workers.

    Attributes:
        format: a reader's name, or ``auto`` (each file's own). project: the sessions' project (default: the
            log's). progress: show a bar. calibrate: fit the tokenizer calibrations at the end (``False``: a
            caller that fits once over several imports).
        account: the provider account of the sessions whose log names none. accounts, projects: the account and
            project of the sessions whose first file is a key (a resolved path), before ``account`` and
            ``project``. groups: the file groups, in the order to store them, instead of the walk's (``pc.fleet``:
            a task stores an account's groups as one import of their folder would).
        deep: analyse every body as it is stored (else a usage-first import: measured columns now, bodies when
            first needed).
        walked: files of the paths a walk of the caller found (``_parallel``'s workers), read as in a walk: one
            of no known format is skipped, not an error.
    """

    format: str = "auto"
    project: str | None = None
    progress: bool = True
    calibrate: bool = True
    account: str | None = None
    accounts: Mapping[str, str] | None = None
    projects: Mapping[str, str] | None = None
    groups: Sequence[Sequence[str]] | None = None
    deep: bool = False
    walked: Collection[str] = ()


def import_serial(lab: Workspace, paths: str | Path | Sequence[str | Path], options: ImportOptions) -> ImportResult:
    """Import agent logs into ``lab`` in this process, file group by file group (``ingest.import_log`` checks the
    arguments and chooses this or ``_parallel.import_parallel``)."""
    owners = _Owners(options.account or DEFAULT_ACCOUNT, dict(options.accounts or {}), dict(options.projects or {}))
    with gc_paused():
        return _import(lab, paths, options.format, options.project, options.progress, options.calibrate, owners,
                       options.groups, deep=options.deep, walked=options.walked)


@dataclass(frozen=True)
class StoredRecords:
    """What :func:`store_records` stored: requests new and already stored, records skipped (``file``, ``line``,
    ``reason``), and the ids of the sessions it touched."""

    new: int
    duplicates: int
    skipped: list[dict[str, Any]]
    session_ids: list[str]


def store_records(lab: Workspace, records: Sequence[ImportedRequest], *, format: str, file: str,  # noqa: A002
                  project: str | None = None, account: str | None = None) -> StoredRecords:
    """Store requests a reader produced from ``file`` as a usage-first import of that file does, all of them in
    one transaction (nothing on failure): the live receiver's path (``live.OtlpReceiver``), where ``file`` is the
    spool it appended the export to, so analysing a session later reads the same records from it."""
    shown = display_path(file)
    by_key: dict[str, list[ImportedRequest]] = {}
    refused: list[dict[str, Any]] = []
    for rec in records:
        if (problem := rec.unstorable_keys()) is not None:  # as _read: its session cannot be formed
            ref_file, line = _split_ref(rec.source_ref)
            refused.append({"file": ref_file, "line": line, "reason": problem})
        else:
            by_key.setdefault(rec.session_key, []).append(rec)
    if not by_key:
        return StoredRecords(0, 0, refused, [])
    owners = _Owners(account or DEFAULT_ACCOUNT)
    pending = sorted((_Pending(key, format, shown, sorted(_richest(reqs), key=lambda r: r.at), again=False,
                               account=owners.account(reqs, Path(file)), project=project, files=[shown],
                               group=shown) for key, reqs in by_key.items()), key=lambda p: p.rank)
    run = _Run(lab, project, owners, deep=False, next_seq=lab.store.next_import_seq(),
               waiting=lab.store.unanalysed_ids())
    with lab.batch():  # the sessions' own transactions nest in this one: the whole export or nothing
        _store_group(run, pending)
    done = sorted(run.stored.values(), key=lambda x: x.rank)
    return StoredRecords(sum(x.new for x in done), sum(x.dup for x in done),
                         refused + [row for x in done for row in x.skipped], [x.sid for x in done])


#: New sessions of a file group are stored in transactions of up to this many sessions or requests: a COMMIT
#: and the bulk writes cost a few ms each, which 1,000 one-request log files would otherwise pay 1,000 times.
#: A kill loses at most one such transaction; a session is never split across two.
BATCH_SESSIONS = 100
BATCH_REQUESTS = 200
#: A usage-first import's rows are light (no bodies): its transactions hold up to this many requests.
USAGE_BATCH_REQUESTS = 20_000


@dataclass
class _Stored:
    """One session's part in the result, replaced whole when the session is stored again."""

    rank: tuple[bool, str]
    sid: str  #: its id: the Session object is not kept (memory would grow with the folder imported)
    new: int
    dup: int
    created: bool  #: created by this import (not stored before it)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    flagged: list[dict[str, Any]] = field(default_factory=list)
    notes: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class _Owners:
    """Whose provider cache an import's sessions used: the account the log names, else the one of the session's
    first file (``accounts``, by resolved path), else ``default``; and the project a caller gave that file."""

    default: str
    accounts: Mapping[str, str] = field(default_factory=dict)
    projects: Mapping[str, str] = field(default_factory=dict)

    def account(self, reqs: Sequence[ImportedRequest], file: Path) -> str:
        said = next((r.account for r in reqs if r.account), None)
        return said or self.accounts.get(str(file)) or self.default


@dataclass
class _Pending:
    """One session of a file group, read and ready to store."""

    key: str
    fmt: str
    file: str
    reqs: list[ImportedRequest]
    again: bool  #: an earlier group of this import stored part of it: its requests are all here now
    account: str  #: whose provider cache it used (``_Owners``)
    project: str | None  #: its project when the caller gave its file one (``_Owners.projects``)
    files: list[str] = field(default_factory=list)  #: the files its requests were read from (walk order)
    group: str = ""  #: its file group (the group's first file): a usage-first session is analysed with it
    #: parents first (a sub-agent's parent_id then names a stored session), then by key: the order every import
    #: stores sessions in, whatever its file groups
    rank: tuple[bool, str] = field(init=False)

    def __post_init__(self) -> None:
        self.rank = (self.reqs[0].parent_key is not None, self.key)

    @property
    def sid(self) -> str:
        return session_id_for(self.fmt, self.key)


@dataclass
class _Run:
    """What one import stores, session by session."""

    lab: Workspace
    project: str | None
    owners: _Owners = field(default_factory=lambda: _Owners(DEFAULT_ACCOUNT))
    unknown: set[str] = field(default_factory=set)
    stored: dict[str, _Stored] = field(default_factory=dict)
    #: each (cache model, model)'s prices, looked up once per import (a usage-first import prices every request)
    prices: dict[tuple[str, str], Any] = field(default_factory=dict)
    #: one stored session of each cache scope: it holds the scope's simulated cache (the Lab holds caches weakly),
    #: which the next session of that scope would otherwise rebuild from every stored request of the scope
    held: dict[ScopeKey, Session] = field(default_factory=dict)
    deep: bool = True  #: analyse bodies as they are stored (False: a usage-first import)
    #: the usage-first sessions stored before this import (read once: a grown one takes the usage-first path)
    waiting: set[str] = field(default_factory=set)
    #: usage-first sessions this (deep) import stores again analysed: each is deleted in the transaction that
    #: stores it (``lab.analyze``)
    replace: set[str] = field(default_factory=set)
    next_seq: int = 0  #: the import order number of the next usage-first session


def _import(lab: Workspace, paths: str | Path | Sequence[str | Path], format: str, project: str | None,  # noqa: A002
            progress: bool, calibrate: bool = True, owners: _Owners | None = None,
            planned: Sequence[Sequence[str]] | None = None, *, deep: bool = True,
            replace: set[str] | frozenset[str] = frozenset(), walked: Collection[str] = ()) -> ImportResult:
    """Read and store one file group at a time (``_groups.plan_groups``: a Claude Code project folder, a file
    you name), so memory holds one group's records, never the folder's (small groups are read together, up to
    :data:`BATCH_SESSIONS` sessions or :data:`BATCH_REQUESTS` requests). A session found again in a later group
    (a session resumed in another project folder) is read again from the earlier group's files and stored
    again whole: the stored result is the same as reading every file first."""
    result = ImportResult()
    files, passed = expand_paths(paths)
    if walked:
        found = set(walked)
        files = [LogFile(f.path, False) if str(f.path) in found else f for f in files]
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    result.roots = [Path(item).expanduser().resolve() for item in items
                    if not any(ch in str(item) for ch in "*?[")]
    run = _Run(lab, project, owners or _Owners(DEFAULT_ACCOUNT), deep=deep,
               next_seq=0 if deep else lab.store.next_import_seq(), replace=set(replace),
               waiting=set() if deep else lab.store.unanalysed_ids())
    read_skips: list[tuple[int, dict[str, Any]]] = []
    read_ok: list[tuple[int, tuple[str, str]]] = []
    reader_of: dict[int, str] = {}  # file index -> the reader that read it
    key_files: dict[str, list[int]] = {}  # session key -> the files of earlier groups that hold it
    models: set[str] = set()
    bar = progress_bar(total=len(files), desc="importing logs", enabled=progress, unit="file")
    by_session: dict[str, list[tuple[int, ImportedRequest]]] = {}
    groups = _file_groups(paths, files) if planned is None else _planned_groups(planned, files)
    # each file's group, by its first file: a usage-first session is analysed with its group, in its order
    group_of = {i: display_path(files[g[0]].path) for g in groups for i in g}
    try:
        for n, group in enumerate(groups):
            for i in group:
                name = _read_into(by_session, models, files[i], format, read_skips, i, bodies=deep)
                bar.update(1)
                if name is not None:
                    reader_of[i] = name
                    read_ok.append((i, (display_path(files[i].path), name)))
            result.ended_full_batch = len(by_session) >= BATCH_SESSIONS or \
                sum(map(len, by_session.values())) >= BATCH_REQUESTS
            if n + 1 < len(groups) and not result.ended_full_batch:
                # (the same read-ahead for both kinds of import: sessions are stored in the same order, so an
                # analysis stores them as a deep import does)
                continue  # small groups (one-request files) are stored together: one transaction for many
            pending = _pending_of(by_session, files, reader_of, key_files, run.owners, group_of, bodies=deep)
            by_session = {}
            # nothing here keeps the group's records: each session's go once it is stored (``_store_batch``),
            # and the next group is read with none of this one's held
            _store_group(run, pending)
    finally:
        bar.close()
    done = sorted(run.stored.values(), key=lambda x: x.rank)
    result.files = [entry for _, entry in sorted(read_ok)]
    skipped = [*passed, *(row for _, row in sorted(read_skips, key=lambda t: t[0])),
               *(row for x in done for row in x.skipped)]
    result.sessions = SessionList(lab, [x.sid for x in done if x.new])
    result.requests = sum(x.new for x in done)
    result.already_stored = sum(x.dup for x in done)
    result.skipped = [{k: r[k] for k in SKIPPED_COLUMNS} for r in skipped]
    result.flagged = [row for x in done for row in x.flagged]
    result.notes = [row for x in done for row in x.notes]
    result.unknown_models = sorted(run.unknown)
    # each measured request is an exact prompt total: calibrate the estimator per family. Also when nothing was
    # new but a family has no calibration yet: an import stopped after its sessions committed gets it back. A
    # usage-first import has no estimates to fit yet: its sessions' analysis fits them.
    if deep and calibrate and (result.requests or (models and needs_calibration(lab, models))):
        result.calibrations = calibrate_families(lab, models)
    return result


def _read_into(by_session: dict[str, list[tuple[int, ImportedRequest]]], models: set[str], log: LogFile,
               format: str, skipped: list[tuple[int, dict[str, Any]]], index: int,  # noqa: A002
               *, bodies: bool = True) -> str | None:
    """Read one file (:func:`_read`) into ``by_session`` (session key -> (file index, request)) and its models
    into ``models``; returns its reader's name, or None when it is not a log."""
    got = _read(log, format, skipped, index, bodies=bodies)
    if got is None:
        return None
    name, records = got
    for rec in records:
        by_session.setdefault(rec.session_key, []).append((index, rec))
        if rec.model:
            models.add(rec.model)
    return name


def _pending_of(by_session: dict[str, list[tuple[int, ImportedRequest]]], files: list[LogFile],
                reader_of: dict[int, str], key_files: dict[str, list[int]], owners: _Owners,
                group_of: Mapping[int, str] | None = None, *, bodies: bool = True) -> list[_Pending]:
    """A file group's sessions, ready to store, in the order they are stored (:attr:`_Pending.rank`). A session
    an earlier group stored part of is read again from that group's files; ``key_files`` learns which files
    hold each session."""
    pending = []
    for key, recs in by_session.items():
        earlier = key_files.get(key, [])
        if earlier:  # read again from the earlier groups' files, in file order as one read would
            recs = sorted([(j, r) for j in earlier for r in _reread(files[j], reader_of[j], key, bodies)] + recs,
                          key=lambda t: t[0])
        first = recs[0][0]
        reqs = sorted(_richest([r for _, r in recs]), key=lambda r: r.at)  # stable: file order for ties
        pending.append(_Pending(key, reader_of[first], display_path(files[first].path), reqs,
                                again=bool(earlier), account=owners.account(reqs, files[first].path),
                                project=owners.projects.get(str(files[first].path)),
                                files=[display_path(files[j].path) for j in sorted({i for i, _ in recs})],
                                group=(group_of or {}).get(first, "")))
        for j in dict.fromkeys(i for i, _ in recs if i not in earlier):
            key_files.setdefault(key, []).append(j)
    return sorted(pending, key=lambda p: p.rank)


def _file_groups(paths: str | Path | Sequence[str | Path], files: list[LogFile]) -> list[list[int]]:
    """``files`` (indices) by file group (``_groups.plan_groups``), each in walk order, groups in the order of
    their first file. The files you name (not found by a walk) are one group: files named together often log one
    session between them (an OpenClaw transcript and its payload log)."""
    group_of = {f: g.key for g in plan_groups(paths)[0] for f in g.files}
    groups: dict[str | None, list[int]] = {}
    for i, log in enumerate(files):
        groups.setdefault(None if log.named else group_of.get(str(log.path), str(log.path)), []).append(i)
    return list(groups.values())


def _planned_groups(planned: Sequence[Sequence[str]], files: list[LogFile]) -> list[list[int]]:
    """``files`` (indices) by the file groups a caller planned (lists of paths), in the planned order."""
    index = {str(log.path): i for i, log in enumerate(files)}
    return [[index[str(Path(f).resolve())] for f in group] for group in planned if group]


def _read(log: LogFile, format: str, skipped: list[tuple[int, dict[str, Any]]], index: int,  # noqa: A002
          *, bodies: bool = True) -> tuple[str, list[ImportedRequest]] | None:
    """The reader's name and the requests of one file; its skipped lines into ``skipped``. None: the file is
    not a log (a walked file; a file the user named raises). ``bodies=False``: a usage-first import, which
    needs no body: a reader that can skip rebuilding them (``usage_only``) does."""
    path, shown = log.path, display_path(log.path)
    try:
        reader = READERS[format] if format != "auto" else detect(path)
        if not bodies and getattr(reader, "usage_only", False):
            records = list(reader.read(path, bodies=False))  # type: ignore[call-arg]
        else:
            records = list(reader.read(path))
    except (ImportFormatError, UnreadableLog) as exc:
        if isinstance(exc, UnreadableLog):
            exc = ImportFormatError(shown, f"cannot read ({_unreadable(exc, path)})")
        if log.named:
            raise exc from None
        skipped.append((index, {"file": shown, "line": 0, "reason": exc.problem}))
        return None
    clean = shown == str(path)
    out: list[ImportedRequest] = []
    for rec in records:
        if isinstance(rec, ImportedRequest):
            # a file name that is not UTF-8: its keys and references made storable
            rec = rec if clean else _printable(rec)
            if (problem := rec.unstorable_keys()) is None:
                out.append(rec)
            else:  # its session cannot be formed: the one record is skipped, as one the store refuses is
                file, line = _split_ref(rec.source_ref)
                skipped.append((index, {"file": file, "line": line, "reason": problem}))
        elif isinstance(rec, SkippedLine):
            skipped.append((index, {"file": display_path(rec.file), "line": rec.line, "reason": rec.reason}))
        # ReadProgress: per-request identity makes re-import exact; progress is informational
    return reader.name, out


def _reread(log: LogFile, reader: str, key: str, bodies: bool = True) -> list[ImportedRequest]:
    """The requests of session ``key`` in a file an earlier group read (its skipped lines were reported then)."""
    got = _read(LogFile(log.path, True), reader, [], 0, bodies=bodies)
    return [] if got is None else [r for r in got[1] if r.session_key == key]


def _store_group(run: _Run, pending: list[_Pending]) -> None:
    """Store a file group's sessions in rank order: new ones many to a transaction (:data:`BATCH_SESSIONS`), a
    session stored before (which may need its stored requests read, or a restore) in one of its own. Each
    stored session's requests are dropped from ``pending`` (:func:`_store_batch`)."""
    _add_parent_history(pending)
    existing = run.lab.store.existing_sessions([p.sid for p in pending if not p.again]) - run.replace
    chunk: list[_Pending] = []
    size = 0
    most = BATCH_REQUESTS if run.deep else USAGE_BATCH_REQUESTS
    for p in pending:
        fresh = not p.again and p.sid not in existing
        if not fresh or len(chunk) >= BATCH_SESSIONS or size + len(p.reqs) > most:
            _store_batch(run, chunk, fresh=True)
            chunk, size = [], 0
        if fresh:
            chunk.append(p)
            size += len(p.reqs)
        else:
            _store_batch(run, [p], fresh=False)
    _store_batch(run, chunk, fresh=True)


def _add_parent_history(pending: list[_Pending]) -> None:
    """Give each request whose log lacks its history (``history_missing``: a compaction call) the history its
    parent session's log holds, when the parent is in the same file group: the messages of the parent's last
    request sent before the session's first, then that request's reply (unless it called tools: their results
    are in no request body), then the request's own logged messages. That is what the call re-sent up to what
    the parent wrote last, so its replay reads what the parent wrote; what the parent's log added after its last
    request is not in it. Every such request carries the ``history_missing`` event; the rebuilt ones also
    ``history_from_parent``."""
    by_key = {p.key: p for p in pending}
    for p in pending:
        if not any(r.history_missing for r in p.reqs):
            continue
        first = p.reqs[0]
        parent = by_key.get(first.parent_key) if first.parent_key is not None else None
        before = [q for q in parent.reqs if q.at <= first.at] if parent is not None else []
        source = before[-1] if before else None
        out = []
        for r in p.reqs:
            if not r.history_missing:
                out.append(r)
                continue
            same_format = source is not None and r.dialect == source.dialect  # the parent's own (none named)
            if source is None or not same_format or not isinstance(r.body.get("messages"), list):
                out.append(replace(r, events=(*r.events, HISTORY_MISSING)))
                continue
            messages = [{"role": m["role"], "content": list(m["content"])} for m in source.body["messages"]]
            reply = list(source.reply or [])
            if not any(isinstance(b, dict) and b.get("type") == "tool_use" for b in reply):
                # a reply that called tools was followed by results no request body of the parent holds: left out
                # (the body stays one the API accepts; the parent's entries end before the reply anyway)
                append_message(messages, "assistant", reply)
            for m in r.body["messages"]:
                append_message(messages, m["role"], list(m["content"]))
            out.append(replace(r, body={**r.body, "messages": messages},
                               events=(*r.events, HISTORY_MISSING, HISTORY_FROM_PARENT)))
        p.reqs = out


def _store_batch(run: _Run, pending: list[_Pending], *, fresh: bool) -> int:
    """Store sessions in one transaction (``Lab.batch``): all of them, or, when one fails, the ones before it
    (stored again in a transaction of their own) and the error is raised. ``fresh``: none is stored yet.
    Returns how many requests it stored, once committed."""
    if not pending:
        return 0
    lab = run.lab
    done: list[tuple[_Pending, _Stored]] = []
    try:
        with lab.batch():
            for p in pending:
                done.append((p, _store_one(run, p, fresh=fresh)))
    except SessionError:
        if done:  # nothing half-written: the sessions before the failing one are stored, the rest are not
            _store_batch(run, [p for p, _ in done], fresh=fresh)
        raise
    for p, out in done:
        # stored: its parsed requests (bodies, replies) are not needed again, and holding them until the group
        # is done would make memory grow with the group's sessions instead of its largest one
        p.reqs = []
        held = run.stored.get(p.sid)
        if held is not None and not held.created and not out.created:
            # a session stored before this import, grown by two of its groups: the second counted the first's
            # requests as stored already
            out.new, out.dup = held.new + out.new, out.dup - held.new
        run.stored[p.sid] = out
    return sum(out.new for _, out in done)


def _store_one(run: _Run, p: _Pending, *, fresh: bool) -> _Stored:
    """:func:`_store_session` for one pending session, its reported rows kept apart (replaced whole if a later
    group stores it again)."""
    held = run.stored.get(p.sid)
    if p.again and held is not None and held.created:
        run.lab.forget_session(p.sid)  # stored by an earlier group of this import: stored again whole, as new
        fresh = True
    if p.sid in run.replace:  # its usage-first rows, replaced in this transaction (they fed no simulated cache)
        run.replace.discard(p.sid)
        run.lab.store.delete_session(p.sid)
        fresh = True
    skipped: list[dict[str, Any]] = []
    flagged: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    if not run.deep and (fresh or p.sid in run.waiting):
        new, dup = _store_usage_first(run, p, fresh=fresh, skipped=skipped, notes=notes)
        return _Stored(p.rank, p.sid, new, dup, created=fresh, skipped=skipped, flagged=flagged, notes=notes)
    s, new, dup = _store_session(run.lab, p.key, p.fmt, p.file, p.reqs, project=p.project or run.project,
                                 skipped=skipped,
                                 unknown=run.unknown, bar=None, flagged=flagged, notes=notes, fresh=fresh,
                                 account=p.account)
    if s.cache_scope != "session":  # a session's own cache has no other user
        run.held[scope_key(s.cache_scope, s.id, s.project, s.cache, s.cache_params, s.account)] = s
    return _Stored(p.rank, s.id, new, dup, created=fresh, skipped=skipped, flagged=flagged, notes=notes)


def _richest(reqs: list[ImportedRequest]) -> list[ImportedRequest]:
    """One copy of each request: when files log the same request (an OpenClaw transcript and its payload log or
    cache trace, a copied session file), the one with the whole body, then with the agent's own observation."""
    best: dict[str, ImportedRequest] = {}
    for r in reqs:
        held = best.get(r.dedupe_key)
        if held is None or _richness(r) > _richness(held):
            best[r.dedupe_key] = r
    return list(best.values())


def _richness(req: ImportedRequest) -> tuple[bool, bool]:
    return (not req.partial, req.agent_observation is not None)


def _unreadable(exc: OSError, path: Path) -> str:
    return str(exc).removeprefix(f"{path}: ")


def _printable(req: ImportedRequest) -> ImportedRequest:
    """``req`` with the file name inside its keys and references made storable (see :func:`display_path`)."""
    return replace(req, session_key=display_path(req.session_key), dedupe_key=display_path(req.dedupe_key),
                   source_ref=display_path(req.source_ref),
                   parent_key=None if req.parent_key is None else display_path(req.parent_key))


def _store_session(lab: Workspace, key: str, fmt: str, file: str, reqs: list[ImportedRequest], *,
                   project: str | None, skipped: list[dict[str, Any]], unknown: set[str],
                   bar: Any, flagged: list[dict[str, Any]], notes: list[dict[str, Any]], fresh: bool = False,
                   account: str = DEFAULT_ACCOUNT) -> tuple[Session, int, int]:
    """Write one session's new requests in one transaction; returns (session, stored now, already stored).

    A new session's row is created in that same transaction: a failure leaves nothing of the session behind, and
    the session objects the Lab holds go back to what the store has (``Lab.batch``). A request that started
    before the last stored one (a proxy writes each call when it completes) cannot be appended, since a
    session's time only moves forward: when this import holds every stored request of the session, the session
    is stored again whole, in time order; otherwise the late request is listed in ``skipped``.
    ``fresh``: the caller knows the session is not stored (nothing to read back).
    """
    store = lab.store
    sid = session_id_for(fmt, key)
    first = reqs[0]
    restore = set() if fresh else _needs_restore(store, sid, reqs, skipped)
    try:
        with lab.batch():
            if restore:
                lab.forget_session(sid)
            s = None if fresh else lab.active_session(sid)  # keep the Session object a notebook already holds
            if fresh or (s is None and store.session_row(sid) is None):
                config, spec = _new_session(store, key, fmt, file, reqs, project=project, account=account)
                s = lab.create_session(config, **spec)
            elif s is None:
                s = lab.open_session(sid)
            fresh_reqs, dup = _unstored(s, reqs, known=set() if fresh else None)
            if restore:  # stored again, not new
                dup += len(restore)
            todo: list[tuple[ImportedRequest, list[BodyProblem]]] = []
            # each request is stored as soon as it is segmented: only one request's new segments (and the JSON
            # kept to store them) are held at a time
            for req, prepared, problems in _prepared(s, fresh_reqs, skipped):
                current = req
                t = s.record(req.body, at=req.at, usage=req.usage, request_id=req.request_id, events=req.events,
                             reply=req.reply, source_ref=req.source_ref, dedupe_key=req.dedupe_key,
                             prepared=prepared, usage_source=req.usage.source, body_problems=problems,
                             latency_ms=req.latency_ms, provider_diagnosis=req.provider_diagnosis,
                             agent_observation=req.agent_observation)
                todo.append((req, problems))
                if t.cost_usd is None:
                    unknown.add(req.model)
                if bar is not None:
                    bar.update(1)
            if not todo:
                return s, 0, dup
    except PromptCacheError as exc:
        where = current.source_ref if "current" in locals() else f"{file}"
        raise SessionError(f"{where}: {exc}") from None
    for req, problems in todo:  # reported once stored
        ref_file, line = _split_ref(req.source_ref)
        flagged += ({"file": ref_file, "line": line, "path": p.path, "problem": p.problem} for p in problems)
        notes += ({"file": ref_file, "line": line, "note": n} for n in req.usage.notes)
    new = len(todo) - (len(restore) if restore else 0)
    return s, new, dup


def _new_session(store: Any, key: str, fmt: str, file: str, reqs: list[ImportedRequest], *, project: str | None,
                 account: str) -> tuple[SessionConfig, dict[str, Any]]:
    """A new imported session's config and ``Lab.create_session`` keywords (the same for a deep and a
    usage-first import: analysing a usage-first session stores what a deep import would have)."""
    first = reqs[0]
    config = SessionConfig(
        start=first.at.astimezone(UTC), step_seconds=30,
        cache_params=_cache_params(reqs, _parent_row(store, fmt, first)), format=fmt, session_key=key,
        session_kind=first.session_kind,
        # one provider cache per account, as the provider keeps it: sub-agents, compaction calls and the
        # account's other conversations read each other's entries
        cache_scope="account", account=account,
    )
    spec = {"session_id": session_id_for(fmt, key), "project": project or f"imported/{fmt}", "strategy": None,
            "cache": _cache_model_for(first), "model": first.model or "unknown", "source": f"{fmt}:{file}",
            "parent_id": session_id_for(fmt, first.parent_key) if first.parent_key else None,
            "known_new": True}  # fresh, or looked up by the caller
    return config, spec


def _store_usage_first(run: _Run, p: _Pending, *, fresh: bool, skipped: list[dict[str, Any]],
                       notes: list[dict[str, Any]]) -> tuple[int, int]:
    """Store one session's new requests as a usage-first import does: measured usage, cost and the cause usage
    alone shows, per request (``pipeline.usage_record``); its bodies are analysed when first needed
    (``lab.analyze``), which stores the session again as a deep import would have. Returns (stored now, already
    stored). Inside the caller's transaction (``_store_batch``)."""

    lab, store, sid = run.lab, run.lab.store, p.sid
    reqs = p.reqs
    restore = set() if fresh else _needs_restore(store, sid, reqs, skipped)
    if restore:
        lab.forget_session(sid)
        fresh = True
    if fresh:
        config, spec = _new_session(store, p.key, p.fmt, p.file, reqs, project=p.project or run.project,
                                    account=p.account)
        lab.store_new_session(config, **spec)
        cache_name, cache_params = spec["cache"], config.cache_params
        todo, dup = _unstored_keys(reqs, set())
        idx, previous, baseline = 0, None, None
        seq, group, files = run.next_seq, p.group, p.files
        run.next_seq += 1
    else:
        row = store.session_row(sid)
        assert row is not None  # not fresh: stored
        config = SessionConfig.from_stored(row["config"])
        cache_name, cache_params = row["cache_model"], config.cache_params
        todo, dup = _unstored_keys(reqs, store.dedupe_keys(sid))
        idx, last = store.last_sent_request(sid)
        previous = None if last is None else UsageOnly(last.model, last.sent_at, last.usage, tuple(last.event_codes))
        baseline = None if last is None else last.cache_read_input_tokens
        (held,) = store.unanalysed([sid])
        seq, group, files = held["import_seq"], held["file_group"], sorted({*held["files"], *p.files})
    store.mark_unanalysed(sid, import_seq=seq, file_group=group, files=files, new=fresh)
    model = get_cache_model(cache_name, **cache_params)
    longest = _longest_ttl(model, cache_name, cache_params, reqs)
    records = []
    warned = False
    minimums: dict[str, int] = {}
    implicit = {d: get_format(d).implicit_caching for d in {r.dialect for r in todo}}
    for req in todo:
        problem = _value_problem(req)
        if problem is not None:
            file, line = _split_ref(req.source_ref)
            skipped.append({"file": file, "line": line, "reason": problem})
            continue
        usage = req.usage
        if usage.output_tokens is None and req.reply:
            usage = replace(usage, output_tokens=reply_output_tokens(req.reply, lab.tokenizer))
        prices = run.prices.get((cache_name, req.model), False)
        if prices is False:
            prices = run.prices[(cache_name, req.model)] = _analysis.request_prices(cache_name, req.model,
                                                                                    measured=usage.measured)
        if prices is None and usage.total_input_tokens is not None and usage.reported_cost is None:
            run.unknown.add(req.model)
            if not warned:
                warned = True
                warnings.warn(UnpricedModelWarning(req.model, sid), stacklevel=user_stacklevel())
        minimum = minimums.get(req.model)
        if minimum is None:
            try:
                minimum = minimums[req.model] = model.min_cacheable_tokens(req.model)
            except PromptCacheError:
                minimum = minimums[req.model] = 0
        current = UsageOnly(req.model, req.at.astimezone(UTC), usage, tuple(req.events))
        cause = usage_cause(previous, current, implicit=implicit[req.dialect],
                            minimum=minimum, longest_ttl_seconds=longest)
        records.append(usage_record(
            session_id=sid, idx=idx, at=current.at, model=req.model, usage=usage, prices=prices,
            events=req.events, cause=cause, request_id=req.request_id, source_ref=req.source_ref,
            dedupe_key=req.dedupe_key, latency_ms=req.latency_ms, source_span=req.source_span,
            openclaw_broke=usage_break(baseline, usage.cache_read_input_tokens), previous_cache_read=baseline,
            provider_diagnosis=req.provider_diagnosis))
        if usage.cache_read_input_tokens is not None:  # the baseline: the last reported read
            baseline = usage.cache_read_input_tokens
        idx += 1
        if usage.total_input_tokens:  # the last request that reached the API
            previous = current
        notes += ({"file": _split_ref(req.source_ref)[0], "line": _split_ref(req.source_ref)[1], "note": n}
                  for n in usage.notes)
    store.write_usage_records(records)
    new = len(records) - (len(restore) if restore else 0)
    return new, dup + (len(restore) if restore else 0)


def _longest_ttl(model: Any, cache_name: str, cache_params: Mapping[str, Any], reqs: list[ImportedRequest]
                 ) -> float | None:
    """The longest an entry of this session could live, from what its usage says: the TTLs its client gave the
    breakpoints a partial log dropped (the measured 5m/1h split), else 1h on Anthropic when the session wrote 1h
    entries (5m otherwise), else the cache model's horizon (None: nothing bounds an entry's life)."""

    client_ttls = cache_params.get("client_ttls")
    if client_ttls:
        return max(TTL_SECONDS.get(t, TTL_SECONDS["5m"]) for t in client_ttls)
    if cache_name in ("anthropic", "bedrock"):
        wrote_1h = any(r.usage.cache_creation_1h_input_tokens for r in reqs)
        return TTL_SECONDS["1h"] if wrote_1h else TTL_SECONDS["5m"]
    horizon: float | None = model.state_horizon_seconds()
    return horizon


def _unstored_keys(reqs: list[ImportedRequest], known: set[str]) -> tuple[list[ImportedRequest], int]:
    """The requests whose ``dedupe_key`` is not in ``known`` (the first of each key), and how many are."""
    out: list[ImportedRequest] = []
    for req in reqs:
        if req.dedupe_key not in known:
            known.add(req.dedupe_key)
            out.append(req)
    return out, len(reqs) - len(out)


def _needs_restore(store: Any, sid: str, reqs: list[ImportedRequest], skipped: list[dict[str, Any]]
                   ) -> set[str]:
    """The stored import keys of session ``sid`` when it must be stored again whole, else an empty set.

    Two things cannot be appended: a new request that started before the last stored one (a proxy writes a call
    when it completes), and a stored request whose usage the log now gives differently (a Claude Code answer
    still streaming when the log was last imported: its output count was a placeholder). Both need the whole
    session stored again in time order, which this import can do when it holds every stored request; otherwise
    those requests are listed in ``skipped`` (and the stored ones stay as they were).
    """
    last = store.last_turn(sid)
    if last is None:
        return set()
    stored = store.stored_usage(sid)
    late = [r for r in reqs if r.dedupe_key not in stored and r.at < last["sent_at"]]
    changed = [r for r in reqs if r.dedupe_key in stored and stored[r.dedupe_key] != _usage_row(r)]
    if not late and not changed:
        return set()
    if set(stored) <= {r.dedupe_key for r in reqs}:
        return set(stored)
    for r, why in [*((r, "started before the session's last stored request") for r in late),
                   *((r, "already stored with other usage (the log was still being written)") for r in changed)]:
        file, line = _split_ref(r.source_ref)
        skipped.append({"file": file, "line": line, "reason": f"{why}, and the session's other requests come "
                        "from files not read now: import them together to store it again"})
    drop = {id(r) for r in late}
    reqs[:] = [r for r in reqs if id(r) not in drop]
    return set()


def _usage_row(req: ImportedRequest) -> tuple[int | None, ...]:
    u = req.usage
    return (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens, u.output_tokens)


def _unstored(s: Session, reqs: list[ImportedRequest], *, known: set[str] | None = None
              ) -> tuple[list[ImportedRequest], int]:
    """The requests whose ``dedupe_key`` is not stored yet (the first of each key), and how many are."""
    return _unstored_keys(reqs, s.lab.store.dedupe_keys(s.id) if known is None else known)


def _prepared(s: Session, reqs: list[ImportedRequest], skipped: list[dict[str, Any]]
              ) -> Iterator[tuple[ImportedRequest, PreparedRequest, list[BodyProblem]]]:
    """Each request segmented (extending the previous body's segments: linear ingest) and checked leniently,
    one at a time as the caller stores them: what the API would refuse is yielded with it, to be stored and
    reported; a body JSON cannot hold, or a usage figure no endpoint reports, is skipped with its file:line."""
    config = s.session_config
    unlogged, of = config.unlogged_prefix_tokens, config.unlogged_prefix_of
    prev = s.previous_request
    for req in reqs:
        file, line = _split_ref(req.source_ref)
        problem = _value_problem(req)
        if problem is not None:
            skipped.append({"file": file, "line": line, "reason": problem})
            continue
        try:
            # lenient: a log holds what was sent, so what the API would refuse is stored and flagged; a body
            # JSON cannot hold (BodyValidationError, a ValueError) is skipped below. The previous body's
            # repeated history is not walked again.
            problems = check_request(req.body, req.dialect, lenient=True, partial=req.partial,
                                     previous=None if prev is None else prev.body)
            if req.partial and unlogged is None:
                agreed = _unlogged_prefix(s, req)
                unlogged, of = agreed.tokens, agreed.of
                # the first read is kept as the evidence later sessions of its identity are linked by
                s.note_unlogged_prefix(unlogged, of=of, read=req.usage.cache_read_input_tokens if of else None)
            sized = bool(unlogged) and req.partial
            prepared = s.prepare(req.body, previous=prev, dialect=req.dialect,
                                 unlogged_prefix_tokens=unlogged if sized else None,
                                 unlogged_prefix_of=of if sized else None, keep_texts=True)
        except (ValueError, TypeError, RecursionError, PromptCacheError) as exc:
            skipped.append({"file": file, "line": line, "reason": f"body not understood: {exc}"})
            continue
        yield req, prepared, problems
        prev = prepared


def _unlogged_prefix(s: Session, req: ImportedRequest) -> UnloggedPrefix:
    """The unlogged prefix (system prompt and tools) of session ``s``, from its first partial request ``req``.

    Its own measurement is the measured prompt total minus what the log holds (estimated). A request whose history
    was rebuilt from its parent's log (a compaction call) re-sent the parent's prefix too: it takes the parent's
    when its measured cache read covers it. Otherwise the sessions of its identity decide
    (:func:`~._prefixes.agreed_prefix`)."""
    logged = s.prepare(req.body, dialect=req.dialect).total_tokens
    measured = req.usage.total_input_tokens
    estimate = max(0, measured - logged) if measured is not None else 0
    read = req.usage.cache_read_input_tokens
    if HISTORY_FROM_PARENT in req.events and s.parent_id is not None:
        row = s.lab.store.session_row(s.parent_id)
        parent = SessionConfig.from_stored(row["config"]) if row is not None else None
        if parent is not None and parent.unlogged_prefix_tokens and covers(read, parent.unlogged_prefix_tokens):
            return UnloggedPrefix(parent.unlogged_prefix_tokens, parent.unlogged_prefix_of)
    return agreed_prefix(s.lab.store, s.account, s.id, req.prefix_identity, estimate=estimate, read=read,
                         at=req.at)


def _value_problem(req: ImportedRequest) -> str | None:
    """Why ``req`` cannot be stored as it is (a usage figure no endpoint reports, text that is not Unicode), or
    None."""
    try:
        req.usage.check()
    except UsageError as exc:
        return str(exc)
    return req.unstorable_text()


def _frame(rows: list[dict[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(columns))


def _split_ref(ref: str) -> tuple[str, int]:
    """``file:line`` (or ``file#entry``) → (file, line; 0 when the reference has no line number)."""
    head, _, tail = ref.rpartition(":")
    if head and tail.isdigit():
        return head, int(tail)
    file, _, entry = ref.partition("#")
    m = re.search(r"\[(\d+)\]$", entry)  # file#interactions[3]: the 4th entry of a document
    return file, int(m.group(1)) + 1 if m else 0
