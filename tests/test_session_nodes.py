"""``Store.session_nodes`` reads a session's prefix nodes by where they were written: whatever the order the
sessions wrote them in, whoever wrote a shared node first, and after rows were deleted and the file compacted,
it returns exactly the chain a walk over the whole table finds (the oracle here reads every row and walks it).
Its speed on a big store is measured in ``benchmarks/bench_analysis.py``, not here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

import promptcache_nb as pc
from promptcache_nb.store import Store, StoredNode

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
SYSTEM = "You are the billing support assistant. Answer precisely and cite the ticket. " * 20
TOOLS = [{"name": f"tool_{i}", "description": f"does thing {i}", "input_schema": {"type": "object"}}
         for i in range(3)]


def _body(turns: int, topic: str) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"{topic} question {i}"}]})
        if i < turns - 1:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": f"{topic} answer {i}"}]})
    return {"model": "claude-sonnet-4-5", "max_tokens": 64, "system": SYSTEM, "tools": TOOLS, "messages": messages}


def oracle(lab: pc.Lab, session_id: str, since: datetime | None = None) -> dict[str, StoredNode]:
    """Every node on the chains of the session's requests, found by walking all of ``prefix_nodes``."""
    nodes = {r["id"]: r for r in lab.sql("SELECT * FROM prefix_nodes").to_dict("records")}
    bodies = dict(lab.sql("SELECT hash, body FROM blocks").itertuples(index=False))
    turns = lab.sql('SELECT tail_node, sent_at FROM turns WHERE session_id = ?', [session_id])
    out: dict[str, StoredNode] = {}
    for tail, at in turns.itertuples(index=False):
        node = tail
        while isinstance(node, str) and node not in out and (since is None or at >= since):
            n = nodes[node]
            parent = n["parent"] if isinstance(n["parent"], str) else None
            role = n["role"] if isinstance(n["role"], str) else None
            out[node] = StoredNode(parent, n["kind"], role, n["block_hash"], bodies[n["block_hash"]])
            node = parent
    return out


@pytest.fixture
def interleaved(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Three sessions writing turn by turn in turn: B's first request is A's first (it writes no node of its
    own), C forks A's history; then A resumes after the others wrote, far from its first rows."""
    path = tmp_path / "nodes.duckdb"
    with pc.Lab(path, progress=False) as lab:
        a, b, c = (lab.session(strategy="naive", project="p", start=T0) for _ in range(3))
        at = T0
        for i in range(1, 5):
            for s, topic in ((a, "alpha"), (b, "alpha" if i == 1 else "beta"), (c, "alpha" if i < 3 else "gamma")):
                at += timedelta(seconds=30)
                s.record(_body(i, topic), at=at)
        for i in range(5, 8):
            at += timedelta(seconds=30)
            a.record(_body(i, "alpha"), at=at)
        ids = {"a": a.id, "b": b.id, "c": c.id}
    return path, ids


def test_every_session_reads_the_chain_a_walk_over_the_whole_table_finds(interleaved) -> None:
    path, ids = interleaved
    with pc.Lab(path, progress=False, read_only=True) as lab:
        store = lab.store
        a_first = store.turn_row(ids["a"], 0, ["tail_node"])
        assert store.turn_row(ids["b"], 0, ["tail_node"]) == a_first  # b's first request wrote nothing of its own
        for sid in ids.values():
            want = oracle(lab, sid)
            assert store.session_nodes(sid) == want and want
            last = store.turn_row(sid, store.usage_marks(sid).last_idx, ["sent_at"])["sent_at"]
            assert store.session_nodes(sid, since=last) == oracle(lab, sid, since=last)
        assert store.session_nodes("nope") == {}


def test_the_chain_is_found_after_rows_before_it_were_deleted_and_the_file_compacted(interleaved) -> None:
    path, ids = interleaved
    with pc.Lab(path, progress=False) as lab:  # b and c gone, with the nodes only they used
        for sid in (ids["b"], ids["c"]):
            lab.store.delete_session(sid)
    con = duckdb.connect(str(path))
    con.execute("DELETE FROM prefix_nodes WHERE id NOT IN (SELECT id FROM prefix_nodes WHERE depth < 5)")
    con.execute("CHECKPOINT")
    con.close()
    with pc.Lab(path, progress=False) as lab:
        s = lab.session(strategy="naive", project="p", start=T0)  # writes a's deeper nodes again
        s.record(_body(7, "alpha"), at=T0 + timedelta(hours=1))
        assert lab.store.session_nodes(s.id) == oracle(lab, s.id)
        pc.resimulate(s, cache="anthropic")  # the bodies rebuild from those nodes


def test_a_fleet_dataset_reads_the_same_nodes_through_its_views(interleaved, tmp_path: Path) -> None:
    path, ids = interleaved
    with pc.Lab(path, progress=False, read_only=True) as lab:
        lab.store.export_parquet(str(tmp_path / "ds"), "g")
        want = {sid: lab.store.session_nodes(sid) for sid in ids.values()}
    ds = Store.open_dataset(str(tmp_path / "ds"))
    try:
        assert {sid: ds.session_nodes(sid) for sid in ids.values()} == want
    finally:
        ds.close()
