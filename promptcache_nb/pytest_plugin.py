"""A pytest plugin that fails a test whose LLM calls broke the prompt cache (registered as ``pytest11``).

The fixture ``prompt_cache`` gives a test an endpoint to point its agent at and checks, after the test, what the
agent sent:

- ``prompt_cache.base_url``: a recording proxy (:class:`~promptcache_nb.RecordingProxy`) in front of our simulator
  endpoint (:class:`~promptcache_nb.SimulatorServer`, started for the test: offline, free), or in front of a real
  upstream with ``--prompt-cache-upstream https://api.anthropic.com``. Point ``ANTHROPIC_BASE_URL`` (or
  ``base_url=``) at it; OpenAI clients at ``base_url + "/v1"``.
- ``prompt_cache.session`` / ``.sessions``: the calls made so far, imported into ``prompt_cache.lab`` (one
  session per conversation, as ``lab.import_log`` groups a proxy log).

After the test (when it passed on its own), the test **fails** when a request broke the cache — it read less than
it could have, in its own conversation or against the prefix an earlier conversation of the test had cached
(:func:`promptcache_nb.analysis.gate.check_conversations`: a changed system prompt or tool list between two
conversations) — or past the thresholds of ``@pytest.mark.prompt_cache(min_read_pct=..., max_breaks=...)``: the
message names the requests and shows each one's located diff (:func:`promptcache_nb.assert_cache_stable`, the
same message). A prompt below the model's minimum cacheable length passes with a note (a "prompt cache" report
section, shown with ``-rP``) saying nothing could be cached.

- ``--prompt-cache-baseline FILE``: also fail when a test breaks more often, or reads more than one point less
  of its prompt from the cache, than the figures stored in FILE; ``--prompt-cache-update`` writes them instead.
- With ``GITHUB_STEP_SUMMARY`` set, a Markdown table per test is appended to it (requests, read %, breaks,
  first break's location).

Works under ``pytest -n`` (pytest-xdist): each test has its own endpoint and store, and the shared files (the
baseline, the step summary) are written under a file lock.

This module is imported by pytest at start-up wherever the package is installed: it imports nothing heavy until a
test asks for the fixture.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if sys.platform != "win32":  # flock keeps the xdist workers' writes to one shared file apart (POSIX only)
    import fcntl

if TYPE_CHECKING:  # pragma: no cover
    from .analysis.gate import CacheCheck
    from .lab import Lab
    from .live.proxy import RecordingProxy
    from .live.server import SimulatorServer
    from .session import Session

READ_PCT_TOLERANCE = 1.0  # points of read % a test may lose against its baseline (estimates move a little)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("prompt-cache", "prompt cache checks (promptcache_nb)")
    group.addoption("--prompt-cache-upstream", metavar="URL", default=None,
                    help="send prompt_cache calls to this API (through a recording proxy) instead of the simulator")
    group.addoption("--prompt-cache-baseline", metavar="FILE", default=None,
                    help="compare each test's cache figures with those stored in FILE (JSON)")
    group.addoption("--prompt-cache-update", action="store_true", default=False,
                    help="write the figures to --prompt-cache-baseline instead of comparing")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "prompt_cache(min_read_pct=None, max_breaks=0): thresholds for the prompt_cache fixture's check")
    baseline = config.getoption("--prompt-cache-baseline", None)
    if config.getoption("--prompt-cache-update", False) and not baseline:
        raise pytest.UsageError("--prompt-cache-update needs --prompt-cache-baseline FILE (where to write)")
    if baseline:  # one usage error at start-up, never a traceback in every test
        path = Path(baseline)
        if path.is_dir():
            raise pytest.UsageError(f"--prompt-cache-baseline {path}: a directory, not a baseline file")
        _read_baseline(path)  # --prompt-cache-update rewrites it: a damaged file is refused, never overwritten


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # a bad marker is one usage error before any test runs
        if "prompt_cache" in getattr(item, "fixturenames", ()) or item.get_closest_marker("prompt_cache"):
            _thresholds(item)


class PromptCache:
    """What the ``prompt_cache`` fixture gives a test.

    Attributes:
        base_url: the endpoint to point the agent at (Anthropic clients as is, OpenAI clients plus ``/v1``).
        lab: the test's store (a file in the test's temporary directory).
        log_path: the proxy's log of the test's calls.
        server: the simulator endpoint behind the proxy (None with ``--prompt-cache-upstream``).
    """

    def __init__(self, lab: Lab, proxy: RecordingProxy, server: SimulatorServer | None) -> None:
        self.lab = lab
        self.server = server
        self._proxy = proxy
        self.log_path: Path = proxy.log_path
        self.base_url: str = proxy.url

    @property
    def sessions(self) -> list[Session]:
        """The calls so far, imported from the proxy's log: one session per conversation, oldest first."""
        res = self.lab.import_log(self.log_path, format="exchanges", project="prompt_cache", progress=False)
        ids = list(self.lab.sessions().id)
        by_id = {s.id: s for s in res.sessions}
        return [by_id.get(i) or self.lab.open_session(i) for i in ids]

    @property
    def session(self) -> Session:
        """The one session of the calls so far (the first, when the test held several conversations)."""
        sessions = self.sessions
        if not sessions:
            raise LookupError(f"prompt_cache: no call reached {self.base_url} yet")
        return sessions[0]

    def _stop(self) -> None:
        self._proxy.close()  # calls in flight finish and are written before the log is read
        if self.server is not None:
            self.server.stop()

    def __repr__(self) -> str:
        return f"PromptCache(base_url={self.base_url!r}, calls={self._proxy.recorded})"


