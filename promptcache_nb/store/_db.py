"""The DuckDB store: one connection per Lab, bind parameters, one transaction per turn."""

from __future__ import annotations

import json
import re
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from operator import attrgetter
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from .._util import common_prefix_length, digest
from ..errors import StoreError, StoreLockedError
from ..request import PreparedRequest, canonical_json, rebuild_body
from ..tokens import segment_tokens
from ._migrations import applied, migrate

BLOCK_SIZE = 16_384
_LOCK = re.compile(r"Conflicting lock is held in (.+?)(?:\.\s*See also|$)", re.S)


def fnv1a(text: str) -> str:
    """32-bit FNV-1a hex, as Lore keys pinned entries (``id:fnv1a(title + "\\x1f" + content)``)."""
    h = 0x811C9DC5
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


_CHAIN_KEY = attrgetter("chain_key")
_TOOLS_JSON: list[Any] = [None, None]  # (tools list object, its canonical JSON): tools rarely change


def _tools_json(tools: list[Any]) -> str:
    if _TOOLS_JSON[0] is not tools:
        _TOOLS_JSON[0], _TOOLS_JSON[1] = tools, canonical_json(tools)
    return _TOOLS_JSON[1]


@dataclass(frozen=True)
class KnowledgeEntry:
    """One version of a long-term knowledge entry (project-scoped)."""

    id: str
    project_id: str
    version: int
    title: str
    content: str
    category: str
    deleted: bool
    updated_at: datetime
    key: str | None = None

    @property
    def short_id(self) -> str:
        return self.id[:8]

    @cached_property
    def pin_key(self) -> str:
        """``id:hash(title, content)``: changes only when the entry materially changes."""
        return f"{self.id}:{fnv1a(self.title + chr(0x1F) + self.content)}"


@dataclass(frozen=True)
class Delta:
    """A ``session_prompt_deltas`` row."""

    seq: int
    selector: dict[str, Any]
    content: dict[str, Any]


# Stores open in this process, by resolved file path. DuckDB lets one process open a file twice, but two
# Stores would each keep their own dedup sets; the second open is refused like another process's lock.
_OPEN: weakref.WeakValueDictionary[str, Store] = weakref.WeakValueDictionary()


