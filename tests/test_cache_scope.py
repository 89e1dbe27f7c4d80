"""Cache scopes: the sessions of a project (or a Lab) share one simulated provider cache, as a provider's
workspace does, so a compaction call or a sub-agent that re-sends the parent's prefix reads its entries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import promptcache_nb as pc
from promptcache_nb._shared import cache_scope_of
from promptcache_nb.errors import SessionError

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
SYSTEM = "\n".join(f"Rule {i}: quote the ledger entry of every refund you mention ({i})." for i in range(150))
MARK = {"type": "ephemeral"}


def body(history: list[str], *, ask: str | None = None) -> dict:
    """A Messages body: the long system prompt, then ``history`` (user/assistant turns), the last block marked;
    ``ask`` appends a final user message (a compaction call's "summarise this")."""
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": [{"type": "text", "text": t}]}
            for i, t in enumerate(history)]
    if ask is not None:
        msgs.append({"role": "user", "content": [{"type": "text", "text": ask}]})
    msgs[-1] = {"role": msgs[-1]["role"], "content": [{**msgs[-1]["content"][-1], "cache_control": MARK}]}
    return {"model": "claude-sonnet-4-5", "max_tokens": 1024,
            "system": [{"type": "text", "text": SYSTEM, "cache_control": MARK}], "messages": msgs}


HISTORY = [f"{'Question' if i % 2 == 0 else 'Answer'} {i} about invoice {100 + i}." for i in range(7)]


def parent_and_compaction(lab: pc.Lab, scope: str, *, project: str = "billing") -> tuple[pc.Session, pc.Session]:
    parent = lab.session(project=project, cache_scope=scope, start=T0)
    for n in (1, 3, 5, 7):
        parent.record(body(HISTORY[:n]), at=T0 + timedelta(seconds=20 * n))
    child = lab.session(project=project, cache_scope=scope, start=T0)
    return parent, child


def test_a_compaction_call_reads_the_parents_entries_in_a_project_scope():
    with pc.Lab(progress=False) as lab:
        parent, child = parent_and_compaction(lab, "project")
        t = child.record(body(HISTORY, ask="Summarise the conversation so far."), at=T0 + timedelta(seconds=150))
        prefix = parent.last_turn.total_tokens
        # the parent's whole last request was written: the child re-sends it and reads it
        assert t.usage.cache_read_input_tokens == prefix
        assert t.cache_reason == "hit"  # the child's first request: read from the shared cache, not "cold"
        # the parent's next request still compares with its own previous request
        p = parent.record(body(HISTORY[:7] + ["More."]), at=T0 + timedelta(seconds=160))
        assert p.cache_reason == "hit" and p.usage.cache_read_input_tokens == prefix
        assert {parent.cache_scope, child.cache_scope} == {"project"}


def test_session_scope_is_the_default_and_shares_nothing():
    with pc.Lab(progress=False) as lab:
        parent, child = parent_and_compaction(lab, "session")
        t = child.record(body(HISTORY, ask="Summarise the conversation so far."), at=T0 + timedelta(seconds=150))
        assert t.usage.cache_read_input_tokens == 0 and t.cache_reason == "cold"
        assert lab.session(project="x").cache_scope == "session"


def test_project_scopes_of_two_projects_are_separate_and_a_lab_scope_spans_them():
    with pc.Lab(progress=False) as lab:
        parent_and_compaction(lab, "project", project="one")
        other = lab.session(project="two", cache_scope="project", start=T0)
        t = other.record(body(HISTORY, ask="Summarise."), at=T0 + timedelta(seconds=150))
        assert t.usage.cache_read_input_tokens == 0
    with pc.Lab(progress=False) as lab:
        parent_and_compaction(lab, "lab", project="one")
        other = lab.session(project="two", cache_scope="lab", start=T0)
        t = other.record(body(HISTORY, ask="Summarise."), at=T0 + timedelta(seconds=150))
        assert t.usage.cache_read_input_tokens > 0


