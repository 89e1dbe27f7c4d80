"""The account scope: imported sessions share one simulated provider cache per account (the provider's own rule),
whichever door they came through — ``lab.import_log`` or ``pc.fleet.import_logs`` store the same simulated
columns for the same files and accounts — and a read of what another session wrote names that session."""

from __future__ import annotations

import json
import shutil
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import _benchmarks
import pandas as pd
import pytest

import promptcache_nb as pc
from promptcache_nb import fleet
from promptcache_nb.cli import main
from promptcache_nb.errors import PromptCacheError
from tests.test_cache_scope import HISTORY, T0, body

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "logs"


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.simplefilter("ignore", pc.errors.ContextWindowWarning)


def _history_module() -> Any:
    return _benchmarks.load("_claude_code_history")


def _forked(src: Path, dst: Path, shift: timedelta) -> str:
    """``src`` continued as a new session (another ``sessionId``) in another folder, ``shift`` later: its first
    request re-sends what ``src``'s first request wrote. Returns the new session id."""
    new_id = "f0f0f0f0-0000-4000-8000-000000000001"
    out = []
    first_request = None
    for line in src.read_text(encoding="utf-8").splitlines():
        obj = json.loads(line)
        if "sessionId" in obj:
            obj["sessionId"] = new_id
        first_request = first_request or obj.get("requestId")
        usage = (obj.get("message") or {}).get("usage") if isinstance(obj.get("message"), dict) else None
        if usage and obj.get("requestId") == first_request:  # as the API measured it: a read of the original's
            read = usage["cache_creation_input_tokens"] - 60  # all but the last message's tail
            usage.update(cache_read_input_tokens=read, cache_creation_input_tokens=60,
                         cache_creation={"ephemeral_5m_input_tokens": 60, "ephemeral_1h_input_tokens": 0})
        if isinstance(obj.get("requestId"), str):
            obj["requestId"] += "-fork"
        if isinstance(obj.get("timestamp"), str) and "T" in obj["timestamp"]:
            at = pd.Timestamp(obj["timestamp"]) + shift
            obj["timestamp"] = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        out.append(json.dumps(obj))
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("\n".join(out) + "\n", encoding="utf-8")
    return new_id


def _both_ways(tmp: Path, folder: Path, *, account: str) -> tuple[pc.Lab, pc.Lab]:
    """``folder`` imported into a store and into a fleet dataset, as the one account ``account``."""
    store = pc.Lab(tmp / "store.duckdb", progress=False)
    store.import_log(folder, account=account, deep=True)
    fleet.import_logs([folder], out=tmp / "fleet", account={folder: account}, progress=False)
    return store, fleet.open(tmp / "fleet", progress=False)


def _rows(lab: pc.Lab, table: str, drop: tuple[str, ...] = ()) -> list[str]:
    df = lab.sql(f"SELECT * FROM {table}").drop(columns=list(drop))
    return sorted("\x1f".join(map(repr, row)) for row in df.itertuples(index=False))


def _assert_same_columns(store: pc.Lab, ds: pc.Lab) -> None:
    # every turns column, measured and simulated; sessions but their project (the fleet keeps each folder's)
    assert _rows(store, "turns") == _rows(ds, "turns")
    assert _rows(store, "sessions", ("project_id",)) == _rows(ds, "sessions", ("project_id",))