@pytest.fixture
def prompt_cache(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PromptCache]:
    """An endpoint for the test's agent (``.base_url``) whose calls are checked for cache breaks after the test."""
    import promptcache_nb as pc  # pytest loads this plugin in every run: the package loads when a test asks

    upstream = request.config.getoption("--prompt-cache-upstream")
    server = None
    if upstream is None:
        # entries readable as soon as written: a call made after the previous one returned reads it, as on the API
        # (the default half-second time-to-first-token would make a fast test's calls all miss, and pass vacuously)
        server = pc.SimulatorServer(cache_params={"ttft_seconds": 0}).start()
        upstream = server.base_url
    proxy = pc.RecordingProxy(upstream, tmp_path / "prompt_cache.jsonl").start()
    lab = pc.Lab(tmp_path / "prompt_cache.duckdb", progress=False)
    fixture = PromptCache(lab, proxy, server)
    try:
        yield fixture
    finally:
        fixture._stop()
        lab.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    result = yield  # the test itself: an exception it raised propagates unchanged
    fixture = getattr(item, "funcargs", {}).get("prompt_cache")
    if isinstance(fixture, PromptCache):
        _check(item, fixture)
    return result


def _thresholds(item: pytest.Item) -> dict[str, Any]:
    marker = item.get_closest_marker("prompt_cache")
    kwargs = dict(marker.kwargs) if marker is not None else {}
    where = f"{item.nodeid}: @pytest.mark.prompt_cache"
    if marker is not None and marker.args:
        raise pytest.UsageError(f"{where}: takes keyword arguments only (min_read_pct=, max_breaks=)")
    unknown = set(kwargs) - {"min_read_pct", "max_breaks"}
    if unknown:
        raise pytest.UsageError(f"{where}: unknown argument "
                                f"{', '.join(sorted(unknown))} (use min_read_pct=, max_breaks=)")
    pct, breaks = kwargs.get("min_read_pct"), kwargs.get("max_breaks", 0)
    if pct is not None and (isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 <= pct <= 100):
        raise pytest.UsageError(f"{where}: min_read_pct must be a number from 0 to 100 or None, got {pct!r}")
    if breaks is not None and (isinstance(breaks, bool) or not isinstance(breaks, int) or breaks < 0):
        raise pytest.UsageError(f"{where}: max_breaks must be a whole number >= 0 or None, got {breaks!r}")
    return {"min_read_pct": pct, "max_breaks": breaks}


def _check(item: pytest.Item, fixture: PromptCache) -> None:
    from .analysis.gate import check_cache, check_conversations  # as above: only after a test that used it

    fixture._stop()
    thresholds = _thresholds(item)
    sessions = fixture.sessions
    checks = [check_cache(s, **thresholds) for s in sessions]
    messages = [c.message() for c in checks if not c.ok]
    between = check_conversations(sessions)
    allowed = thresholds["max_breaks"]
    if between and (allowed is None or len(between) + sum(len(c.breaks) for c in checks) > allowed):
        messages.append(f"prompt cache check across {len(sessions)} conversations: {len(between)} "
                        f"conversation{'s' if len(between) != 1 else ''} broke the prefix an earlier one had "
                        "cached\n" + "\n".join(b.text() for b in between))
    notes = [n for c in checks for n in c.notes]
    if notes and not messages:
        item.add_report_section("call", "prompt cache", "\n".join(dict.fromkeys(notes)))
    config = item.config
    baseline = config.getoption("--prompt-cache-baseline")
    if baseline:
        if config.getoption("--prompt-cache-update"):
            _update_baseline(Path(baseline), item.nodeid, checks)
        else:
            messages += _against_baseline(Path(baseline), item.nodeid, checks)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            _append_summary(Path(summary), item.nodeid, checks)
        except OSError as exc:  # the job summary is a report: it never fails a test
            item.warn(pytest.PytestWarning(f"prompt cache: could not write GITHUB_STEP_SUMMARY {summary}: "
                                           f"{exc.strerror or exc}"))
    if messages:  # the message alone: the plugin's own frames would say nothing about the test
        pytest.fail("\n\n".join(messages), pytrace=False)


