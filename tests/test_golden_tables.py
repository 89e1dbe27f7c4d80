"""Refactors change no stored byte: replays and imports are compared table by table with a committed snapshot.

The snapshot (``tests/fixtures/golden_tables.json``) holds one digest per table of a store that replayed the
``tiny`` and ``knowledge_churn`` scenarios under every strategy and imported every shipped example log. Only what
differs between machines and runs is normalised: wall-clock columns (when a migration ran, when a calibration was
fitted), the folder the logs were copied to, and session ids that hash that folder.
A change that is meant to change what is stored refreshes the snapshot with ``UPDATE_GOLDEN=1`` and says why in its
commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

import promptcache_nb as pc

GOLDEN = Path(__file__).parent / "fixtures" / "golden_tables.json"
#: Columns that hold the wall clock of the run, not what was stored.
WALL_CLOCK = {"_migrations": {"applied_at"}, "calibrations": {"fitted_at"}}


def _store(tmp: Path) -> pc.Lab:
    logs = tmp / "logs"
    shutil.copytree(pc.data_path("logs"), logs)
    lab = pc.Lab(tmp / "golden.duckdb", progress=False)
    for name in ("tiny", "knowledge_churn"):
        sc = pc.load_scenario(pc.data_path("scenarios") / f"{name}.yaml")
        for strategy in pc.STRATEGIES:
            lab.replay(sc, strategy=strategy)
    lab.import_log(logs)  # usage-first
    lab.analyze()  # every body analysed: the tables a deep import stores (tests/test_usage_first.py)
    return lab


def table_digests(lab: pc.Lab, root: Path) -> dict[str, str]:
    """One sha256 per table over its rows in a canonical order, with ``root`` and root-derived ids normalised."""
    root_text = str(root.resolve())
    sessions = lab.sql("SELECT id, source FROM sessions").to_dict("records")
    # imported session ids hash their file's path: number them by their normalised source instead
    renamed = {}
    for n, row in enumerate(sorted(sessions, key=lambda r: (str(r["source"]).replace(root_text, "<ROOT>"), r["id"]
                                                           if r["source"] is None else ""))):
        if row["source"] is not None and root_text in str(row["source"]):
            renamed[row["id"]] = f"<S{n}>"
    tables = lab.sql("SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
                     "ORDER BY table_name").table_name.tolist()
    out = {}
    for table in tables:
        df = lab.sql(f'SELECT * FROM "{table}"')
        df = df.drop(columns=[c for c in WALL_CLOCK.get(table, ()) if c in df.columns])
        lines = []
        for row in df.itertuples(index=False):
            text = "\x1f".join(map(str, row)).replace(root_text, "<ROOT>")
            for old, new in renamed.items():
                text = text.replace(old, new)
            lines.append(text)
        lines.sort()
        out[table] = hashlib.sha256(("\x1e".join([",".join(df.columns), *lines])).encode()).hexdigest()
    return out


@pytest.mark.slow
def test_stored_replays_and_imports_are_byte_identical_to_the_snapshot(tmp_path: Path) -> None:
    lab = _store(tmp_path)
    try:
        got = table_digests(lab, tmp_path)
    finally:
        lab.close()
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    differ = sorted(t for t in set(want) | set(got) if want.get(t) != got.get(t))
    assert not differ, f"tables whose stored rows changed: {differ} (UPDATE_GOLDEN=1 if that is intended)"
