"""lab.import_log loses nothing and stores nothing twice: late proxy lines, path spellings, compressed logs, every
file of a walk accounted for, mixed-format files, bad values costing one line, lost calibrations coming back."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import random
import shutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb.errors import ImportFormatError
from promptcache_nb.readers import detect

T0 = datetime(2026, 3, 9, 14, 0, tzinfo=UTC)
SYSTEM = [{"type": "text", "text": "You triage incoming payment-failure tickets for the Ledgerly billing team. "
           "Read the ticket, look up the charge, and answer with the next action in two sentences. " * 12,
           "cache_control": {"type": "ephemeral"}}]


def call(i: int, *, user: str = "ops-bot", started: datetime | None = None, request_id: str | None = None,
         usage: dict | None = None) -> dict:
    """Call ``i`` of a conversation, as the recording proxy writes it (``at`` is when the call *started*)."""
    messages = []
    for j in range(i + 1):
        messages.append({"role": "user", "content": f"Ticket #{4100 + j}: card declined twice for invoice {8800 + j}."})
        if j < i:
            messages.append({"role": "assistant", "content": f"Ticket #{4100 + j}: retry after the issuer's hold."})
    body = {"model": "claude-sonnet-4-5", "max_tokens": 400, "system": SYSTEM, "messages": messages,
            "metadata": {"user_id": user}}
    read = 0 if i == 0 else 1900 + 30 * (i - 1)
    usage = usage or {"input_tokens": 4, "cache_read_input_tokens": read,
                      "cache_creation_input_tokens": 1900 + 30 * i - read,
                      "cache_creation": {"ephemeral_5m_input_tokens": 1900 + 30 * i - read,
                                         "ephemeral_1h_input_tokens": 0},
                      "output_tokens": 60 + i}
    at = started or T0 + timedelta(seconds=20 * i)
    rid = request_id if request_id is not None else f"req_011Tri{user}{i:04d}"
    return {"v": 1, "at": at.isoformat().replace("+00:00", "Z"), "method": "POST",
            "url": "https://api.anthropic.com/v1/messages", "path": "/v1/messages", "status": 200,
            "request": body,
            "response": {"id": f"msg_01Tri{user}{i:04d}", "type": "message", "role": "assistant",
                         "model": "claude-sonnet-4-5", "content": [{"type": "text", "text": "Retry after the hold."}],
                         "stop_reason": "end_turn", "usage": usage},
            "usage": usage, "request_id": rid, "latency_ms": 1500, "provider": "anthropic"}


def lines(calls: list[dict]) -> str:
    return "".join(json.dumps(c) + "\n" for c in calls)


def stored(lab: pc.Lab) -> list[tuple]:
    return [tuple(r) for r in lab.sql(
        "SELECT session_id, request_id, sent_at, cache_read_input_tokens, cache_creation_input_tokens FROM turns "
        "ORDER BY session_id, idx").itertuples(index=False)]


def test_growing_proxy_log_written_out_of_order_ends_with_exactly_its_requests(tmp_path: Path) -> None:
    """Calls overlap: each line is written when its call completes but stamped when it started, so a line can
    start before one already imported. Re-importing while the log grows loses none of them (the old rule
    skipped such a call for good as 'older than the session's last stored request')."""
    rng = random.Random(7)
    calls = []
    for user in ("ops-bot", "refund-bot"):
        for i in range(12):
            started = T0 + timedelta(seconds=20 * i + rng.uniform(0, 5))
            calls.append((started + timedelta(seconds=rng.uniform(1, 70)), call(i, user=user, started=started)))
    calls.sort(key=lambda c: c[0])  # the order a proxy completes them in
    written = [c for _, c in calls]
    assert any(json.loads(json.dumps(a))["at"] > b["at"] for a, b in zip(written, written[1:], strict=False)), \
        "the fixture must have lines out of time order"
    log = tmp_path / "proxy.jsonl"
    with pc.Lab(tmp_path / "runs.duckdb", progress=False) as lab:
        text = lines(written)
        cut = 0
        for n in (3, 7, 8, 13, 19, 24):
            end = len(lines(written[:n]))
            # a proxy mid-write: the next line is half there, left for the next import
            log.write_text(text[:end] + text[end:end + 40], encoding="utf-8")
            res = lab.import_log(log)
            assert res.skipped.empty, res.skipped
            cut = n
        assert cut == len(written)
        log.write_text(text, encoding="utf-8")
        res = lab.import_log(log)
        assert res.requests == 0 and res.already_stored == 24
        grown = stored(lab)
    with pc.Lab(tmp_path / "once.duckdb", progress=False) as lab:
        lab.import_log(log)
        once = stored(lab)
    assert len(grown) == 24
    assert grown == once  # the same requests, each session in time order


def test_late_request_whose_session_came_from_other_files_is_listed_not_lost(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(lines([call(i, user="u") for i in range(3)]), encoding="utf-8")
    with pc.Lab(None, progress=False) as lab:
        lab.import_log(a)
        # the same log, now holding only a call that started before the stored ones
        a.write_text(lines([call(5, user="u", started=T0 - timedelta(minutes=5))]), encoding="utf-8")
        res = lab.import_log(a)
        assert res.requests == 0
        assert list(res.skipped.line) == [1]
        assert "started before the session's last stored request" in res.skipped.reason[0]
        b.touch()


def test_one_log_reached_through_several_spellings_is_stored_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                     ) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    log = folder / "x.jsonl"
    log.write_text(lines([call(i) for i in range(3)]), encoding="utf-8")
    (tmp_path / "link.jsonl").symlink_to(log)
    os.link(log, tmp_path / "hard.jsonl")
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    with pc.Lab(None, progress=False) as lab:
        first = lab.import_log(Path("../logs/x.jsonl"))
        assert first.requests == 3
        for spelling in (log, Path("../logs/./x.jsonl"), tmp_path / "link.jsonl", [log, tmp_path / "link.jsonl"]):
            again = lab.import_log(spelling)
            assert again.requests == 0 and again.already_stored == 3
        assert int(lab.sql("SELECT count(*) AS n FROM turns").n[0]) == 3
        both = lab.import_log([tmp_path / "hard.jsonl", log])  # one file, two names: read once
        assert len(both.files) == 1


def _compress(src: Path, dst: Path, kind: str) -> Path:
    data = src.read_bytes()
    if kind == "gz":
        dst.write_bytes(gzip.compress(data))
    elif kind == "bz2":
        dst.write_bytes(bz2.compress(data))
    elif kind == "xz":
        dst.write_bytes(lzma.compress(data))
    else:
        zstandard = pytest.importorskip("zstandard", reason="the zstandard package is a dev dependency")
        dst.write_bytes(zstandard.ZstdCompressor().compress(data))
    return dst


@pytest.mark.parametrize("kind", ["gz", "bz2", "xz", "zst"])
def test_compressed_logs_read_by_name_and_in_walks(tmp_path: Path, kind: str) -> None:
    cc = pc.data_path("logs") / "claude_code" / "-home-dev-billing-service"
    plain = tmp_path / "plain"
    shutil.copytree(cc, plain)
    packed = tmp_path / "packed"
    shutil.copytree(cc, packed)
    for f in list(packed.rglob("*.jsonl")):
        _compress(f, f.with_name(f.name + "." + kind), kind)
        f.unlink()
    with pc.Lab(None, progress=False) as lab:
        want = lab.import_log(plain)
        want_counts = sorted(want.summary().requests)
    with pc.Lab(None, progress=False) as lab:
        got = lab.import_log(packed)
        assert got.requests == want.requests > 0
        assert sorted(got.summary().requests) == want_counts
        assert got.skipped.reason.tolist() == want.skipped.reason.tolist()
        main = next(packed.glob("*.jsonl." + kind))
        assert detect(main).name == "claude-code"
    with pc.Lab(None, progress=False) as lab:
        named = lab.import_log(next(packed.glob("*.jsonl." + kind)))
        assert named.requests > 0


def test_zst_without_zstandard_is_a_clear_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd not really")
    monkeypatch.setitem(sys.modules, "zstandard", None)  # as if it were not installed
    with pc.Lab(None, progress=False) as lab:
        res = lab.import_log(tmp_path)
        assert res.skipped.reason.tolist() == [
            "cannot read (a zstd-compressed log needs the zstandard package (pip install zstandard))"]
        with pytest.raises(ImportFormatError, match="needs the zstandard package"):
            lab.import_log(tmp_path / "a.jsonl.zst")


def test_corrupt_archive_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.jsonl.gz"
    bad.write_bytes(gzip.compress(lines([call(0)]).encode())[:40])
    with pc.Lab(None, progress=False) as lab:
        with pytest.raises(ImportFormatError) as info:
            lab.import_log(bad)
        assert str(bad) in str(info.value) and "\n" not in str(info.value)
        res = lab.import_log(tmp_path)
        assert len(res.skipped) == 1 and res.requests == 0


def test_a_walk_accounts_for_every_file(tmp_path: Path) -> None:
    (tmp_path / "proxy.jsonl").write_text(lines([call(0)]), encoding="utf-8")
    (tmp_path / "NOTES.md").write_text("# what I was doing\n", encoding="utf-8")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "old.jsonl").write_text(lines([call(1)]), encoding="utf-8")
    (tmp_path / "settings.json").write_text('{"theme": "dark"}\n', encoding="utf-8")
    with pc.Lab(None, progress=False) as lab:
        res = lab.import_log(tmp_path)
    assert res.requests == 1
    reasons = {Path(f).name: r for f, r in zip(res.skipped.file, res.skipped.reason, strict=True)}
    assert set(reasons) == {"NOTES.md", "old.jsonl", "settings.json"}
    assert reasons["NOTES.md"].startswith("not a log file name")
    assert reasons["old.jsonl"].startswith("hidden file")
    assert reasons["settings.json"] == "not a known log format"