def test_a_shared_cache_is_rebuilt_from_both_sessions_after_reopening(tmp_path):
    """Closed and reopened, the project's cache is rebuilt from both sessions' requests in time order: the
    child's next request reads what it read in the uninterrupted run."""
    def scenario(lab: pc.Lab) -> tuple[pc.Session, pc.Session]:
        parent, child = parent_and_compaction(lab, "project")
        child.record(body(HISTORY, ask="Summarise the conversation so far."), at=T0 + timedelta(seconds=150))
        return parent, child

    with pc.Lab(progress=False) as lab:
        parent, child = scenario(lab)
        parent.record(body(HISTORY + ["Next question."]), at=T0 + timedelta(seconds=170))
        want = child.record(body(HISTORY + ["Next question."], ask="Summarise again."),
                            at=T0 + timedelta(seconds=180))
    db = tmp_path / "scope.duckdb"
    with pc.Lab(db, progress=False) as lab:
        parent, child = scenario(lab)
        ids = parent.id, child.id
    with pc.Lab(db, progress=False) as lab:
        parent, child = lab.session(id=ids[0]), lab.session(id=ids[1])
        parent.record(body(HISTORY + ["Next question."]), at=T0 + timedelta(seconds=170))
        got = child.record(body(HISTORY + ["Next question."], ask="Summarise again."), at=T0 + timedelta(seconds=180))
    assert got.usage == want.usage and got.cache_reason == want.cache_reason
    assert got.usage.cache_read_input_tokens > 0


def test_scope_defaults_and_bad_values():
    assert cache_scope_of({"config": {}, "strategy": None}) == "project"  # imported sessions
    assert cache_scope_of({"config": {}, "strategy": "naive"}) == "session"
    assert cache_scope_of({"config": {"cache_scope": "lab"}, "strategy": None}) == "lab"
    with pc.Lab(progress=False) as lab, pytest.raises(SessionError, match="cache_scope='team'"):
        lab.session(cache_scope="team")


def test_reopened_scope_reads_back_only_the_sessions_that_sent_since_its_cache_could_hold(tmp_path, monkeypatch):
    """A project's shared cache is rebuilt from its members' requests since the last pause nothing outlives: a
    member that sent nothing since then is not read back (one query says which did; a heavy user's project holds
    hundreds of sessions), and the next request reads what the uninterrupted run read."""
    from promptcache_nb import analysis

    def scenario(lab: pc.Lab) -> tuple[pc.Session, pc.Session]:
        old = lab.session(project="billing", cache_scope="project", start=T0)
        old.record(body(HISTORY[:3]), at=T0)  # hours before the others: nothing of it can still be cached
        late = T0 + timedelta(hours=5)
        parent, child = lab.session(project="billing", cache_scope="project", start=late), None
        for n in (1, 3, 5):
            parent.record(body(HISTORY[:n]), at=late + timedelta(seconds=20 * n))
        child = lab.session(project="billing", cache_scope="project", start=late)
        child.record(body(HISTORY[:5], ask="Summarise the conversation so far."), at=late + timedelta(seconds=120))
        return old, parent

    with pc.Lab(progress=False) as lab:
        old, parent = scenario(lab)
        want = parent.record(body(HISTORY), at=T0 + timedelta(hours=5, seconds=140))
    db = tmp_path / "scope.duckdb"
    with pc.Lab(db, progress=False) as lab:
        old, parent = scenario(lab)
        ids = old.id, parent.id
    read: list[str] = []
    real = analysis.load_turns
    monkeypatch.setattr(analysis, "load_turns", lambda lab, sid, **kw: read.append(sid) or real(lab, sid, **kw))
    with pc.Lab(db, progress=False) as lab:
        got = lab.session(id=ids[1]).record(body(HISTORY), at=T0 + timedelta(hours=5, seconds=140))
    assert got.usage == want.usage and got.cache_reason == want.cache_reason
    assert got.usage.cache_read_input_tokens > 0
    assert ids[0] not in read and ids[1] in read  # the old session was never read back
