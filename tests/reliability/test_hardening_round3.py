"""Issue 41 regressions (third hardening round): what one damaged record or document holds never aborts an
import, a store path that loops is refused in one line, group keys keep the whole folder name, and nested
capture stores each call once.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import promptcache_nb as pc

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "fixtures" / "logs"


def _turns(lab: pc.Lab) -> int:
    return int(lab.sql("SELECT count(*) AS n FROM turns").n[0])


# -- a lone surrogate in a usage object -----------------------------------------------------------------------
#: (fixture folder, the file in it whose first usage object gets a lone surrogate)
SURROGATE_LOGS = {
    "claude_code": ("claude_code/-home-dev-billing-service", "4b2f7c1e-9d3a-4e8b-a6f1-2c5d8e0b7a94.jsonl"),
    "exchanges": ("exchanges", "review_bot.jsonl"),
    "gemini_chat": ("gemini_cli", "chats/session-2026-06-02T09-12-3f0c6a41.jsonl"),  # usage as "tokens"
    "oh_my_pi": ("pi/omp", "-work-shop-web/2026-03-14T16-02-00-120Z_7c2e41d0b9a3.jsonl"),
    "pi": ("pi/--home-ann-ledger-api--", "2026-02-03T10-11-12-345Z_0f3c9a2e-6b1d-4c8e-9f21-7a5d3e1b8c40.jsonl"),
}


def _with_surrogate_in_usage(path: Path) -> int:
    """Put ``"note": "\\ud800"`` (the JSON escape of a lone surrogate, as a log line holds it) first in every
    usage object of the last line of ``path`` that has one
    (a streamed reply's final figures); the 1-based line it is on."""
    lines = path.read_text(encoding="utf-8").split("\n")
    for i, line in reversed(list(enumerate(lines))):
        patched, n = re.subn(r'"(usage|tokens)": ?\{', lambda m: m.group() + '"note":"\\ud800",', line)
        if n:
            lines[i] = patched
            path.write_text("\n".join(lines), encoding="utf-8")
            return i + 1
    raise AssertionError(f"{path} has no usage object")


@pytest.mark.parametrize("deep", [False, True], ids=["usage_first", "deep"])
@pytest.mark.parametrize("fmt", sorted(SURROGATE_LOGS))
def test_a_lone_surrogate_in_usage_skips_that_record_only(fmt: str, deep: bool, tmp_path: Path) -> None:
    folder, name = SURROGATE_LOGS[fmt]
    clean, damaged = tmp_path / "clean", tmp_path / "damaged"
    shutil.copytree(LOGS / folder, clean)
    shutil.copytree(LOGS / folder, damaged)
    line = _with_surrogate_in_usage(damaged / name)
    with pc.Lab(tmp_path / "clean.duckdb", progress=False) as lab:
        lab.import_log(clean, deep=deep)
        expected = _turns(lab)
    with pc.Lab(tmp_path / "damaged.duckdb", progress=False) as lab:
        result = lab.import_log(damaged, deep=deep)
        stored = _turns(lab)
    skipped = [r for r in result.skipped.to_dict("records") if "surrogate" in r["reason"]]
    assert skipped == [{"file": str(damaged / name), "line": line,
                        "reason": "usage: holds a lone surrogate '\\ud800' (not Unicode text)"}]
    assert expected > 1
    assert stored == expected - 1  # the one request, and only it, is left out


@pytest.mark.parametrize("deep", [False, True], ids=["usage_first", "deep"])
def test_a_lone_surrogate_in_opencode_tokens_skips_that_step_only(deep: bool, tmp_path: Path) -> None:
    """OpenCode JSON: one request per ``step-finish`` part, its usage in the part's ``tokens`` object."""
    part = "storage/part/msg_e87d674c4001ykPTPly5kAA819/prt_e87d687e8001SnBc0np9B9Udk7.json"
    clean, damaged = tmp_path / "clean", tmp_path / "damaged"
    shutil.copytree(LOGS / "opencode", clean)
    shutil.copytree(LOGS / "opencode", damaged)
    text = (damaged / part).read_text(encoding="utf-8")
    assert '"type": "step-finish"' in text
    (damaged / part).write_text(text.replace('"tokens": {', '"tokens": {"note": "\\ud800", ', 1), encoding="utf-8")
    with pc.Lab(tmp_path / "clean.duckdb", progress=False) as lab:
        lab.import_log(clean, deep=deep)
        expected = _turns(lab)
    with pc.Lab(tmp_path / "damaged.duckdb", progress=False) as lab:
        result = lab.import_log(damaged, deep=deep)  # "cannot encode str as UTF-8", nothing stored, before the fix
        stored = _turns(lab)
    skipped = [r for r in result.skipped.to_dict("records") if "surrogate" in r["reason"]]
    assert [r["reason"] for r in skipped] == ["usage: holds a lone surrogate '\\ud800' (not Unicode text)"]
    assert skipped[0]["file"].startswith(str(damaged / "storage"))
    assert expected > 1 and stored == expected - 1


# -- JSON nested past the parser's recursion limit inside a JSON-document log ----------------------------------
#: (fixture folder, the document in it that gets a value nested 1,200 deep, whether the import lists that
#: document as skipped: a telemetry outfile is not imported itself, so only its one record is lost)
NESTED_DOCUMENTS = {
    "cline_ui_messages": ("cline", "saoudrizwan.claude-dev/tasks/1780580012345/ui_messages.json", True),
    "cline_api_history": ("cline", "saoudrizwan.claude-dev/tasks/1780580012345/api_conversation_history.json", True),
    "roo_ui_messages": ("cline", "rooveterinaryinc.roo-cline/tasks/6f0c2b1e-9d4a-4c3e-8b7f-1a2d3c4e5f60/ui_messages.json",
                        True),
    "opencode_part": ("opencode", "storage/part/msg_e87d67460001dr0UwfMpf5rg7w/prt_e87d67460002OojmCUuBRoeL5p.json",
                      True),
    "gemini_telemetry": ("gemini_cli", "telemetry.log", False),
}
DEPTH = 1_200


def _with_deep_nesting(path: Path) -> None:
    """Give the first object of ``path`` a key whose value is an array nested :data:`DEPTH` levels deep."""
    text = path.read_text(encoding="utf-8")
    at = text.index("{")
    path.write_text(f'{text[:at + 1]}"zz_nested": {"[" * DEPTH}{"]" * DEPTH}, {text[at + 1:]}', encoding="utf-8")


@pytest.mark.parametrize("deep", [False, True], ids=["usage_first", "deep"])
@pytest.mark.parametrize("case", sorted(NESTED_DOCUMENTS))
def test_json_nested_too_deep_in_a_document_skips_that_document(case: str, deep: bool, tmp_path: Path) -> None:
    folder, name, listed = NESTED_DOCUMENTS[case]
    clean, damaged = tmp_path / "clean", tmp_path / "damaged"
    shutil.copytree(LOGS / folder, clean)
    shutil.copytree(LOGS / folder, damaged)
    _with_deep_nesting(damaged / name)
    with pc.Lab(tmp_path / "clean.duckdb", progress=False) as lab:
        lab.import_log(clean, deep=deep)
        expected = _turns(lab)
    with pc.Lab(tmp_path / "damaged.duckdb", progress=False) as lab:
        result = lab.import_log(damaged, deep=deep)  # raised RecursionError before the fix
        stored = _turns(lab)
    assert 0 < stored <= expected  # the documents beside it are imported
    named = [r for r in result.skipped.to_dict("records") if r["file"] == str(damaged / name)]
    if listed:
        assert [r["line"] for r in named] == [0], named
        assert re.search(r"nested too deep|recursion depth", named[0]["reason"]), named
    else:
        assert stored == expected


# -- an OTLP number past float range ---------------------------------------------------------------------------
@pytest.mark.parametrize(("field", "value"), [('"intValue":"2304"', '"intValue":1e400'),
                                              ('"startTimeUnixNano":"1772618400000000000"',
                                               '"startTimeUnixNano":1e400')], ids=["intValue", "startTime"])
def test_an_otlp_number_of_1e400_skips_its_span_only(field: str, value: str, tmp_path: Path) -> None:
    source = (LOGS / "otlp" / "collector_export.jsonl").read_text(encoding="utf-8").split("\n")
    assert field in source[0]
    log = tmp_path / "export.jsonl"
    log.write_text("\n".join([source[0].replace(field, value), *source[1:]]), encoding="utf-8")
    with pc.Lab(tmp_path / "r.duckdb", progress=False) as lab:
        result = lab.import_log(log)  # OverflowError before the fix
        stored = _turns(lab)
    skipped = result.skipped.to_dict("records")
    assert [(r["file"], r["line"]) for r in skipped] == [(str(log), 1)]
    assert "infinity" in skipped[0]["reason"]
    assert stored == sum(1 for line in source if '"gen_ai.usage.input_tokens"' in line) - 1


# -- a store path that is a symlink loop ------------------------------------------------------------------------
@pytest.fixture
def looping_store(tmp_path: Path) -> Path:
    (tmp_path / "b.duckdb").symlink_to(tmp_path / "a.duckdb")
    (tmp_path / "a.duckdb").symlink_to(tmp_path / "b.duckdb")
    return tmp_path / "a.duckdb"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "promptcache_nb.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


@pytest.mark.parametrize("command", [["sql", "{store}", "SELECT 1"], ["import", "{store}", str(LOGS / "exchanges")],
                                     ["doctor", "{store}"]], ids=["sql", "import", "doctor"])
def test_a_store_path_that_loops_is_refused_in_one_line(command: list[str], looping_store: Path) -> None:
    done = _cli(*(a.format(store=looping_store) for a in command))
    assert done.returncode == 2
    assert done.stderr == (f"promptcache-nb: error: cannot open store {str(looping_store)!r}: it is a symlink loop "
                           "(a link that leads back to itself); point it at a .duckdb file or remove it\n")
    assert looping_store.is_symlink()  # the failed import did not take the user's link for a store it created


def test_a_lab_on_a_looping_path_raises_store_error(looping_store: Path) -> None:
    from promptcache_nb.errors import StoreError

    for read_only in (False, True):
        with pytest.raises(StoreError, match="it is a symlink loop"):
            pc.Lab(looping_store, progress=False, read_only=read_only)


# -- group keys keep the whole folder name ---------------------------------------------------------------------
def test_folders_that_share_a_name_up_to_a_dot_are_two_groups(tmp_path: Path) -> None:
    from promptcache_nb.ingest._groups import plan_groups

    logs = tmp_path / "projects"
    shutil.copytree(LOGS / "claude_code" / "growing", logs / "alice.smith")
    shutil.copytree(LOGS / "exchanges", logs / "alice.jones")
    session = LOGS / "claude_code" / "-home-dev-billing-service"
    shutil.copytree(session, logs / "billing")  # "<id>.jsonl" and "<id>/subagents/": one group, as before
    groups, _ = plan_groups(logs)
    assert sorted(g.project for g in groups) == ["alice.jones", "alice.smith", "billing"]
    billing = {Path(f).relative_to(logs / "billing").as_posix() for g in groups if g.project == "billing"
               for f in g.files}
    assert billing == {p.relative_to(session).as_posix() for p in session.rglob("*.jsonl")}
    (logs / "releases").mkdir()
    for name in ("v1.2.jsonl", "v1.3.jsonl"):  # files too: the name without its log suffix
        shutil.copy(LOGS / "exchanges" / "review_bot.jsonl", logs / "releases" / name)
    groups, _ = plan_groups(logs / "releases")
    assert sorted(g.project for g in groups) == ["v1.2", "v1.3"]


def test_a_fleet_import_stores_each_dotted_folder_under_its_own_project(tmp_path: Path) -> None:
    import duckdb

    from promptcache_nb import fleet

    logs = tmp_path / "projects"
    shutil.copytree(LOGS / "claude_code" / "growing", logs / "alice.smith")
    shutil.copytree(LOGS / "exchanges", logs / "alice.jones")
    out = tmp_path / "fleet"
    fleet.import_logs(logs, out=out, progress=False)
    rows = duckdb.sql(f"SELECT DISTINCT project FROM read_parquet('{out}/sessions/**/*.parquet', "
                      "hive_partitioning=true) ORDER BY ALL").fetchall()
    assert rows == [("alice.jones",), ("alice.smith",)]


# -- nested capture on one client -------------------------------------------------------------------------------
CAPTURE_KEY = "sk-test-nested-capture-0123456789"  # a fake key


def _ask(client: Any, n: int) -> None:
    client.messages.create(model="claude-sonnet-4-5", max_tokens=16,
                           messages=[{"role": "user", "content": f"question {n}"}])


@pytest.mark.filterwarnings("ignore:The model .* is deprecated:DeprecationWarning")
def test_nested_captures_on_one_client_store_each_call_once(simulator: Any, tmp_path: Path) -> None:
    import anthropic

    with pc.Lab(tmp_path / "r.duckdb", progress=False) as lab, \
            anthropic.Anthropic(base_url=simulator.base_url, api_key=CAPTURE_KEY, max_retries=0) as client:
        before = client._client._transport
        with lab.capture(client) as outer:
            _ask(client, 0)
            with lab.capture(client) as inner:
                _ask(client, 1)
                _ask(client, 2)
            _ask(client, 3)
        assert client._client._transport is before
        assert (outer.stored, inner.stored) == (2, 2)  # each call by the innermost capture around it
        assert len(outer.session.turns()) == 2 and len(inner.session.turns()) == 2
        session = lab.new_session(project="nested", cache="anthropic")
        with lab.capture(client, session=session), lab.capture(client, session=session):
            _ask(client, 4)
        assert _turns(lab) == 5
        assert len(session.turns()) == 1


@pytest.mark.parametrize("deep", [False, True], ids=["usage_first", "deep"])
def test_a_lone_surrogate_in_a_session_id_skips_those_records_only(deep: bool, tmp_path: Path) -> None:
    folder, name = SURROGATE_LOGS["claude_code"]
    logs = tmp_path / "logs"
    shutil.copytree(LOGS / folder, logs)
    text = (logs / name).read_text(encoding="utf-8")
    assert '"sessionId":"' in text
    (logs / name).write_text(text.replace('"sessionId":"', '"sessionId":"\\ud800'), encoding="utf-8")
    with pc.Lab(tmp_path / "r.duckdb", progress=False) as lab:
        result = lab.import_log(logs, deep=deep)  # UnicodeEncodeError before the fix
        files = set(lab.sql("SELECT DISTINCT source_ref FROM turns").source_ref.str.rsplit(":", n=1).str[0])
    skipped = [r for r in result.skipped.to_dict("records") if "surrogate" in r["reason"]]
    assert skipped and {r["file"] for r in skipped} == {str(logs / name)}
    assert {r["reason"] for r in skipped} == {"session_key: holds a lone surrogate '\\ud800' (not Unicode text)"}
    assert files and str(logs / name) not in files  # the sub-agents' files beside it are imported


def test_a_lone_surrogate_quoted_in_a_skip_reason_is_shown_escaped(tmp_path: Path) -> None:
    lines = (LOGS / "exchanges" / "review_bot.jsonl").read_text(encoding="utf-8").split("\n")
    assert '"path":"/v1/messages/count_tokens"' in lines[3]  # a call the import lists as not analysed
    lines[3] = lines[3].replace('"path":"/v1/messages/count_tokens"', '"path":"/v1/messages/count_tokens\\ud800"')
    log = tmp_path / "review_bot.jsonl"
    log.write_text("\n".join(lines), encoding="utf-8")
    with pc.Lab(tmp_path / "r.duckdb", progress=False) as lab:
        result = lab.import_log(log)
    reasons = {r["line"]: r["reason"] for r in result.skipped.to_dict("records")}  # UnicodeEncodeError before
    assert reasons[4] == "endpoint not analysed: /v1/messages/count_tokens\\ud800"