def test_a_fifo_is_refused_in_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with pc.Lab(None, progress=False) as lab, pytest.raises(ImportFormatError, match="not a regular file"):
        lab.import_log(fifo)


def test_detection_reads_past_the_first_64_kib(tmp_path: Path) -> None:
    """A cassette whose first request body is 250 KB names its ``uri`` only after 64 KiB."""
    src = pc.data_path("logs") / "vcr" / "test_triage_month_end_ticket.yaml"
    text = src.read_text(encoding="utf-8")
    # vcr writes the request body before its uri: pad the first body's text
    first_body = text.index("body:")
    padded = text[:first_body] + "# " + "x" * 250_000 + "\n" + text[first_body:]
    big = tmp_path / "big.yaml"
    big.write_text(padded, encoding="utf-8")
    assert "uri:" not in padded[: 64 * 1024]
    assert detect(big).name == "vcr"


def test_bad_values_cost_one_line(tmp_path: Path) -> None:
    good = [call(i) for i in range(4)]
    bad_usage = call(4)
    bad_usage["usage"] = bad_usage["response"]["usage"] = {**bad_usage["usage"], "cache_read_input_tokens": -1}
    huge = call(5)
    huge["usage"] = huge["response"]["usage"] = {**huge["usage"], "output_tokens": 10**15}
    surrogate = json.dumps(call(2, user="other")).replace("card declined", "card \\ud800 declined", 1)
    text = lines(good[:2]) + surrogate + "\n" + lines(good[2:])
    text += lines([bad_usage, huge]) + "[" * 5000 + "]" * 5000 + "\n"
    log = tmp_path / "proxy.jsonl"
    log.write_text(text, encoding="utf-8")
    with pc.Lab(None, progress=False) as lab:
        res = lab.import_log(log, deep=True)
    assert res.requests == 4
    by_line = dict(zip(res.skipped.line, res.skipped.reason, strict=True))
    assert set(by_line) == {3, 6, 7, 8}, by_line
    assert "surrogate" in by_line[3]
    assert "cache_read_input_tokens" in by_line[6]
    assert "output_tokens" in by_line[7]
    assert "nested too deep" in by_line[8]


