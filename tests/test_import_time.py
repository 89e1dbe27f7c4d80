"""``import promptcache_nb`` stays light (issue #12 item 6): pandas, matplotlib, ipywidgets and the anthropic
SDK load when a function needs them, not with the package.

What loads is checked, not how long it takes (``benchmarks/bench_import_time.py`` prints the timings): one
fresh interpreter imports the package, records ``sys.modules``, then uses the API that needs pandas.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

#: Loaded on first use only: never by ``import promptcache_nb`` or by reading its public attributes.
LAZY = ("pandas", "numpy", "matplotlib", "ipywidgets", "anthropic")

CHILD = textwrap.dedent("""
    import json, sys, traceback

    loaded_by = {}  # lazy module -> the package line that first imported it (for the failure message)


    class Watch:
        def find_spec(self, name, path=None, target=None):
            if name in LAZY and name not in loaded_by:
                ours = [f for f in traceback.extract_stack() if "promptcache_nb" in f.filename and "_lazy" not in f.filename]
                where = ours[-1] if ours else None
                loaded_by[name] = (f"{where.filename.rsplit('promptcache_nb', 1)[-1].lstrip('/')}:{where.lineno}"
                                   if where else "outside the package")
            return None


    sys.meta_path.insert(0, Watch())

    import promptcache_nb as pc

    out = {"after_import": sorted(m for m in LAZY if m in sys.modules), "loaded_by": dict(loaded_by)}
    # the public names are plain attributes; reading them loads nothing heavy
    names = [pc.Lab, pc.compare_df, pc.resimulate, pc.ttl_whatif, pc.rebuilds, pc.calibrate, pc.plots.plot_savings,
             pc.plots.plot_compare, pc.widgets.StepperController, pc.Session, pc.session.KnowledgeBook]
    out["after_attributes"] = sorted(m for m in LAZY if m in sys.modules)
    out["loaded_by_attributes"] = dict(loaded_by)

    # the functions that return frames import pandas themselves
    lab = pc.Lab(None, progress=False)
    s = lab.replay(pc.load_scenario(pc.data_path("scenarios") / "tiny.yaml"), strategy="durable_delta")
    df = s.turns()
    out["turns_type"] = type(df).__module__.split(".")[0] + "." + type(df).__name__
    out["turns_rows"] = len(df)
    out["n_turns"] = s.n_turns
    out["efficiency"] = s.efficiency()
    out["compare_rows"] = len(pc.compare_df([s]))
    out["knowledge_columns"] = list(s.knowledge.df().columns)
    out["sessions_rows"] = len(lab.sessions())
    out["resimulate_rows"] = len(s.resimulate("openai"))
    out["whatif_ttls"] = sorted(set(pc.ttl_whatif(s).ttl))
    out["rebuilds_type"] = type(pc.rebuilds(s)).__name__
    out["after_use"] = sorted(m for m in LAZY if m in sys.modules)
    lab.close()
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def child() -> dict:
    code = f"LAZY = {LAZY!r}\n{CHILD}"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_import_loads_no_heavy_library(child: dict) -> None:
    assert child["after_import"] == [], f"`import promptcache_nb` loaded {child['loaded_by']} (module: first importer)"


def test_public_attributes_load_no_heavy_library(child: dict) -> None:
    assert child["after_attributes"] == [], f"reading pc.* attributes loaded {child['loaded_by_attributes']}"


def test_frames_still_work_after_a_light_import(child: dict) -> None:
    assert child["turns_type"] == "pandas.DataFrame"
    assert child["turns_rows"] == child["n_turns"] > 0
    assert child["efficiency"] is None or 0 <= child["efficiency"] <= 1
    assert child["compare_rows"] == 1
    assert child["knowledge_columns"] == ["id", "short_id", "key", "title", "category", "version", "content"]
    assert child["sessions_rows"] == 1
    assert child["resimulate_rows"] == child["n_turns"]
    assert child["whatif_ttls"] == ["1h", "5m"]
    assert child["rebuilds_type"] == "DataFrame"
    assert "pandas" in child["after_use"]  # loaded on first use, as it should be
