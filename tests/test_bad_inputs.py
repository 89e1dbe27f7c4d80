"""The bad-input corpus (issue 15): every malformed input is one clean line, never a traceback, a hang or a change.

Data-driven by folder: ``tests/bad_inputs/<kind>/expected.yaml`` maps each case file to a substring of the
error it must raise; ``{make: NAME, expect: ...}`` cases are built at run time (binary files, symbolic links), and
``xfail: why`` marks a case still handled wrongly (strict: fixing it turns the run red until the mark goes).
A new kind of input is a new folder plus one entry in ``KINDS``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest
import yaml

import promptcache_nb as pc
from promptcache_nb.errors import BodyValidationError

CORPUS = Path(__file__).resolve().parent / "bad_inputs"
REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "data" / "scenarios" / "tiny.yaml"
GOOD_TURNS = "turns:\n  - user: hi\n    reply: yo\n"


# -- builders of run-time cases ----------------------------------------------------------------------------
def _sqlite(path: Path) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
    con.execute("INSERT INTO orders VALUES (1, 9.99)")
    con.commit()
    con.close()


def _duckdb(path: Path, *statements: str) -> None:
    con = duckdb.connect(str(path))
    for sql in statements:
        con.execute(sql)
    con.close()


def _store(path: Path) -> bytes:
    with pc.Lab(path, progress=False) as lab:
        lab.replay(TINY)
    return path.read_bytes()


def _truncated(path: Path) -> None:
    data = _store(path)
    path.write_bytes(data[: 3 * 4096 + 1024])  # the headers survive, the blocks do not


def _corrupt(path: Path) -> None:
    data = _store(path)
    # every block after the three 4 KiB headers overwritten: each block's checksum fails
    path.write_bytes(data[: 3 * 4096] + bytes([0xAB]) * (len(data) - 3 * 4096))


def _symlink_outside(folder: Path) -> Path:
    outside = folder / "outside.md"
    outside.write_text("secret\n")
    (folder / "scenario").mkdir()
    os.symlink(outside, folder / "scenario" / "prompt.md")
    sc = folder / "scenario" / "symlink_outside.yaml"
    sc.write_text("model: claude-sonnet-4-5\nhost_prompt_file: prompt.md\n" + GOOD_TURNS)
    return sc


def _tools_symlink_outside(folder: Path) -> Path:
    outside = folder / "tools.yaml"
    outside.write_text("- name: search\n")
    (folder / "scenario").mkdir()
    os.symlink(outside, folder / "scenario" / "tools.yaml")
    sc = folder / "scenario" / "tools_file_symlink_outside.yaml"
    sc.write_text("model: claude-sonnet-4-5\nhost_prompt: You help.\ntools_file: tools.yaml\n" + GOOD_TURNS)
    return sc


def _in(folder: Path, name: str, build: Callable[[Path], object]) -> Path:
    build(folder / name)
    return folder / name


MAKERS: dict[str, Callable[[Path, str], Path]] = {
    "sqlite": lambda d, n: _in(d, n, _sqlite),
    "foreign_duckdb": lambda d, n: _in(d, n, lambda p: _duckdb(
        p, "CREATE TABLE orders (id INT)", "CREATE TABLE customers (id INT)", "CREATE TABLE items (id INT)")),
    "foreign_name_clash": lambda d, n: _in(d, n, lambda p: _duckdb(p, "CREATE TABLE sessions (who TEXT)")),
    "foreign_view": lambda d, n: _in(d, n, lambda p: _duckdb(
        p, "CREATE SCHEMA report", "CREATE VIEW report.summary AS SELECT 42 AS answer")),
    "truncated_store": lambda d, n: _in(d, n, _truncated),
    "corrupt_store": lambda d, n: _in(d, n, _corrupt),
    "empty_file": lambda d, n: _in(d, n, lambda p: p.write_bytes(b"")),
    "csv_file": lambda d, n: _in(d, n, lambda p: p.write_text("id,total\n1,9.99\n2,14.50\n")),
    "directory": lambda d, n: _in(d, n, lambda p: p.mkdir()),
    "fifo": lambda d, n: _in(d, n, os.mkfifo),  # reading one would block forever
    "missing": lambda d, n: d / n,
    "symlink_outside": lambda d, n: _symlink_outside(d),
    "tools_symlink_outside": lambda d, n: _tools_symlink_outside(d),
}


# -- how each kind of input is loaded ----------------------------------------------------------------------
def _load_scenario(path: Path, case: dict) -> None:
    pc.load_scenario(path)


def _files_state(path: Path) -> dict[str, str]:
    """Every file beside (and under) the store, with a digest: opening a bad store must change none."""
    out = {}
    for p in sorted(path.parent.rglob("*")):
        if p.is_file():
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _open_store(path: Path, case: dict) -> None:
    before = _files_state(path)
    try:
        with pc.Lab(path, progress=False, read_only=case.get("read_only", False)) as lab:
            for sid in lab.sessions().id:  # a store that opens must also read back without raw errors
                s = lab.session(id=sid)
                s.turns()
                for i in range(s.n_turns):
                    s.turn(i)
    finally:
        assert _files_state(path) == before, "a refused store was modified"
        assert not Path(str(path) + ".wal").exists()


_SERVER: list[pc.SimulatorServer] = []


def _server() -> pc.SimulatorServer:
    """One simulator endpoint for the whole corpus; a small body limit keeps the over-the-limit case small."""
    if not _SERVER:
        _SERVER.append(pc.SimulatorServer(max_body_bytes=64 * 1024, request_timeout=2).start())
        atexit.register(_SERVER[0].stop)
    return _SERVER[0]


def _exchange(data: bytes) -> tuple[int | None, bytes]:
    """Send raw bytes to the corpus server; (status, body) of its answer, read until it closes."""
    host, port = _server().base_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status_line, _, rest = reply.partition(b"\r\n")
    parts = status_line.split()
    status = int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/") else None
    return status, rest.partition(b"\r\n\r\n")[2]


def _send_request(path: Path, case: dict) -> None:
    """The raw request in ``path`` gets ``case["status"]`` and a one-line error (raised as an APIError naming the
    file, as a client would show it); a good request right after it is still answered."""
    head, _, body = path.read_bytes().partition(b"\n\n")
    lines = head.split(b"\n")
    names = {line.split(b":", 1)[0].strip().lower() for line in lines[1:]}
    if b"host" not in names:
        lines.append(b"Host: 127.0.0.1")
    if b"content-length" not in names and body:
        lines.append(b"Content-Length: %d" % len(body))
    lines.append(b"Connection: close")
    status, payload = _exchange(b"\r\n".join(lines) + b"\r\n\r\n" + body)
    good = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    after, _ = _exchange(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: k\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(good), good.encode()))
    assert after == 200, f"the server stopped answering after {path.name} ({after})"
    assert status == case["status"], f"{path.name}: status {status}, expected {case['status']}: {payload[:200]!r}"
    try:
        error = json.loads(payload)["error"]
        text, kind = error["message"], error["type"]
    except (ValueError, KeyError, TypeError):  # the HTTP layer's own answer to bad framing: plain text
        text, kind = payload.decode("utf-8", "replace").strip(), "invalid_request_error"
    raise pc.errors.APIError(f"{path.name}: {text}", status_code=status, error_type=kind)


T0 = datetime(2025, 1, 1, 9, tzinfo=UTC)


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


#: Values no JSON file can hold, put into a body case (``inject:`` in bodies/expected.yaml).
INJECTIONS: dict[str, Callable[[dict], None]] = {
    "datetime": lambda body: body.update(metadata={"user_id": "u-1", "when": T0}),
    "int_key": lambda body: body.update(metadata={1: "one"}),
    "deep_5000": lambda body: body.update(metadata={"nested": _nested(5000)}),
}


def _record_body(path: Path, case: dict) -> None:
    """``Session.record`` of the body in ``path`` (with the case's ``dialect``, ``usage`` and ``at``) is refused
    with a one-line SessionError naming the file and the field, and stores nothing."""
    body = json.loads(path.read_text(encoding="utf-8"))
    if "inject" in case:
        INJECTIONS[case["inject"]](body)
    with pc.Lab(progress=False) as lab:
        s = lab.session()
        try:
            s.record(body, at=case.get("at", T0), usage=case.get("usage"), dialect=case.get("dialect"))
        except BodyValidationError as exc:
            if exc.source is not None:
                raise
            raise BodyValidationError(exc.problems, request=exc.request, source=path.name) from None
        except pc.errors.SessionError as exc:
            raise pc.errors.SessionError(f"{path.name}: {exc}") from None
        finally:
            assert lab.sql("select count(*) n from turns").n[0] == 0, f"{path.name} was stored"


@dataclass(frozen=True)
class Kind:
    load: Callable[[Path, dict], None]
    error: type[pc.PromptCacheError]


KINDS: dict[str, Kind] = {
    "scenarios": Kind(_load_scenario, pc.errors.ScenarioError),
    "stores": Kind(_open_store, pc.errors.StoreError),
    "server_requests": Kind(_send_request, pc.errors.APIError),
    "bodies": Kind(_record_body, pc.errors.SessionError),
}


def _cases() -> list:
    out = []
    for folder in sorted(p for p in CORPUS.iterdir() if p.is_dir()):
        expected = yaml.safe_load((folder / "expected.yaml").read_text(encoding="utf-8"))
        for name, spec in sorted(expected.items()):
            case = spec if isinstance(spec, dict) else {"expect": spec}
            marks = [pytest.mark.xfail(strict=True, reason=case["xfail"])] if "xfail" in case else []
            out.append(pytest.param(folder.name, name, case, id=f"{folder.name}/{name}", marks=marks))
    return out


CASES = _cases()


def test_corpus_is_complete():
    """Every file of a kind's folder is a listed case or an aid under ``_files/``; every kind has a loader."""
    for folder in (p for p in CORPUS.iterdir() if p.is_dir()):
        assert folder.name in KINDS, f"no loader for tests/bad_inputs/{folder.name}: add it to KINDS"
        listed = set(yaml.safe_load((folder / "expected.yaml").read_text(encoding="utf-8")))
        on_disk = {p.name for p in folder.iterdir() if p.is_file() and p.name != "expected.yaml"}
        assert on_disk <= listed, f"unlisted case files in {folder}: {sorted(on_disk - listed)}"


@pytest.mark.parametrize(("kind", "name", "case"), CASES)
def test_bad_input_is_one_clean_line(kind, name, case, tmp_path):
    spec = KINDS[kind]
    if "make" in case:
        path = MAKERS[case["make"]](tmp_path, name)
    else:
        path = CORPUS / kind / name
        assert path.exists(), f"{path} is listed in expected.yaml but missing"
    with pytest.raises(spec.error) as info:
        spec.load(path, case)
    msg = str(info.value)
    assert isinstance(info.value, pc.PromptCacheError)
    assert "\n" not in msg, msg
    assert path.name in msg, msg
    assert case["expect"] in msg, msg
    assert "Traceback" not in msg


def test_alias_bomb_fails_fast_in_a_fresh_process():
    """The 9-level "billion laughs" (~300 bytes) is refused at its first anchor, not expanded: a regression
    would take minutes and gigabytes, so it runs where a timeout can stop it."""
    bomb = CORPUS / "scenarios" / "alias_bomb.yaml"
    assert bomb.stat().st_size < 400
    code = textwrap.dedent(f"""
        import promptcache_nb as pc
        try:
            pc.load_scenario({str(bomb)!r})
        except pc.errors.ScenarioError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "anchors and aliases" in out.stdout