def test_undecodable_file_name_imports_with_an_escaped_name(tmp_path: Path) -> None:
    name = os.fsdecode(b"caf\xe9-proxy.jsonl")  # Latin-1 bytes: not UTF-8
    try:
        (tmp_path / name).write_text(lines([call(i) for i in range(2)]), encoding="utf-8")
    except (UnicodeEncodeError, OSError):
        pytest.skip("this file system refuses non-UTF-8 names")
    with pc.Lab(tmp_path / "runs.duckdb", progress=False) as lab:
        res = lab.import_log(tmp_path, deep=True)
        assert res.requests == 2
        assert "caf\\xe9-proxy.jsonl" in res.sessions[0].source
        again = lab.import_log(tmp_path, deep=True)
        assert again.requests == 0 and again.already_stored == 2


def test_a_calibration_lost_to_a_kill_comes_back_on_reimport(tmp_path: Path) -> None:
    log = tmp_path / "proxy.jsonl"
    # 24 calls: an import saves no calibration fitted on fewer than MIN_REQUESTS (analysis/calibrate.py)
    log.write_text(lines([call(i) for i in range(24)]), encoding="utf-8")
    with pc.Lab(tmp_path / "runs.duckdb", progress=False) as lab:
        first = lab.import_log(log, deep=True)
        assert bool(first.calibrations.saved.any())
        saved = lab.store.saved_calibrations()
        # as if the process died after the sessions committed, before the calibration was written
        with lab.store.transaction():
            lab.store.con.execute("DELETE FROM calibrations").fetchall()
        assert lab.store.saved_calibrations() == []
        again = lab.import_log(log, deep=True)
        assert again.requests == 0
        assert lab.store.saved_calibrations() == saved