def test_the_shipped_logs_store_the_same_columns_through_the_store_and_the_fleet(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    shutil.copytree(FIXTURES / "claude_code", folder / "claude_code")
    shutil.copytree(FIXTURES / "codex", folder / "codex")
    shutil.copytree(FIXTURES / "exchanges", folder / "exchanges")
    store, ds = _both_ways(tmp_path, folder, account="acme")
    assert store.sql("SELECT count(*) AS n FROM turns").n[0] > 20
    _assert_same_columns(store, ds)
    configs = [json.loads(c) for c in store.sql("SELECT config FROM sessions").config]
    assert {(c["cache_scope"], c["account"]) for c in configs} == {("account", "acme")}


def test_a_generated_multi_folder_history_shares_one_cache_per_account(tmp_path: Path) -> None:
    history = _history_module()
    folder = tmp_path / "projects"
    history.write_history(folder, projects=3, sessions=2, requests=5, seed=3, tool_result_lines=20)
    first = sorted(folder.iterdir())[0]
    original = sorted(first.glob("*.jsonl"))[0]
    # the same conversation resumed as a new session in another project folder, 40 s later
    fork = _forked(original, folder / "-home-dev-zz-fork" / "fork.jsonl", timedelta(seconds=40))
    store, ds = _both_ways(tmp_path, folder, account="acme")
    _assert_same_columns(store, ds)
    sid = {r["id"]: r for r in store.sql("SELECT id, config FROM sessions").to_dict("records")}
    by_key = {json.loads(r["config"])["session_key"]: i for i, r in sid.items()}
    original_key = next(json.loads(line)["sessionId"] for line in original.read_text().splitlines()
                        if "sessionId" in line)
    forked_sid, original_sid = by_key[fork], by_key[original_key]
    t = store.sql("SELECT cache_detail, explanation FROM turns WHERE session_id = ? AND idx = 0", [forked_sid])
    detail = json.loads(t.cache_detail[0])
    # its first request read what the original session, in another folder, wrote: named, with the simulated read
    assert detail["read_from_session"] == original_sid
    assert detail["predicted_usage"]["cache_read_input_tokens"] > 0
    assert f"written by session {original_sid}" in t.explanation[0]
    # per session, its first read and who wrote it: the same through either door
    shared = pc.analysis.shared_reads(store)
    assert shared.equals(pc.analysis.shared_reads(ds)) and len(shared) == len(sid)
    row = shared.set_index("session").loc[forked_sid]
    assert (row.read, row.read_from_session, row.likely_writer, row.explained_by) == (
        14_000, original_sid, original_sid, "simulation")
    assert set(shared.explained_by) == {"simulation", "no read"}  # the generated sessions start cold
    # two accounts: the fork's first request reads nothing of the original's
    apart = pc.Lab(tmp_path / "apart.duckdb", progress=False)
    apart.import_log([p for p in sorted(folder.iterdir()) if p.name != "-home-dev-zz-fork"], account="a", deep=True)
    apart.import_log(folder / "-home-dev-zz-fork", account="b", deep=True)
    alone = json.loads(apart.sql("SELECT cache_detail FROM turns WHERE session_id = ? AND idx = 0",
                                 [forked_sid]).cache_detail[0])
    assert "read_from_session" not in alone and alone["predicted_usage"]["cache_read_input_tokens"] == 0
    # the fleet's default is one account per path passed: the same partition, the same columns
    fleet.import_logs([p for p in sorted(folder.iterdir()) if p.name != "-home-dev-zz-fork"]
                      + [folder / "-home-dev-zz-fork"], out=tmp_path / "fleet2",
                      account=lambda p: "b" if p.name == "-home-dev-zz-fork" else "a", progress=False)
    got = fleet.open(tmp_path / "fleet2", progress=False)
    assert _rows(got, "turns") == _rows(apart, "turns")


def test_a_rebuild_that_read_another_sessions_entry_names_it() -> None:
    with pc.Lab(progress=False) as lab:
        parent = lab.session(project="billing", cache_scope="account", start=T0)
        for n in (1, 3, 5, 7):
            parent.record(body(HISTORY[:n]), at=T0 + timedelta(seconds=20 * n))
        child = lab.session(project="other", cache_scope="account", start=T0)
        first = child.record(body(HISTORY), at=T0 + timedelta(seconds=150))
        assert first.cache_detail["read_from_session"] == parent.id  # another project, the same account
        changed = [*HISTORY[:3], "Question 3, reworded.", *HISTORY[4:]]
        child.record(body(changed), at=T0 + timedelta(seconds=160))  # read only the system prompt, the parent's
        rows = pc.rebuilds(child)
        assert list(rows.read_from_session) == [parent.id] and rows.cause.iloc[0]
        assert "read_from_session" in pc.rebuilds(lab).columns


def test_the_account_a_log_names_is_kept_and_a_bad_account_is_refused(tmp_path: Path) -> None:
    with pc.Lab(progress=False) as lab:
        lab.import_log(FIXTURES / "vcr", account="acme", deep=True)
        rows = lab.sql("SELECT source, config FROM sessions").to_dict("records")
        accounts = {Path(r["source"]).name: json.loads(r["config"])["account"] for r in rows}
        # the cassette whose responses name their organisation (openai-organization) keeps it; the others take
        # the import's
        assert accounts.pop("test_oncall_checkout_latency.yaml") == "northwind-payments"
        assert accounts and set(accounts.values()) == {"acme"}
        with pytest.raises(PromptCacheError, match="account"):
            lab.import_log(FIXTURES / "codex", account=" ", deep=True)
    with pytest.raises(PromptCacheError, match="no account for"):
        fleet.import_logs([FIXTURES / "codex"], out=tmp_path / "out", account={"elsewhere": "x"}, progress=False)


def test_cli_import_takes_an_account(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "x.duckdb"
    assert main(["import", str(FIXTURES / "codex"), "--db", str(db), "--account", "team-7", "--quiet"]) == 0
    with pc.Lab(db, progress=False) as lab:
        configs = [json.loads(c) for c in lab.sql("SELECT config FROM sessions").config]
    assert configs and {c["account"] for c in configs} == {"team-7"}


def test_sessions_whose_clients_keep_other_ttls_share_one_cache(tmp_path: Path) -> None:
    # the shipped Claude Code example: two conversations whose clients marked other TTLs (client_ttls, read from
    # the measured 5m/1h split); the second, 45 min after the first, reads the 1h system prompt the first wrote
    folder = tmp_path / "cc"
    shutil.copytree(pc.data_path("logs") / "claude_code", folder)
    with pc.Lab(progress=False) as lab:
        lab.import_log(folder, deep=True)
        rows = lab.sql("SELECT id, config FROM sessions").to_dict("records")
        ttls = {json.dumps(json.loads(r["config"])["cache_params"].get("client_ttls")) for r in rows}
        assert len(ttls) > 1  # the sessions' own TTLs differ: still one cache
        shared = pc.analysis.shared_reads(lab).set_index("session")
        kinds = {r["id"]: json.loads(r["config"]).get("session_kind") for r in rows}
        read = shared[shared.read_from_session.notna()]
        # the second conversation, and the compaction call rebuilt from its parent's history, read another's entry
        assert sorted(kinds[s] for s in read.index) == ["compaction", "main"]
        row = read.loc[next(s for s in read.index if kinds[s] == "main")]
        # the simulated account cache reads what the API measured, from the session that wrote it
        assert row.simulated_read == row.read > 10_000 and row.read_from_session == row.likely_writer
        # each session's own TTLs stay its own: the writer's entries keep their 1h lifetime
        assert json.loads(lab.sql("SELECT config FROM sessions WHERE id = ?", [row.read_from_session])
                          .config[0])["cache_params"]["client_ttls"] != json.loads(
            lab.sql("SELECT config FROM sessions WHERE id = ?", [row.name]).config[0])["cache_params"].get(
                "client_ttls")


def test_fidelity_says_which_session_wrote_what_a_first_request_read() -> None:
    """A compaction call re-sends its parent's conversation and reads the parent's entry: the replay reproduces that
    read (beside the parent, in the account's cache) though no saving is claimed on the call, so its first read is
    explained and names the parent; a session's read no session of the set could have written is not explained."""
    with pc.Lab(progress=False) as lab:
        lab.import_log(pc.data_path("logs") / "claude_code", progress=False)
        fid = pc.fidelity(lab).set_index("session")
        kinds = {sid: lab.store.session_row(sid)["config"].get("session_kind") for sid in fid.index}
    (compaction,) = [sid for sid, kind in kinds.items() if kind == "compaction"]
    row = fid.loc[compaction]
    assert row.history_missing == 1 and row.first_read_tokens > 10_000
    assert row.first_read_explained is True
    assert kinds[row.first_read_from] == "main" and row.first_read_from in row.shared_with
    # a session that read nothing on its first request has nothing to explain
    cold = fid[fid.first_read_tokens == 0]
    assert len(cold) and cold.first_read_explained.isna().all() and cold.first_read_from.isna().all()


REALDATA = Path(__file__).resolve().parents[2] / "shared" / "realdata"


@pytest.mark.slow
@pytest.mark.skipif(not (REALDATA / "claude-code-spotter").is_dir(), reason="../shared/realdata is not on this machine")
def test_first_reads_on_real_claude_code_logs_are_explained_exactly_when_a_session_of_the_set_wrote_them() -> None:
    """By hand, from the measured timestamps: a first request's read can come from the set only if another session
    of it sent a request within the longest TTL (1 hour) before; every session the fidelity says "no" of has none,
    and every "yes" names a session that did."""
    with pc.Lab(progress=False) as lab:
        lab.import_log(_benchmarks.load("advice_fidelity").plain(REALDATA / "claude-code-spotter"), progress=False)
        fid = pc.fidelity(lab).set_index("session")
        times = {sid: lab.session(id=sid).turns().sent_at for sid in fid.index}
    hour = pd.Timedelta(hours=1)

    def writers_before(sid: str) -> set[str]:
        first = times[sid].min()
        return {o for o, t in times.items() if o != sid and ((t < first) & (t >= first - hour)).any()}

    said = fid[fid.first_read_explained.notna()]
    assert len(said) == 4
    for sid, row in said.iterrows():
        if row.first_read_explained:
            assert row.first_read_from in writers_before(str(sid)), sid
        else:
            assert not writers_before(str(sid)), (sid, writers_before(str(sid)))
    assert said.first_read_explained.tolist().count(True) == 2  # the two compaction calls read their parents'
