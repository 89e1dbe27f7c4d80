"""Issue 27 regressions: odd files as the store (FIFO, device), Ctrl-C while a store opens or migrates, numbers
that must be numbers, NUL bytes in scenario files, and invisible fillers shown in diffs.

The proxy's redaction by value is in test_redaction.py, tampered stores and ``doctor`` in test_doctor.py.
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

ROOT = Path(__file__).resolve().parents[2]
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
    pc.Lab(db, progress=False).close()  # a store of the version before: the slow migration is the one pending
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

    from promptcache_nb.store._interrupts import interruptible

    r, w = socket.socketpair()
    w.setblocking(False)
    r.settimeout(5)
    con = duckdb.connect()
    previous = signal.set_wakeup_fd(w.fileno())
    try:
        with pytest.raises(KeyboardInterrupt), interruptible(con):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # Python code inside the block: the KeyboardInterrupt comes at its end
        assert r.recv(16) == bytes([signal.SIGINT])  # forwarded to the fd installed before
        assert signal.set_wakeup_fd(-1) == w.fileno()  # and that fd is installed again
        assert con.execute("SELECT 42").fetchall() == [(42,)]  # an interrupt between statements stops nothing
    finally:
        signal.set_wakeup_fd(previous)
        con.close()
        r.close()
        w.close()


def test_interruptible_leaves_a_custom_sigint_handler_alone():
    from promptcache_nb.store._interrupts import interruptible

    seen: list[int] = []
    handler = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    con = duckdb.connect()
    try:
        before = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(before)
        with interruptible(con):
            assert signal.set_wakeup_fd(before) == before  # nothing installed
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, handler)
        con.close()


# -- 6. numbers that must be numbers; NUL in scenario files ------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "field", "problem"), [
    ({"input_tokens": -5}, "Usage.input_tokens", "must be a non-negative int, got -5"),
    ({"input_tokens": "7"}, "Usage.input_tokens", "got '7'"),
    ({"output_tokens": 1.5}, "Usage.output_tokens", "got 1.5"),
    ({"cache_read_input_tokens": True}, "Usage.cache_read_input_tokens", "got True"),
    ({"output_tokens": 10**13}, "Usage.output_tokens", "not a plausible count"),
    ({"cache_creation_input_tokens": 5, "cache_creation_5m_input_tokens": 4, "cache_creation_1h_input_tokens": 3},
     "Usage.cache_creation_input_tokens (5)", "exceeds"),
])
def test_usage_constructor_validates_its_numbers(kwargs, field, problem):
    with pytest.raises(pc.errors.UsageError) as exc:
        pc.Usage(**kwargs)
    assert isinstance(exc.value, pc.errors.PromptCacheError)
    assert field in str(exc.value) and problem in str(exc.value) and "\n" not in str(exc.value)


def _body(**extra):
    return {"model": "claude-sonnet-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **extra}


def test_record_refuses_a_split_larger_than_its_total_naming_the_field():
    usage = {"input_tokens": 3, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 0, "output_tokens": 1,
             "cache_creation": {"ephemeral_5m_input_tokens": 4, "ephemeral_1h_input_tokens": 3}}
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="sys")
        with pytest.raises(pc.errors.SessionError, match=r"cache_creation_input_tokens \(5\)"):
            s.record(_body(), usage=usage)
        assert s.n_turns == 0


@pytest.mark.parametrize(("name", "body"), [
    ("max_tokens", _body(max_tokens=2**70)),
    ("max_tokens", _body(max_tokens=10**7 + 1)),
    ("max_completion_tokens", {"model": "gpt-4o", "max_completion_tokens": 2**64,
                               "messages": [{"role": "user", "content": "hi"}]}),
])
def test_an_output_limit_beyond_any_model_is_refused(name, body):
    from promptcache_nb.request.validate import validate_request

    (problem,) = validate_request(body)
    assert problem.path == name and "above any model's maximum output" in problem.problem
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="sys", cache="openai" if "gpt" in body["model"] else "anthropic",
                        model=body["model"])
        with pytest.raises(pc.errors.BodyValidationError, match=name):
            s.record(body)
    assert validate_request(_body(max_tokens=0)) == [] and validate_request(_body(max_tokens=128_000)) == []


def test_a_nul_in_a_scenario_file_name_is_a_file_line_error(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text('name: t\nmodel: claude-sonnet-4-5\nhost_prompt_file: "prompt\\0.md"\n'
                    "turns:\n  - user: hi\n    reply: yo\n")
    with pytest.raises(pc.errors.ScenarioError) as exc:
        pc.load_scenario(path)
    assert str(exc.value) == f"{path}:3: host_prompt_file: 'prompt\\x00.md' holds a NUL byte, which no file name can hold"


def test_a_raw_nul_byte_in_a_scenario_is_a_file_line_error(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_bytes(b"name: t\nmodel: claude-sonnet-4-5\nhost_prompt: sys\nturns:\n  - user: h\x00i\n    reply: yo\n")
    with pytest.raises(pc.errors.ScenarioError) as exc:
        pc.load_scenario(path)
    assert str(exc.value).startswith(f"{path}:5: yaml: NUL (U+0000) is not allowed in YAML")
    tools = tmp_path / "tools.yaml"
    tools.write_bytes(b"- name: a\n  description: \x01\n")
    path.write_text("name: t\nmodel: claude-sonnet-4-5\nhost_prompt: sys\ntools_file: tools.yaml\n"
                    "turns:\n  - user: hi\n    reply: yo\n")
    with pytest.raises(pc.errors.ScenarioError, match=r"s\.yaml:4: tools_file: tools\.yaml:2: yaml: a control character"):
        pc.load_scenario(path)


# -- 7. invisible fillers ------------------------------------------------------------------------------------------
# The oracle, from UAX #44 and PropList.txt (written out here on purpose: the code derives its set from
# unicodedata; the test checks the derivation against the published property):
# Default_Ignorable_Code_Point = Other_Default_Ignorable_Code_Point + Cf + Variation_Selector - White_Space
#                                - FFF9..FFFB - 13430..13440 - Prepended_Concatenation_Mark
OTHER_DEFAULT_IGNORABLE = [(0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x2065, 0x2065),
                           (0x3164, 0x3164), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0xE0000, 0xE0000),
                           (0xE0002, 0xE001F), (0xE0080, 0xE00FF), (0xE01F0, 0xE0FFF)]
VARIATION_SELECTOR = [(0x180B, 0x180D), (0x180F, 0x180F), (0xFE00, 0xFE0F), (0xE0100, 0xE01EF)]
FILLERS = [0x115F, 0x1160, 0x3164, 0xFFA0, 0x2800, 0x034F, 0x17B4]  # the list
KHITAN_FILLER = 0x16FE4  # a filler by name (a mark that shows nothing), not default-ignorable: marked as well


def _expected_invisible() -> set[int]:
    import unicodedata

    out = {cp for lo, hi in OTHER_DEFAULT_IGNORABLE + VARIATION_SELECTOR for cp in range(lo, hi + 1)}
    out.update([*FILLERS, KHITAN_FILLER])
    for cp in range(0x110000):
        cat = unicodedata.category(chr(cp))
        if cat in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") or (cat == "Zs" and cp != 0x20):
            out.add(cp)
    return out


@pytest.fixture(scope="module")
def invisible() -> set[int]:
    return _expected_invisible()


def test_visible_marks_exactly_the_invisible_code_points(invisible):
    """Every code point, exhaustively: marked iff it is a control, format, surrogate, private-use, unassigned or
    separator character (bar the space), default-ignorable, or one of the fillers."""
    from promptcache_nb.request.diff import visible

    wrong = [cp for cp in range(0x110000) if (visible(chr(cp)) != chr(cp)) != (cp in invisible)]
    assert not wrong, [f"U+{cp:04X}" for cp in wrong[:20]]


@pytest.mark.parametrize("cp", FILLERS + [0x17B5, 0xFE0F, 0xE0100, 0x180B, 0x16FE4])
def test_each_filler_is_shown_in_diffs_and_html(cp):
    from promptcache_nb.request.diff import visible, visible_html

    ch = chr(cp)
    assert ch not in visible(f"a{ch}b") and f"U+{cp:04X}" in visible_html(f"a{ch}b")
    a = {"model": "claude-sonnet-4-5", "max_tokens": 8, "system": "Memory: nothing yet.",
         "messages": [{"role": "user", "content": "hi"}]}
    b = {**a, "system": f"Memory: nothing{ch} yet."}
    excerpt = pc.diff(a, b).excerpt
    assert ch not in excerpt.current and excerpt.current.startswith("⟨")


def test_knowledge_df_shows_a_hangul_filler():
    with pc.Lab(progress=False) as lab:
        s = lab.session(system="sys")
        s.knowledge.add("title\u3164", "content\u2800")
        row = s.knowledge.df().iloc[0]
        assert row["title"] == "title⟨HF⟩" and row["content"] == "content⟨U+2800⟩"


def test_visible_property_over_random_text(invisible):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from promptcache_nb.request.diff import visible

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(st.text(alphabet=st.characters(codec=None), max_size=40))
    def check(text):
        shown = visible(text)
        assert not any(ord(ch) in invisible for ch in shown)  # nothing invisible survives...
        assert (shown == text) == (not any(ord(ch) in invisible for ch in text))  # ...and nothing else changes

    check()


def test_the_filler_table_is_the_derivation():
    """The ranges visible() uses under this Python's Unicode version are what unicodedata derives (they were
    checked under 3.12 and 3.13 too when written; a version the table lacks derives, and this then passes)."""
    from promptcache_nb.request import diff

    assert diff._fillers() == diff._derive_fillers()


def test_the_derived_set_does_not_take_visible_gap_fillers():
    from promptcache_nb.request.diff import visible

    assert visible("\ua8f9\U0001144e") == "\ua8f9\U0001144e"  # DEVANAGARI / NEWA GAP FILLER have glyphs

