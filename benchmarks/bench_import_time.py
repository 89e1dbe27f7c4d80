"""How long ``import promptcache_nb`` takes, and what it spends the time on (issue #12 item 6).

Each figure is taken in fresh interpreters (after one untimed warm-up run, so bytecode and the page cache are
warm), and printed as the median and range of ``--runs`` runs:

- whole process: wall time of ``python -c "import promptcache_nb"`` (interpreter start-up included), its CPU
  time (user + system: a shared machine's load disturbs it less), and ``python -c "pass"`` for the start-up
  alone;
- in process: the cumulative microseconds of the ``promptcache_nb`` line of ``python -X importtime``;
- the heaviest third-party imports of the median in-process run (cumulative: what each imports is included;
  ``via X``: imported while X was loading, so already inside X's figure).

Target: the import takes <= 1 s on a 2-core machine. The load average is printed beside the figures, since
another process's work shows up in them. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_import_time.py [--runs 7] [--top 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 1.0


def run(args: list[str], *, root: Path = ROOT) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, stderr) of one child interpreter run in ``root`` (its package is imported)."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *args], cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stderr is not None
    with proc.stderr:
        err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)  # the child's own CPU time, which Popen.wait does not give
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{err}")
    return wall, usage.ru_utime + usage.ru_stime, err


def parse_importtime(text: str) -> list[tuple[int, str, int]]:
    """``-X importtime`` lines as (depth, module, cumulative µs), in the order printed (children first)."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|", 2)
        if not cumulative.strip().isdigit():
            continue  # the header
        module = name.rstrip()
        depth = (len(module) - len(module.lstrip(" ")) - 1) // 2
        rows.append((depth, module.strip(), int(cumulative)))
    return rows


def package_us(rows: list[tuple[int, str, int]]) -> int:
    return next(us for depth, name, us in rows if depth == 0 and name == "promptcache_nb")


def third_party(rows: list[tuple[int, str, int]], top: int) -> list[tuple[str, int, str | None]]:
    """The heaviest third-party packages imported by ``import promptcache_nb`` (1 ms or more): (package, µs,
    loaded via)."""
    stdlib = set(sys.stdlib_module_names)
    end = next(i for i, (depth, name, _) in enumerate(rows) if depth == 0 and name == "promptcache_nb")
    start = end
    while start > 0 and rows[start - 1][0] > 0:  # the package's subtree: the lines before it, up to depth 0
        start -= 1
    totals: dict[str, int] = {}
    via: dict[str, str | None] = {}
    # rows print children before their parent: walk backwards so each line's ancestors are known
    ancestors: list[tuple[int, str]] = [(0, "promptcache_nb")]
    for depth, name, us in reversed(rows[start:end]):
        while ancestors and ancestors[-1][0] >= depth:
            ancestors.pop()
        pkg = name.split(".")[0]
        outer = [a.split(".")[0] for _, a in ancestors]
        ancestors.append((depth, name))
        if pkg in stdlib or pkg.startswith("_") or pkg == "promptcache_nb" or pkg in outer:
            continue  # the standard library, ours, or already inside this package's own line
        totals[pkg] = totals.get(pkg, 0) + us
        others = [a for a in outer if a not in stdlib and not a.startswith("_") and a != "promptcache_nb"]
        if pkg not in via or via[pkg] is not None:
            via[pkg] = others[-1] if others else None
    ranked = sorted(((pkg, us) for pkg, us in totals.items() if us >= 1000), key=lambda kv: -kv[1])[:top]
    return [(pkg, us, via[pkg]) for pkg, us in ranked]


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f} s (range {min(values):.3f}–{max(values):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7, help="fresh interpreters per figure")
    ap.add_argument("--top", type=int, default=8, help="third-party imports listed")
    ap.add_argument("--root", type=Path, default=ROOT, help="time the promptcache_nb of this folder (another "
                    "checkout, for a before/after comparison); default: this repository")
    args = ap.parse_args()
    root = args.root.resolve()
    load = os.getloadavg()
    print(f"{root / 'promptcache_nb'} with {sys.executable} on {os.cpu_count()} CPUs; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")

    run(["-c", "import promptcache_nb"], root=root)  # warm-up: bytecode written, files in the page cache
    bare = [run(["-c", "pass"], root=root)[0] for _ in range(args.runs)]
    whole = [run(["-c", "import promptcache_nb"], root=root)[:2] for _ in range(args.runs)]
    traced = [parse_importtime(run(["-X", "importtime", "-c", "import promptcache_nb"], root=root)[2])
              for _ in range(args.runs)]
    inproc = [package_us(rows) / 1e6 for rows in traced]

    print(f"python -c 'pass' (start-up alone): {spread(bare)}")
    print(f"python -c 'import promptcache_nb', wall: {spread([w for w, _ in whole])}")
    print(f"python -c 'import promptcache_nb', CPU:  {spread([c for _, c in whole])}")
    print(f"in process (-X importtime, promptcache_nb cumulative): {spread(inproc)}")
    median_run = sorted(traced, key=package_us)[len(traced) // 2]
    print(f"heaviest third-party imports (the median in-process run, cumulative, {package_us(median_run) / 1e6:.3f} "
          "s in all):")
    for pkg, us, parent in third_party(median_run, args.top):
        print(f"  {pkg:<24} {us / 1e3:8.1f} ms" + (f"  (via {parent})" if parent else ""))
    lazy = ("pandas", "numpy", "matplotlib", "ipywidgets", "anthropic")
    loaded = sorted({name for _, name, _ in median_run} & set(lazy))
    print(f"loaded by the import among {', '.join(lazy)}: {', '.join(loaded) or 'none'}")
    med = statistics.median(inproc)
    print(f"target <= {TARGET_S:.0f} s: in process {med:.3f} s ({'met' if med <= TARGET_S else 'NOT met'}); "
          f"whole process {statistics.median([w for w, _ in whole]):.3f} s including start-up")


if __name__ == "__main__":
    main()
