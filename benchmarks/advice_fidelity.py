"""Print, in Markdown, how well the advice's replay reproduces measured traffic (`pc.fidelity`) and what the advice
claims on it: the shipped example logs, and the real public logs in ../shared/realdata when they are there.

    .venv/bin/python benchmarks/advice_fidelity.py            # shipped logs, then ../shared/realdata
    .venv/bin/python benchmarks/advice_fidelity.py --shipped  # shipped logs only

Every measured figure is the endpoint's usage; every saving is `simulated (counterfactual)`, anchored on it, with its
interval. The script checks, and says, that no finding claims more than the measured cost of the requests it
changes.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import promptcache_nb as pc

REALDATA = Path(__file__).resolve().parents[2] / "shared" / "realdata"


def plain(src: Path) -> Path:
    """A copy of ``src`` with ``.jsonl.gz`` files decompressed (the real logs are stored compressed)."""
    dst = Path(tempfile.mkdtemp(prefix="realdata-"))
    for root, _, files in os.walk(src):
        out = dst / os.path.relpath(root, src)
        out.mkdir(parents=True, exist_ok=True)
        for f in files:
            if f.endswith(".gz"):
                with gzip.open(Path(root) / f, "rb") as a, open(out / f[:-3], "wb") as b:
                    shutil.copyfileobj(a, b)
            elif f.endswith((".jsonl", ".json", ".yaml")):
                shutil.copy(Path(root) / f, out / f)
    return dst


def _pct(x: object) -> str:
    return "n/a" if x is None or x != x else f"{float(x):+.1%}"  # type: ignore[arg-type]


def report(title: str, lab: pc.Lab) -> int:
    """Print the fidelity and findings tables of ``lab``; the number of findings over their cap."""
    t0 = time.process_time()
    fid = pc.fidelity(lab)
    advice = pc.advise(lab)
    cpu = time.process_time() - t0
    print(f"\n### {title}\n")
    print("| session | requests | measured | simulated (scaled) | error | reproduced | provider miss | ttl | "
          "unexplained read | unpredicted write | history missing | retention open | first read explained |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in fid.itertuples(index=False):
        if not r.measured_requests:
            continue
        print(f"| {r.session} | {r.requests} | ${r.cost_measured_usd:.4f} | ${r.cost_scaled_usd:.4f} | "
              f"{_pct(r.cost_error)} | {r.agreement:.0%} | {r.provider_miss} | {r.ttl} | {r.unexplained_read} | "
              f"{r.unpredicted_write} | {r.history_missing} | {r.retention_open} | "
              f"{'—' if r.first_read_explained is None else 'yes' if r.first_read_explained else 'no'}"
              f"{f' ({r.first_read_from})' if isinstance(r.first_read_from, str) else ''} |")
    measured = fid.cost_measured_usd.sum()
    scaled = fid.cost_scaled_usd.sum()
    print(f"\nTotal: measured ${measured:.2f}, replay scaled to the measured prompts ${scaled:.2f} "
          f"({(scaled - measured) / measured:+.1%}); {int(fid.requests.sum())} requests; "
          f"{(fid.agreement * fid.measured_requests).sum() / fid.measured_requests.sum():.1%} reproduced.")
    f = advice.findings
    over = 0
    costs = {sid: lab.session(id=sid).turns().set_index("idx").cost_usd for sid in set(f.session)}
    for row in f.itertuples(index=False):
        cap = float(costs[row.session].reindex(row.cost_changed).fillna(0).sum())
        if row.usd_saved_high > cap + 1e-9:
            over += 1
    saves = f[f.verdict == "saves"]
    print(f"\nFindings: {len(f)} ({len(saves)} saves, "
          f"{int((f.verdict == 'no saving we can show').sum())} no saving we can show, "
          f"{int((f.verdict == 'costs more').sum())} costs more); over the measured cost of what they change: {over}.")
    print(f"Headline: {advice.summary()}")
    if advice.provider_misses is not None and len(advice.provider_misses):
        pm = advice.provider_misses
        print(f"Provider misses: {int(pm.requests.map(len).sum())} rebuilds with the logged prefix unchanged, "
              f"${pm.lost_usd.sum():.2f} lost (measured rebuilds; loss priced as reads instead of writes).")
    print(f"\n(fidelity + advice: {cpu:.1f} s CPU)")
    return over


def main() -> int:
    warnings.simplefilter("ignore")
    over = 0
    with pc.Lab(progress=False) as lab:
        for name in ("claude_code", "codex", "pi", "gemini_cli", "exchanges"):
            path = pc.data_path("logs") / name
            if path.exists():
                lab.import_log(path, progress=False)
        over += report("Shipped example logs (`pc.data_path('logs')`)", lab)
    if "--shipped" not in sys.argv and REALDATA.is_dir():
        for name in ("claude-code-spotter", "codex-localpush", "pydantic-ai-cassettes"):
            if not (REALDATA / name).is_dir():
                continue
            with pc.Lab(progress=False) as lab:
                try:
                    lab.import_log(plain(REALDATA / name), progress=False)
                except pc.errors.PromptCacheError as exc:
                    print(f"\n### ../shared/realdata/{name}\n\nnot imported: {exc}")
                    continue
                over += report(f"../shared/realdata/{name}", lab)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