class Store:
    """A DuckDB file (or ``:memory:``) holding projects, sessions, turns, blocks and knowledge."""

    def __init__(self, path: str | Path = ":memory:") -> None:
        self.path = str(path)
        self.con = None  # type: ignore[assignment]
        key = None if self.path.startswith(":memory:") else str(Path(self.path).resolve())
        if key is not None:
            other = _OPEN.get(key)
            if other is not None and not other.closed:
                raise StoreLockedError(self.path, "another pc.Lab in this process (close it first: lab.close())")
        try:
            # 16 KiB blocks (DuckDB's default is 256 KiB): a store of a few MB is otherwise mostly the
            # per-table block granularity. Applies to new files only; existing files keep theirs.
            # zstd for the string columns at checkpoint: request bodies are repetitive JSON (a debug-level
            # DuckDB setting, but a documented one; reading is unaffected).
            config = {"default_block_size": str(BLOCK_SIZE), "force_compression": "zstd"}
            self.con = duckdb.connect(self.path, config=config)
        except duckdb.IOException as exc:
            m = _LOCK.search(str(exc))
            if m or "lock" in str(exc).lower():
                holder = m.group(1).strip() if m else "another process"
                raise StoreLockedError(self.path, holder) from None
            raise StoreError(f"cannot open store {self.path!r}: {str(exc).splitlines()[0]}") from None
        try:
            self.migrations_applied_now = migrate(self.con)
        except duckdb.Error as exc:
            self.con.close()
            raise StoreError(f"store {self.path!r} could not be migrated: {str(exc).splitlines()[0]}") from None
        if key is not None:
            _OPEN[key] = self
        self._known_blocks: set[str] = {r[0] for r in self.con.execute("SELECT hash FROM blocks").fetchall()}
        self._known_nodes: set[str] = {r[0] for r in self.con.execute("SELECT id FROM prefix_nodes").fetchall()}
        self._pending_known: dict[str, tuple] = {}
        self._pending_nodes: set[str] = set()
        self._tx_depth = 0

    # -- plumbing -----------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One DuckDB transaction; nested uses join the outer one (a tool loop's requests commit together).

        Content-addressed rows written inside become "known" only when the outermost transaction commits,
        so a rollback never leaves the in-memory dedup sets ahead of the file.
        """
        if self.con is None:
            raise StoreError("the Lab is closed; open it again with pc.Lab(path)")
        if self._tx_depth:
            self._tx_depth += 1
            try:
                yield
            finally:
                self._tx_depth -= 1
            return
        self.con.begin()
        self._tx_depth = 1
        self._pending_known = {}
        self._pending_nodes: set[str] = set()
        try:
            yield
            self.con.commit()
        except BaseException:
            self.con.rollback()
            self._pending_known, self._pending_nodes = {}, set()  # nothing of this transaction exists
            raise
        finally:
            self._tx_depth = 0
        self._known_blocks.update(self._pending_known)
        self._known_nodes.update(self._pending_nodes)
        self._pending_known, self._pending_nodes = {}, set()

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None  # type: ignore[assignment]

    @property
    def closed(self) -> bool:
        return self.con is None

    def migrations(self) -> list[str]:
        return applied(self.con)

    def sql(self, query: str, params: list | dict | None = None) -> pd.DataFrame:
        self._live()
        with warnings.catch_warnings():
            # duckdb 2.0's DataFrame conversion trips a pandas 3 deprecation; not the user's concern
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", message=".*inplace keyword.*")
            return self.con.execute(query, params or []).df()

    def _live(self) -> duckdb.DuckDBPyConnection:
        if self.con is None:
            raise StoreError(f"the Lab on {self.path!r} is closed; open it again with pc.Lab(path)")
        return self.con

    def rows(self, query: str, params: list | dict | None = None) -> list[tuple]:
        return self._live().execute(query, params or []).fetchall()

    def one(self, query: str, params: list | dict | None = None) -> tuple | None:
        rows = self._live().execute(query, params or []).fetchall()
        return rows[0] if rows else None

    # -- projects and sessions ----------------------------------------------------------------
    def ensure_project(self, project_id: str, at: datetime) -> None:
        self.con.execute("INSERT INTO projects VALUES (?, ?) ON CONFLICT DO NOTHING", [project_id, at]).fetchall()

    def session_row(self, session_id: str) -> dict[str, Any] | None:
        row = self.one(
            "SELECT id, project_id, strategy, cache_model, model, created_at, config FROM sessions WHERE id = ?",
            [session_id],
        )
        if row is None:
            return None
        keys = ("id", "project_id", "strategy", "cache_model", "model", "created_at", "config")
        out = dict(zip(keys, row, strict=True))
        out["config"] = json.loads(out["config"])
        return out

    def state_row(self, session_id: str) -> dict[str, Any]:
        row = self.one(
            "SELECT ltm_pin_text, ltm_pin_keys, ltm_cache_text, stable_ltm_text, host_prompt, tools, model, extra "
            "FROM session_state WHERE session_id = ?",
            [session_id],
        )
        if row is None:
            raise StoreError(f"session {session_id!r} has no session_state row; the store is inconsistent")
        pin_keys = None
        if row[1] is not None:
            try:
                pin_keys = json.loads(row[1])
            except ValueError:
                pin_keys = None  # corrupt pin keys cause exactly one re-pin (Lore's rule)
        return {
            "ltm_pin_text": row[0], "ltm_pin_keys": pin_keys, "ltm_cache_text": row[2],
            "stable_ltm_text": row[3], "host_prompt": row[4], "tools": json.loads(row[5]),
            "model": row[6], "extra": json.loads(row[7]),
        }

    @staticmethod
    def state_columns(state: dict[str, Any]) -> dict[str, Any]:
        """A state dict as ``session_state`` column values (JSON columns canonicalised)."""
        return {
            "ltm_pin_text": state.get("ltm_pin_text"),
            "ltm_pin_keys": None if state.get("ltm_pin_keys") is None else json.dumps(state["ltm_pin_keys"]),
            "ltm_cache_text": state.get("ltm_cache_text"),
            "stable_ltm_text": state.get("stable_ltm_text"),
            "host_prompt": state["host_prompt"],
            "tools": _tools_json(state["tools"]),
            "model": state["model"],
            "extra": canonical_json(state.get("extra", {})),
        }

    def write_state(self, session_id: str, state: dict[str, Any], at: datetime,
                    previous: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write the state row; with ``previous`` (the last written columns) only changed columns are
        updated — the host prompt and tools are large and rarely change. Returns the columns written."""
        cols = self.state_columns(state)
        if previous is None:
            self.con.execute(
                "INSERT OR REPLACE INTO session_state VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [session_id, *cols.values(), at],
            ).fetchall()
            return cols
        changed = [k for k, v in cols.items() if previous.get(k) != v]
        if changed:
            sets = ", ".join(f"{k} = ?" for k in changed)
            self.con.execute(
                f"UPDATE session_state SET {sets}, updated_at = ? WHERE session_id = ?",
                [*(cols[k] for k in changed), at, session_id],
            ).fetchall()
        return cols

    def _insert(self, table: str, rows: list[tuple]) -> None:
        # A few rows: one VALUES statement (~0.5 ms); many (a rewritten prefix): the appender.
        if not rows:
            return
        if len(rows) <= 8:
            marks = "(" + ", ".join("?" * len(rows[0])) + ")"
            self.con.execute(f"INSERT INTO {table} VALUES " + ", ".join([marks] * len(rows)),
                             [v for r in rows for v in r]).fetchall()
        else:
            with self.con.appender(table) as ap:
                ap.append_rows(rows)

    # -- knowledge ----------------------------------------------------------------------------
    def knowledge(self, project_id: str, *, include_deleted: bool = False) -> list[KnowledgeEntry]:
        """The latest version of each entry of a project, ordered by id."""
        rows = self.rows(
            """SELECT id, project_id, version, title, content, category, deleted, updated_at, key
               FROM knowledge WHERE project_id = ?
               QUALIFY row_number() OVER (PARTITION BY id ORDER BY version DESC) = 1
               ORDER BY id""",
            [project_id],
        )
        entries = [KnowledgeEntry(*r) for r in rows]
        return entries if include_deleted else [e for e in entries if not e.deleted]

    def knowledge_entry(self, entry_id: str) -> KnowledgeEntry | None:
        row = self.one(
            """SELECT id, project_id, version, title, content, category, deleted, updated_at, key
               FROM knowledge WHERE id = ? ORDER BY version DESC LIMIT 1""",
            [entry_id],
        )
        return KnowledgeEntry(*row) if row else None

    def knowledge_count(self, project_id: str) -> int:
        return self.one("SELECT count(DISTINCT id) FROM knowledge WHERE project_id = ?", [project_id])[0]

    def write_knowledge(self, e: KnowledgeEntry) -> None:
        self.con.execute(
            "INSERT INTO knowledge VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [e.id, e.project_id, e.version, e.key, e.title, e.content, e.category, e.deleted, e.updated_at],
        ).fetchall()

    # -- messages and deltas ------------------------------------------------------------------
    def message_ref(self, message: dict[str, Any], pending: dict[str, tuple], tokenizer: Any = None) -> str:
        """A message as block references (``{"role", "blocks": [hash...]}`` or ``{"role", "str": hash}``);
        bodies not yet stored are added to ``pending`` (hash -> blocks row). Content is stored once."""
        role, content = message["role"], message["content"]

        def ref(kind: str, element: Any) -> str:
            body = canonical_json(element)
            h = digest(body.encode(), tag="seg")
            if h not in self._known_blocks and h not in pending and h not in self._pending_known:
                tokens = segment_tokens(kind, element, tokenizer) if tokenizer else segment_tokens(kind, element)
                pending[h] = (h, kind, body, tokens, len(body.encode()))
            return h

        if isinstance(content, str):
            return canonical_json({"role": role, "str": ref("msg-str", content)})
        return canonical_json({"role": role, "blocks": [ref("msg-start" if i == 0 else "msg", b)
                                                         for i, b in enumerate(content)]})

    def resolve_refs(self, refs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Messages back from their block references (one query for all bodies)."""
        hashes = sorted({h for r in refs for h in ([r["str"]] if "str" in r else r["blocks"])})
        bodies = dict(self.rows("SELECT hash, body FROM blocks WHERE hash IN (SELECT unnest(?))", [hashes])) \
            if hashes else {}
        out = []
        for r in refs:
            if "str" in r:
                out.append({"role": r["role"], "content": json.loads(bodies[r["str"]])})
            else:
                out.append({"role": r["role"], "content": [json.loads(bodies[h]) for h in r["blocks"]]})
        return out

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        rows = self.rows(
            "SELECT message FROM session_messages WHERE session_id = ? AND NOT compacted ORDER BY seq",
            [session_id],
        )
        return self.resolve_refs([json.loads(r[0]) for r in rows])

    def write_messages(self, session_id: str, turn_idx: int, messages: list[tuple[int, dict]],
                       extra_blocks: list[tuple] = (), tokenizer: Any = None) -> None:
        """Append conversation messages (inside the caller's transaction), with their new blocks."""
        pending: dict[str, tuple] = {r[0]: r for r in extra_blocks if r[0] not in self._pending_known}
        rows = [(session_id, seq, turn_idx, self.message_ref(m, pending, tokenizer), False) for seq, m in messages]
        self._insert("blocks", list(pending.values()))
        self._pending_known.update(pending)
        self._insert("session_messages", rows)

    def message_count(self, session_id: str) -> int:
        return self.one("SELECT count(*) FROM session_messages WHERE session_id = ?", [session_id])[0]

    def deltas(self, session_id: str) -> list[Delta]:
        out = []
        for seq, sel, content in self.rows(
            "SELECT seq, selector, content FROM session_prompt_deltas WHERE session_id = ? ORDER BY seq",
            [session_id],
        ):
            try:
                out.append(Delta(seq, json.loads(sel), json.loads(content)))
            except ValueError:
                continue  # a corrupt row is skipped, as Lore's replay does
        return out

    # -- requests -----------------------------------------------------------------------------
    def prefix_nodes(
        self, req: PreparedRequest, prev_keys: list[str], prev_nodes: list[str]
    ) -> tuple[list[str], list[str], list[tuple]]:
        """Node ids for each segment, reusing the previous request's shared leading run.

        Returns (keys, node_ids, new_node_rows).
        """
        keys = list(map(_CHAIN_KEY, req.segments))
        n = common_prefix_length(keys, prev_keys)
        nodes = prev_nodes[:n]
        new_rows = []
        parent = nodes[-1] if nodes else None
        for i in range(n, len(keys)):
            node = digest(((parent or "") + "/" + keys[i]).encode(), tag="node")
            if node not in self._known_nodes:
                seg = req.segments[i]
                new_rows.append((node, parent, i, seg.kind, seg.role, seg.block_hash))
            nodes.append(node)
            parent = node
        return keys, nodes, new_rows

    def new_blocks(self, req: PreparedRequest, rest_body: str, rest_hash: str) -> list[tuple]:
        rows, seen = [], set()
        for s in req.segments:
            if s.block_hash in self._known_blocks or s.block_hash in seen:
                continue
            body = canonical_json(s.element)
            rows.append((s.block_hash, s.kind, body, s.tokens, len(body.encode())))
            seen.add(s.block_hash)
        if rest_hash not in self._known_blocks and rest_hash not in seen:
            rows.append((rest_hash, "rest", rest_body, None, len(rest_body.encode())))
        return rows

    def write_turn(
        self,
        *,
        turn_row: dict[str, Any],
        block_rows: list[tuple],
        node_rows: list[tuple],
        messages: list[tuple[int, dict]],
        compact_before: int | None,
        state: dict[str, Any] | None,
        delta_ops: list[tuple[str, int, dict | None, dict | None]],
        knowledge_rows: list[KnowledgeEntry],
        project_id: str,
        state_previous: dict[str, Any] | None = None,
        tokenizer: Any = None,
    ) -> None:
        """Write one request and everything it changed in one transaction; nothing on failure."""
        con = self.con
        with self.transaction():
            for e in knowledge_rows:
                self.write_knowledge(e)
            if compact_before is not None:
                con.execute(
                    "UPDATE session_messages SET compacted = true WHERE session_id = ? AND seq < ?",
                    [turn_row["session_id"], compact_before],
                ).fetchall()
            # request blocks and the messages' new blocks go in one insert
            self.write_messages(turn_row["session_id"], turn_row["idx"], messages, block_rows, tokenizer)
            node_rows = [r for r in node_rows if r[0] not in self._pending_nodes]
            self._insert("prefix_nodes", node_rows)
            self._pending_nodes.update(r[0] for r in node_rows)
            for op, seq, selector, content in delta_ops:
                if op == "delete":
                    con.execute(
                        "DELETE FROM session_prompt_deltas WHERE session_id = ? AND seq = ?",
                        [turn_row["session_id"], seq],
                    ).fetchall()
                else:
                    con.execute(
                        "INSERT OR REPLACE INTO session_prompt_deltas VALUES (?, ?, ?, ?, ?)",
                        [turn_row["session_id"], seq, project_id, canonical_json(selector), canonical_json(content)],
                    ).fetchall()
            if state is not None:
                self.write_state(turn_row["session_id"], state, turn_row["at"], previous=state_previous)
            cols = list(turn_row)
            quoted = ", ".join('"' + c + '"' for c in cols)
            con.execute(
                f"INSERT INTO turns ({quoted}) VALUES ({', '.join('?' * len(cols))})",
                [turn_row[c] for c in cols],
            ).fetchall()

    def turn_body(self, session_id: str, idx: int) -> dict[str, Any]:
        """Rebuild a turn's exact request body from ``blocks`` + ``prefix_nodes`` + ``turns``."""
        row = self.one("SELECT tail_node, rest_hash FROM turns WHERE session_id = ? AND idx = ?", [session_id, idx])
        if row is None:
            raise StoreError(f"session {session_id!r} has no turn {idx}")
        tail, rest_hash = row
        rest = json.loads(self.one("SELECT body FROM blocks WHERE hash = ?", [rest_hash])[0])
        chain: list[tuple[str, str | None, Any]] = []
        if tail is not None:
            rows = self.rows(
                """WITH RECURSIVE chain(id, parent, depth) AS (
                       SELECT id, parent, depth FROM prefix_nodes WHERE id = ?
                       UNION ALL
                       SELECT p.id, p.parent, p.depth FROM prefix_nodes p JOIN chain c ON p.id = c.parent)
                   SELECT n.kind, n.role, b.body FROM chain c
                   JOIN prefix_nodes n ON n.id = c.id JOIN blocks b ON b.hash = n.block_hash
                   ORDER BY c.depth""",
                [tail],
            )
            chain = [(k, r, json.loads(body)) for k, r, body in rows]
        return rebuild_body(rest["shape"], rest["rest"], chain)