# -- shared files: written by several xdist workers --------------------------------------------------------
@contextmanager
def _locked(path: Path) -> Iterator[None]:
    if sys.platform == "win32":  # no flock: xdist workers there may interleave their writes
        yield
        return
    lock = path.with_name(path.name + ".lock")
    with lock.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _figures(checks: list[CacheCheck]) -> dict[str, Any]:
    read = [c.read_pct for c in checks if c.read_pct is not None]
    return {"requests": sum(c.requests for c in checks), "breaks": sum(len(c.breaks) for c in checks),
            "read_pct": None if not read else round(min(read), 2)}


def _read_baseline(path: Path) -> dict[str, Any]:
    """The baseline file's figures by test id ({} when it does not exist yet); a file that is not one is a usage
    error naming the file and, for a bad entry, the test id and field."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError:
        raise pytest.UsageError(f"{path}: not a prompt cache baseline (not UTF-8 text)") from None
    except IsADirectoryError:
        raise pytest.UsageError(f"{path}: a directory, not a prompt cache baseline file") from None
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]
        raise pytest.UsageError(f"{path}: not a prompt cache baseline (JSON object of test ids): {reason}") from None
    if not isinstance(data, dict):
        raise pytest.UsageError(f"{path}: not a prompt cache baseline (a JSON object of test ids, got "
                                f"{type(data).__name__})")
    for nodeid, entry in data.items():
        if not isinstance(entry, dict):
            raise pytest.UsageError(f"{path}: entry {nodeid!r} must be an object of figures, got "
                                    f"{type(entry).__name__}")
        for field, kinds in (("requests", (int,)), ("breaks", (int,)), ("read_pct", (int, float))):
            value = entry.get(field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
                raise pytest.UsageError(f"{path}: entry {nodeid!r}, field {field!r} must be a number, got "
                                        f"{value!r}")
    return data


def _update_baseline(path: Path, nodeid: str, checks: list[CacheCheck]) -> None:
    with _locked(path):
        data = _read_baseline(path)
        data[nodeid] = _figures(checks)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(path)


def _against_baseline(path: Path, nodeid: str, checks: list[CacheCheck]) -> list[str]:
    base = _read_baseline(path).get(nodeid)
    if not isinstance(base, dict):
        return []  # a new test: nothing to compare with until --prompt-cache-update writes it
    now = _figures(checks)
    out = []
    if isinstance(base.get("breaks"), int) and now["breaks"] > base["breaks"]:
        out.append(f"prompt cache baseline {path}: {now['breaks']} breaks, the baseline has {base['breaks']}")
    was = base.get("read_pct")
    if isinstance(was, int | float) and (now["read_pct"] is None or now["read_pct"] < was - READ_PCT_TOLERANCE):
        got = "no usage" if now["read_pct"] is None else f"{now['read_pct']:.1f} %"
        out.append(f"prompt cache baseline {path}: read {got} of prompt tokens from the cache, the baseline "
                   f"{was:.1f} %")
    if out:
        out += [b.text() for c in checks for b in c.breaks]
    return out


def _append_summary(path: Path, nodeid: str, checks: list[CacheCheck]) -> None:
    lines = [f"#### prompt cache: `{nodeid}`", "", "| session | requests | read % | breaks | first break |",
             "|---|---|---|---|---|"]
    for c in checks:
        read = "—" if c.read_pct is None else f"{c.read_pct:.1f}"
        where = c.first_break_location().replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {c.session_id} | {c.requests} | {read} | {len(c.breaks)} | {where} |")
    if not checks:
        lines.append("| — | 0 | — | 0 | — |")
    with _locked(path), path.open("a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n\n")
