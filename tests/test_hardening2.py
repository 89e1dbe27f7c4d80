"""Issue 27 regressions: odd files as the store (FIFO, device), Ctrl-C while a store opens or migrates, numbers
that must be numbers, NUL bytes in scenario files, and invisible fillers shown in diffs.

The proxy's redaction by value is in test_proxy_redaction.py, tampered stores and ``doctor`` in test_doctor.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import duckdb
import pytest

import promptcache_nb as pc
from promptcache_nb.errors import StoreError

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """The CLI in a subprocess with a deadline: on the code before the fix a FIFO hangs forever."""
    return subprocess.run([sys.executable, "-m", "promptcache_nb.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=ENV, timeout=timeout)


def _in_thread(fn, timeout: float = 20):
    """fn() on a daemon thread; a hang fails the test instead of freezing the run."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"still blocked after {timeout} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


# -- 3. store paths that are not regular files -------------------------------------------------------------
@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "store.duckdb"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("read_only", [False, True])
def test_a_fifo_as_the_store_is_refused_in_one_line(fifo, read_only):
    with pytest.raises(StoreError) as exc:
        _in_thread(lambda: pc.Lab(fifo, progress=False, read_only=read_only))
    assert str(exc.value) == (f"cannot open store {str(fifo)!r}: it is a FIFO (named pipe), not a regular file; "
                              "pass the path of a .duckdb file")


def test_a_device_as_the_store_is_refused_untouched():
    with pytest.raises(StoreError, match="it is a character device, not a regular file"):
        _in_thread(lambda: pc.Lab("/dev/zero", progress=False, read_only=True))
    with pytest.raises(StoreError, match="it is a character device"):
        _in_thread(lambda: pc.Lab("/dev/null", progress=False))


def test_a_socket_as_the_store_is_refused(tmp_path):
    import socket

    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(StoreError, match="it is a socket"):
            pc.Lab(path, progress=False)


def test_cli_sql_on_a_fifo_exits_2_with_one_line(fifo):
    res = _cli("sql", str(fifo), "select 1")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "FIFO (named pipe), not a regular file" in res.stderr


@pytest.mark.parametrize("what", ["fifo", "/dev/zero"])
def test_cli_import_names_what_the_path_is(fifo, tmp_path, what):
    path = str(fifo) if what == "fifo" else what
    res = _cli("import", path, "--db", str(tmp_path / "runs.duckdb"), "--quiet")
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "not a regular file" in res.stderr, res.stderr
    assert "no such file" not in res.stderr


# -- 4. Ctrl-C while a store opens or migrates ----------------------------------------------------------------
SLOW_MIGRATION = textwrap.dedent("""
    import sys
    from promptcache_nb.store._migrations import migration

    @migration
    def m999_slow_for_test(con):
        con.execute("CREATE TABLE half_written AS SELECT 1 AS x")
        print("migrating", flush=True)
        con.execute("CREATE TABLE slow AS SELECT sum(i) AS s FROM range(100000000000::BIGINT) t(i)")
""")


def _interrupt(code: str, *, marker: str = "migrating", timeout: float = 20) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=ENV)
    try:
        line = proc.stdout.readline()
        assert marker in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        time.sleep(0.5)  # well inside the slow statement (a signal before it is an ordinary KeyboardInterrupt)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=timeout)  # before the fix: never (DuckDB ignores the signal)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, line + out, err)


def _migrations_of(path: Path) -> tuple[list[str], list[str]]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        names = [r[0] for r in con.execute("SELECT name FROM _migrations ORDER BY applied_order").fetchall()]
        tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
    finally:
        con.close()
    return names, tables


def test_ctrl_c_during_a_migration_exits_130_and_rolls_it_back(tmp_path):
    db = tmp_path / "runs.duckdb"
    code = SLOW_MIGRATION + textwrap.dedent(f"""
        from promptcache_nb.cli import main
        sys.exit(main(["replay", "tiny", "--db", {str(db)!r}, "--quiet"]))
    """)
    res = _interrupt(code)
    assert res.returncode == 130, res.stderr
    assert "Traceback" not in res.stderr and "Query interrupted" not in res.stderr
    names, tables = _migrations_of(db)
    assert "m999_slow_for_test" not in names and "m001_initial" in names
    assert "half_written" not in tables and "slow" not in tables  # the interrupted migration left nothing
    with pc.Lab(db, progress=False) as lab:  # and the store opens (without the test's migration)
        assert lab.sql("SELECT count(*) AS n FROM sessions").n[0] == 0


def test_ctrl_c_during_open_is_a_keyboard_interrupt_and_the_file_is_released(tmp_path):
    db = tmp_path / "runs.duckdb"
    code = SLOW_MIGRATION + textwrap.dedent(f"""
        import promptcache_nb as pc
        try:
            pc.Lab({str(db)!r}, progress=False)
        except BaseException as exc:
            print(type(exc).__name__, flush=True)
        import duckdb
        duckdb.connect({str(db)!r}).close()  # the Store closed its connection: the file opens again
        print("reopened", flush=True)
    """)
    res = _interrupt(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["migrating", "KeyboardInterrupt", "reopened"]


def test_ctrl_c_during_a_long_sql_query_exits_130(tmp_path):
    db = tmp_path / "runs.duckdb"
    pc.Lab(db, progress=False).close()
    code = textwrap.dedent(f"""
        import sys, threading
        from promptcache_nb.cli import main
        threading.Timer(2.0, lambda: print("querying", flush=True)).start()
        sys.exit(main(["sql", {str(db)!r}, "SELECT sum(i) AS s FROM range(100000000000::BIGINT) t(i)"]))
    """)
    res = _interrupt(code, marker="querying")
    assert res.returncode == 130, res.stderr
    assert "Traceback" not in res.stderr


def test_interruptible_restores_the_previous_wakeup_fd_and_forwards_to_it():
    """asyncio (a notebook kernel) reads signals from the wakeup fd: it must see the Ctrl-C and get its fd back."""
    import socket
    import time

    from promptcache_nb.store._db import interruptible

    r, w = socket.socketpair()
    w.setblocking(False)
    r.settimeout(5)
    con = duckdb.connect()
    seen: list[int] = []
    handler = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    previous = signal.set_wakeup_fd(w.fileno())
    try:
        with interruptible(con):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert r.recv(16) == bytes([signal.SIGINT])  # forwarded to the fd installed before
        assert seen == [signal.SIGINT]
        assert signal.set_wakeup_fd(-1) == w.fileno()  # and that fd is installed again
        assert con.execute("SELECT 42").fetchall() == [(42,)]  # an interrupt between statements stops nothing
    finally:
        signal.set_wakeup_fd(previous)
        signal.signal(signal.SIGINT, handler)
        con.close()
        r.close()
        w.close()