def _shipped_line_logs() -> list[Path]:
    logs = pc.data_path("logs")
    return sorted(p for p in logs.rglob("*.jsonl") if "subagents" not in p.parts)


@pytest.mark.parametrize("src", _shipped_line_logs(), ids=lambda p: p.name[:40])
def test_every_shipped_log_reimported_while_it_grows_ends_with_exactly_its_requests(tmp_path: Path, src: Path
                                                                                     ) -> None:
    """Lines arrive a few at a time (the proxy's out of order, as it writes them when calls complete), a last
    line is often half-written, and the log is imported after each step: the store ends as one import of the
    whole file would leave it."""
    raw = src.read_bytes().splitlines(keepends=True)
    if "exchanges" in src.parts:  # a proxy completes calls out of start order
        raw = raw[1::2] + raw[0::2]
    rng = random.Random(src.name)
    grown = tmp_path / src.name
    columns = ("session_id, dedupe_key, sent_at, input_tokens, cache_read_input_tokens, "
               "cache_creation_input_tokens, output_tokens")
    with pc.Lab(tmp_path / "grown.duckdb", progress=False) as lab:
        done = 0
        while done < len(raw):
            done = min(len(raw), done + rng.randint(1, 4))
            half = raw[done][: len(raw[done]) // 2] if done < len(raw) else b""
            grown.write_bytes(b"".join(raw[:done]) + half)
            lab.import_log(grown)
        got = lab.sql(f"SELECT {columns} FROM turns ORDER BY session_id, idx")
    with pc.Lab(tmp_path / "once.duckdb", progress=False) as lab:
        lab.import_log(grown)
        want = lab.sql(f"SELECT {columns} FROM turns ORDER BY session_id, idx")
    assert len(want) > 0
    assert got.to_dict("records") == want.to_dict("records")


def test_a_write_without_its_ttl_split_is_stored_unknown_and_listed(tmp_path: Path) -> None:
    first = call(0)
    unsplit = {k: v for k, v in first["usage"].items() if k != "cache_creation"}  # Bedrock, older APIs
    first["usage"] = first["response"]["usage"] = unsplit
    big = call(1, usage={"input_tokens": 4, "cache_read_input_tokens": 3_000_000_000,
                         "cache_creation_input_tokens": 30,
                         "cache_creation": {"ephemeral_5m_input_tokens": 30, "ephemeral_1h_input_tokens": 0},
                         "output_tokens": 61})
    log = tmp_path / "proxy.jsonl"
    log.write_text(lines([first, big]), encoding="utf-8")
    with pc.Lab(tmp_path / "runs.duckdb", progress=False) as lab:
        with pytest.warns(pc.errors.ContextWindowWarning, match="3,000,000,034 measured input tokens"):
            res = lab.import_log(log, deep=True)
        assert res.requests == 2 and res.skipped.empty
        assert list(res.notes.line) == [1] and "5-minute" in res.notes.note[0]
        assert "1 with notes" in repr(res)
        df = res.sessions[0].turns()
        assert df.cache_creation_5m_input_tokens.isna()[0] and df.cache_creation_1h_input_tokens.isna()[0]
        assert int(df.cache_creation_input_tokens[0]) == 1900
        assert int(df.cache_read_input_tokens[1]) == 3_000_000_000  # past INT32: stored exactly (BIGINT)


def test_a_proxy_logs_latency_is_stored_with_each_request(tmp_path: Path) -> None:
    calls = [call(i) for i in range(3)]
    calls[1]["latency_ms"] = 2150.5
    calls[2]["latency_ms"] = None  # a call the proxy could not time
    log = tmp_path / "proxy.jsonl"
    log.write_text(lines(calls), encoding="utf-8")
    with pc.Lab(None, progress=False) as lab:
        res = lab.import_log(log)
        df = res.sessions[0].turns()
        assert df.latency_ms[0] == 1500 and df.latency_ms[1] == 2150.5 and df.latency_ms.isna()[2]
    with pc.Lab(None, progress=False) as lab:  # a simulated request is never timed
        s = lab.session(strategy="naive")
        s.step("hello")
        assert s.turns().latency_ms.isna().all()
