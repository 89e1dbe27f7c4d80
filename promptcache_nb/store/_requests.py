"""Requests: their content-addressed blocks and prefix nodes, a session's messages and prompt deltas, and the
rebuild of a stored body."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from .._types import Delta, MessageBlock, RequestRecord
from ..errors import StoreError
from ..request import PreparedRequest, canonical_json, rebuild_body
from ..request._canonical import SegmentMemo
from ..tokens import DEFAULT_TOKENIZER, Tokenizer, segment_tokens
from ._codecs import _INSERT_REQUEST, _RECORD_SELECT, _RECORD_VALUES, encode_message
from ._connection import _one_line
from ._datasets import _DatasetsMixin
from ._queries import _since
from ._schema import damaged, node_on_cycle
from ._sessions import _SessionsMixin
from ._write import RequestWrite

if TYPE_CHECKING:  # pandas loads on the first DataFrame (duckdb's .df() imports it): not with the package
    import pandas as pd


class StoredNode(NamedTuple):
    """One ``prefix_nodes`` row with its block's body (:meth:`Store.session_nodes`)."""

    parent: str | None
    kind: str
    role: str | None
    block_hash: str
    body: str  #: the segment's canonical JSON


class _RequestsMixin(_SessionsMixin, _DatasetsMixin):
    """What a request writes and how a stored one is read back (:class:`~promptcache_nb.store.Store`): written
    into a session (its state, its pending events) and read from a fleet dataset's files as from a store."""

    # -- messages and deltas ------------------------------------------------------------------
    def message_ref(self, message: dict[str, Any], pending: dict[str, tuple[Any, ...]],
                    tokenizer: Tokenizer | SegmentMemo | None = None) -> str:
        """A message as block references (:func:`encode_message`); bodies not yet stored are added to
        ``pending`` (hash -> blocks row). Content is stored once."""
        ref, blocks = encode_message(message)
        self._add_blocks(blocks, pending, tokenizer)
        return ref

    def _add_blocks(self, blocks: Sequence[MessageBlock], pending: dict[str, tuple[Any, ...]],
                    tokenizer: Tokenizer | SegmentMemo | None) -> None:
        """The ``blocks`` rows of message blocks not stored (nor pending) yet, into ``pending``; their tokens are
        counted only then. ``tokenizer``: a Tokenizer, or a session's SegmentMemo (its counts are reused: a
        reply's blocks are the next request's history)."""
        memo: SegmentMemo | None = None
        if isinstance(tokenizer, SegmentMemo):
            memo, tok = tokenizer, tokenizer.tokenizer
        else:
            tok = tokenizer if tokenizer is not None else DEFAULT_TOKENIZER
        for h, kind, body, element in blocks:
            if h not in self._known_blocks and h not in pending and h not in self._pending_known:
                if memo is not None and not (isinstance(element, dict) and "cache_control" in element):
                    tokens = memo.tokens(kind, h, element)  # h is the content hash: no marker
                else:
                    tokens = segment_tokens(kind, element, tok)
                pending[h] = (h, kind, body, tokens, len(body.encode()))

    def resolve_refs(self, refs: list[dict[str, Any]], *, session_id: str | None = None) -> list[dict[str, Any]]:
        """Messages back from their block references (one query for all bodies; ``session_id``: theirs)."""
        hashes = sorted({h for r in refs for h in ([r["str"]] if "str" in r else r["blocks"])})
        bodies = self.block_bodies({"session_messages": hashes}, session_id=session_id)
        out = []
        for r in refs:
            if "str" in r:
                out.append({"role": r["role"], "content": self.parse_block(r["str"], bodies[r["str"]],
                                                                           "session_messages")})
            else:
                out.append({"role": r["role"], "content": [self.parse_block(h, bodies[h], "session_messages")
                                                           for h in r["blocks"]]})
        return out

    def parse_block(self, block_hash: str, body: str, used_by: str) -> Any:
        """A block's body (from :meth:`block_bodies`) parsed; a body that is not JSON (a tampered or damaged store)
        raises a one-line :class:`StoreError` naming the block and ``used_by``, the column that references it."""
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise StoreError(damaged(self.path, f"block {block_hash!r} (referenced by {used_by}) is not JSON "
                                                f"(blocks.body: {_one_line(exc)})")) from None

    def block_bodies(self, uses: dict[str, Sequence[str]], *, session_id: str | None = None) -> dict[str, str]:
        """hash -> body of the ``blocks`` rows named, in one query: ``uses`` maps the column that references them
        (named by the error a missing or NULL body raises) to their hashes; ``session_id``, the session they
        rebuild (a fleet dataset reads its file group's files first).

        Only those rows' bodies are read. Joined on the hash, DuckDB decompresses the body column (zstd, whole
        vectors of 2,048 rows: about 1 s on a 500 MB store) to keep a few; looking up their row ids on the hash
        column alone first makes it read only the vectors that hold them (a fleet dataset's views have no row
        ids: :meth:`_dataset_rows`).
        """
        hashes = sorted({h for hs in uses.values() for h in hs})
        if not hashes:
            return {}
        if self._views:
            bodies = self._dataset_rows("blocks", "SELECT hash, body FROM {source} WHERE hash IN (SELECT unnest($1))",
                                        hashes, session_id)
        else:
            bodies = dict(self.rows("SELECT hash, body FROM blocks WHERE rowid IN "
                                    "(SELECT rowid FROM blocks WHERE hash IN (SELECT unnest($1)))", [hashes]))
        for used_by, hs in uses.items():
            for h in hs:
                if bodies.get(h) is None:
                    self._missing_block(h, used_by, h in bodies)
        return bodies

    def _missing_block(self, block_hash: str, used_by: str, present: bool) -> NoReturn:
        what = "has a NULL body (blocks.body)" if present else "is missing from table blocks"
        raise StoreError(damaged(self.path, f"block {block_hash!r} (referenced by {used_by}) {what}"))

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        rows = self.rows(
            "SELECT message FROM session_messages WHERE session_id = ? AND NOT compacted ORDER BY seq",
            [session_id],
        )
        return self.resolve_refs([json.loads(r[0]) for r in rows], session_id=session_id)

    def built_from(self, session_id: str) -> tuple[int, int, bool] | None:
        """(index, history length, messages stored after it?) of the session's last request a strategy built
        from its history (``turns.n_messages``); None when there is none (or it predates m006)."""
        row = self.one("SELECT idx, n_messages FROM turns WHERE session_id = ? AND n_messages IS NOT NULL "
                       "ORDER BY idx DESC LIMIT 1", [session_id])
        if row is None:
            return None
        later = self.scalar("SELECT count(*) FROM session_messages WHERE session_id = ? AND turn_idx > ?",
                            [session_id, row[0]])
        return row[0], row[1], bool(later)

    def history_of(self, session_id: str, idx: int, n_messages: int) -> list[dict[str, Any]]:
        """The ``n_messages`` history messages request ``idx`` was built from: the request's own rows are the
        last of its epoch (its new messages and its reply, which is left out), so they are the ``n + 1``
        latest rows up to its index, compacted since or not."""
        rows = self.rows("SELECT message FROM session_messages WHERE session_id = ? AND turn_idx <= ? "
                         "ORDER BY seq DESC LIMIT ?", [session_id, idx, n_messages + 1])
        refs = [json.loads(r[0]) for r in reversed(rows)]
        return self.resolve_refs(refs[:n_messages], session_id=session_id)

    def write_messages(self, session_id: str, turn_idx: int, messages: list[tuple[int, dict[str, Any]]],
                       extra_blocks: Sequence[tuple[Any, ...]] = (),
                       tokenizer: Tokenizer | SegmentMemo | None = None) -> None:
        """Append conversation messages (inside the caller's transaction), with their new blocks."""
        pending: dict[str, tuple[Any, ...]] = {r[0]: r for r in extra_blocks if r[0] not in self._pending_known}
        rows = [(session_id, seq, turn_idx, self.message_ref(m, pending, tokenizer), False) for seq, m in messages]
        self._insert("blocks", list(pending.values()))
        self._pending_known.update(pending)
        self._insert("session_messages", rows)

    def compact_messages(self, session_id: str) -> None:
        """Mark a session's history compacted (inside the caller's transaction): replaced by what follows."""
        self.con.execute("UPDATE session_messages SET compacted = true WHERE session_id = ?", [session_id]).fetchall()
        deferred = self._buffer.get("session_messages") if self._buffer is not None else None
        if deferred:  # rows a batch() has not written yet are part of that history too
            self._buffer["session_messages"] = [  # type: ignore[index]
                (*r[:4], True) if r[0] == session_id else r for r in deferred]

    def message_count(self, session_id: str) -> int:
        return int(self.scalar("SELECT count(*) FROM session_messages WHERE session_id = ?", [session_id]))

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

    def deltas_frame(self, session_id: str) -> pd.DataFrame:
        """A session's ``session_prompt_deltas`` rows as stored (JSON columns as text), by seq."""
        return self.sql("SELECT seq, project_id, selector, content FROM session_prompt_deltas WHERE session_id = ? "
                        "ORDER BY seq", [session_id])

    # -- requests -----------------------------------------------------------------------------
    def new_blocks(self, req: PreparedRequest, rest_body: str, rest_hash: str, *, shared: int = 0
                   ) -> list[tuple[Any, ...]]:
        """``blocks`` rows for the request's segments not stored yet, and its ``rest`` row.

        ``shared``: how many leading segments the request shares with the session's previous stored request
        (the common run of chain keys, whose block hashes are in them): their blocks were written with that
        request, so the walk starts after them — O(new segments) per turn instead of O(segments). A block written
        earlier in the open transaction is left out too. The canonical JSON ``prepare(keep_texts=True)`` kept is
        used (and dropped), not serialised again.
        """
        rows: list[tuple[str, str, str, int | None, int]] = []  # (hash, kind, body, tokens, bytes)
        seen: set[str] = set()
        known, pending = self._known_blocks, self._pending_known
        texts = req.derived.texts or {}
        req.derived.texts = None
        for s in req.segments[shared:] if shared else req.segments:
            h = s.block_hash
            if h in known or h in seen or h in pending:
                continue
            got = texts.get(h)
            if got is None:
                body = canonical_json(s.element)
                got = body, len(body.encode())
            rows.append((h, s.kind, got[0], s.tokens, got[1]))
            seen.add(h)
        if rest_hash not in self._known_blocks and rest_hash not in seen:
            rows.append((rest_hash, "rest", rest_body, None, len(rest_body.encode())))
        return rows

    def write_request(self, write: RequestWrite, *, tokenizer: Tokenizer | SegmentMemo | None = None) -> None:
        """Write one request and everything it changed (:class:`~promptcache_nb.RequestWrite`) in one
        transaction, joined to the caller's; nothing on failure. ``tokenizer`` counts new message blocks."""
        rec = write.record
        sid = rec.session_id
        with self.transaction():
            assert rec.rest_hash is not None  # the pipeline's record of an analysed body
            block_rows = self.new_blocks(write.prepared, write.rest_body, rec.rest_hash, shared=write.shared)
            if write.reply_blocks:
                # the reply's content blocks are stored once, in blocks (shared with the history row)
                pending = {r[0]: r for r in block_rows}
                self._add_blocks(write.reply_blocks, pending, tokenizer)
                block_rows = list(pending.values())
            # request blocks and the messages' new blocks go in one insert
            self.write_messages(sid, rec.idx, write.messages, block_rows, tokenizer)
            node_rows = self._new_nodes(write.prepared, write.nodes, write.shared)
            self._insert("prefix_nodes", node_rows)
            self._pending_nodes.update(r[0] for r in node_rows)
            con = self.con
            for op, seq, selector, content in write.delta_ops:
                if op == "delete":
                    con.execute("DELETE FROM session_prompt_deltas WHERE session_id = ? AND seq = ?",
                                [sid, seq]).fetchall()
                else:
                    con.execute("INSERT OR REPLACE INTO session_prompt_deltas VALUES (?, ?, ?, ?, ?)",
                                [sid, seq, write.project_id, canonical_json(selector),
                                 canonical_json(content)]).fetchall()
            if write.state is not None:
                self.write_state(sid, write.state, rec.sent_at, previous=write.state_previous)
            if write.consumes_pending_events:
                self.clear_pending_events(sid)
            if self._buffer is not None:
                self._buffer.setdefault("turns", []).append(rec)
                return
            con.execute(_INSERT_REQUEST, _RECORD_VALUES(rec)).fetchall()

    def _new_nodes(self, req: PreparedRequest, nodes: list[str], shared: int) -> list[tuple[Any, ...]]:
        """``prefix_nodes`` rows for the nodes after the ``shared`` ones that are not stored (nor pending) yet."""
        rows = []
        for i in range(shared, len(nodes)):
            node = nodes[i]
            if node not in self._known_nodes and node not in self._pending_nodes:
                seg = req.segments[i]
                rows.append((node, nodes[i - 1] if i else None, i, seg.kind, seg.role, seg.block_hash))
        return rows

    def read_request(self, session_id: str, idx: int) -> RequestRecord | None:
        """A stored request's :class:`~promptcache_nb.RequestRecord` (None when it does not exist)."""
        rows = self.query(f"SELECT {_RECORD_SELECT} FROM turns WHERE session_id = ? AND idx = ?", [session_id, idx])
        if not rows:
            return None
        row = rows[0]
        row["sent_at"] = row["sent_at"].astimezone(UTC)
        return RequestRecord(**row)

    def turn_body(self, session_id: str, idx: int) -> dict[str, Any]:
        """Rebuild a turn's exact request body from ``blocks`` + ``prefix_nodes`` + ``turns`` (for OpenAI
        dialects and partial bodies a ``LoggedBody`` that ``prepare`` turns back into the same segments)."""
        return self.turn_bodies(session_id, [idx])[idx]

    def turn_bodies(self, session_id: str, indexes: Sequence[int]) -> dict[int, dict[str, Any]]:
        """:meth:`turn_body` of several turns of one session (a turn and the one before it), their prefix nodes
        read together where they were written (:meth:`_session_chain`), never by a walk up the whole table."""
        wanted = sorted(set(indexes))
        found = {r[0]: (r[1], r[2]) for r in self.rows(
            "SELECT idx, tail_node, rest_hash FROM turns WHERE session_id = ? AND idx IN (SELECT unnest(?))",
            [session_id, wanted])}
        for idx in wanted:
            if idx not in found:
                raise StoreError(f"session {session_id!r} has no turn {idx}")
        nodes = self._session_chain(session_id, "session_id = ? AND idx IN (SELECT unnest(?))",
                                    [session_id, wanted], whole_session=False)
        bodies = self.block_bodies({"turns.rest_hash": [rest for _, rest in found.values()],
                                    "prefix_nodes.block_hash": [n[3] for n in nodes.values()]}, session_id=session_id)
        out: dict[int, dict[str, Any]] = {}
        for idx in wanted:
            tail, rest_hash = found[idx]
            chain: list[tuple[Any, Any, Any]] = []
            node = tail
            while node is not None:
                parent, kind, role, block_hash = nodes[node]
                # parsed per body: never shared
                chain.append((kind, role, self.parse_block(block_hash, bodies[block_hash], "prefix_nodes.block_hash")))
                node = parent
            rest = self.parse_block(rest_hash, bodies[rest_hash], "turns.rest_hash")
            out[idx] = rebuild_body(rest["shape"], rest["rest"], chain[::-1])
        return out

    def rest_bodies(self, session_id: str, *, since: datetime | None = None) -> dict[str, str]:
        """The ``rest`` blocks (a body's shape and its top-level fields) of a session's requests (``since``: sent
        at or after it): hash -> JSON."""
        return self.session_blocks(session_id, since=since, nodes=False)[0]

    def session_nodes(self, session_id: str, *, since: datetime | None = None) -> dict[str, StoredNode]:
        """Every prefix node a session's requests (``since``: sent at or after it) run through (node id ->
        :class:`StoredNode`): :meth:`session_blocks`."""
        return self.session_blocks(session_id, since=since, rests=False)[1]

    def session_blocks(self, session_id: str, *, since: datetime | None = None, rests: bool = True,
                       nodes: bool = True) -> tuple[dict[str, str], dict[str, StoredNode]]:
        """What rebuilds a session's request bodies (``since``: those sent at or after it): their ``rest`` blocks
        (:meth:`rest_bodies`) and every prefix node they run through (:meth:`session_nodes`), with the bodies
        read in one query (``rests`` / ``nodes`` False: leave those out).

        Read by where the nodes were written, never by scanning the whole table once per level: a request's new
        nodes are appended just before its tail node, so the nodes on its chain that it wrote lie within
        ``depth`` rows before that tail. The session's rows are read in one query and its chains walked here;
        a node another session wrote (a shared system prompt, a forked history) is looked up by id and the rows
        before it read the same way. (A recursive walk scanned ``prefix_nodes`` at every level: depth x store
        size, and with the bodies joined about 1 s per session of a heavy user's 29,000-request store.)
        """
        where, params = _since(session_id, since)
        rest_hashes = [r[0] for r in self.rows(
            f"SELECT DISTINCT rest_hash FROM turns WHERE {where} ORDER BY 1", params)] if rests else []
        chain = self._session_chain(session_id, where, params) if nodes else {}
        bodies = self.block_bodies({"turns.rest_hash": rest_hashes,
                                    "prefix_nodes.block_hash": [r[3] for r in chain.values()]}, session_id=session_id)
        return ({h: bodies[h] for h in rest_hashes},
                {node: StoredNode(parent, kind, role, h, bodies[h]) for node, (parent, kind, role, h) in chain.items()})

    def _session_chain(self, session_id: str, where: str, params: list[Any], *, whole_session: bool = True
                       ) -> dict[str, tuple[Any, ...]]:
        """:meth:`session_blocks`' nodes, without their bodies: id -> parent, kind, role, block_hash, for the
        requests ``where`` selects. ``whole_session``: first read around every request's tail (most chains of the
        session run through those rows), else around the selected requests' tails only (a turn or two)."""
        tails = [r[0] for r in self.rows(
            f"SELECT DISTINCT tail_node FROM turns WHERE {where} AND tail_node IS NOT NULL ORDER BY 1", params)]
        rows: dict[str, tuple[Any, ...]] = {}
        out: dict[str, tuple[Any, ...]] = {}
        todo = tails
        lookup: tuple[str, list[Any]] = (
            ("SELECT tail_node FROM turns WHERE session_id = $1", [session_id]) if whole_session
            else ("SELECT unnest($1)", [tails]))
        while todo:
            rows.update(self._chains_up(todo, session_id) if self._views else self._nodes_before(*lookup))
            missing = []
            for node in todo:
                if node not in rows:  # a node gone would surface as a KeyError in whoever walks the chain
                    raise StoreError(damaged(self.path, f"prefix node {node!r} (on a request of session "
                                                        f"{session_id!r}) is missing from prefix_nodes"))
                cur: str | None = node
                while cur is not None and cur not in out:
                    if cur not in rows:
                        missing.append(cur)
                        break
                    out[cur] = rows[cur]
                    cur = rows[cur][0]
            todo = missing
            lookup = ("SELECT unnest($1)", [missing])
        looping = node_on_cycle(out)
        if looping is not None:  # a walk up the chain would never reach a root
            raise StoreError(damaged(self.path, f"prefix_nodes row {looping!r} (on a request of session "
                                                f"{session_id!r}) is its own ancestor: prefix_nodes.parent "
                                                "runs in a cycle"))
        return out

    def _nodes_before(self, ids_sql: str, params: list[Any]) -> dict[str, tuple[Any, ...]]:
        """The ``prefix_nodes`` rows (id -> parent, kind, role, block_hash) of the nodes ``ids_sql`` selects and
        of the ``depth`` rows before each: what the requests that wrote them wrote (other rows in between too)."""
        ranges: list[list[int]] = []
        for rowid, depth in self.rows(f"SELECT rowid, depth FROM prefix_nodes WHERE id IN ({ids_sql}) ORDER BY rowid",
                                      params):
            if ranges and rowid - depth <= ranges[-1][1] + 1:
                ranges[-1][1] = rowid
            else:
                ranges.append([rowid - depth, rowid])
        if not ranges:
            return {}
        where = " OR ".join("rowid BETWEEN ? AND ?" for _ in ranges)
        found = self.rows(f"SELECT id, parent, kind, role, block_hash FROM prefix_nodes WHERE {where}",
                          [x for r in ranges for x in r])
        return {r[0]: r[1:] for r in found}
