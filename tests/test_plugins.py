"""Plugins: a third-party package declares a strategy, a cache model and a log reader as entry points; once it is
installed, the Python API and the CLI find them by name; a session stored under a strategy that is not installed
reopens read-only (its turns and diffs), and only stepping it fails, in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIP = Path(sys.executable).with_name("pip")
EXCHANGES = ROOT / "promptcache_nb" / "data" / "logs" / "exchanges" / "release_notes_growing.jsonl"

PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "pcnb-demo-plugin"
version = "0.1"

[project.entry-points."promptcache_nb.strategies"]
tail_marker = "pcnb_demo_plugin:TailMarker"

[project.entry-points."promptcache_nb.cache_models"]
tiny_blocks = "pcnb_demo_plugin:TinyBlocks"

[project.entry-points."promptcache_nb.readers"]
proxy-copy = "pcnb_demo_plugin:ProxyCopy"

[tool.setuptools]
py-modules = ["pcnb_demo_plugin"]
"""

MODULE = '''
"""A demo plugin: one strategy, one cache model, one log reader."""
from typing import Any, ClassVar

from pydantic import Field

import promptcache_nb as pc
from promptcache_nb.cache.vllm import VLLMCache
from promptcache_nb.readers.exchanges import ExchangesReader


class TailMarker(pc.Strategy):
    """The host prompt as the system, one breakpoint on the last message; a marker line after the prompt."""

    name: ClassVar[str] = "tail_marker"
    title: ClassVar[str] = "host prompt + marker, breakpoint on the last message"
    source: ClassVar[str] = "a test plugin"

    class Options(pc.Strategy.Options):
        marker: str = Field("plugin", description="the line appended to the host prompt")

    options: Options

    def build(self, ctx: Any) -> dict[str, Any]:
        messages = [dict(m) for m in ctx.messages]
        last = messages[-1]
        content = last["content"] if isinstance(last["content"], list) else [{"type": "text", "text": last["content"]}]
        messages[-1] = {**last, "content": [*content[:-1], {**content[-1], "cache_control": {"type": "ephemeral"}}]}
        return {"model": ctx.model, "max_tokens": 1024,
                "system": [{"type": "text", "text": ctx.host_prompt + "\\n" + self.options.marker}],
                "messages": messages}


class TinyBlocks(VLLMCache):
    """A vLLM-like pool of 8-token blocks."""

    name: ClassVar[str] = "tiny_blocks"

    class Options(VLLMCache.Options):
        block_size: int = Field(8, ge=1, description="tokens per KV block")


class ProxyCopy(ExchangesReader):
    """The recording proxy's format under another name (chosen with --format only)."""

    name = "proxy-copy"

    def sniff(self, path, head):
        return False
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin built and installed (offline, no dependencies) into a private target directory."""
    root = tmp_path_factory.mktemp("plugin")
    pkg = root / "pkg"
    pkg.mkdir()
    (pkg / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "pcnb_demo_plugin.py").write_text(MODULE)
    target = root / "site"
    subprocess.run([str(PIP), "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "--target",
                    str(target), str(pkg)], check=True, capture_output=True, cwd=root)
    assert list(target.glob("pcnb_demo_plugin-0.1.dist-info/entry_points.txt"))
    return target


def run(code_or_args: str | list[str], *, site: Path | None, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Python code (a str) or CLI arguments (a list) in a fresh interpreter, the plugin on the path or not."""
    path = [str(site)] if site is not None else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)]), "PYTHONHASHSEED": "0"}
    argv = ["-c", textwrap.dedent(code_or_args)] if isinstance(code_or_args, str) else \
        ["-m", "promptcache_nb.cli", *code_or_args]
    return subprocess.run([sys.executable, "-W", "error", *argv], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


pytestmark = pytest.mark.slow  # pip and fresh interpreters: seconds each


def test_the_python_api_finds_the_plugins(site: Path, tmp_path: Path) -> None:
    out = run(f"""
        import json, warnings
        import promptcache_nb as pc
        from promptcache_nb.readers import READERS

        assert "tail_marker" in pc.STRATEGIES and pc.STRATEGIES[-1] == "tail_marker"  # after the built-ins
        assert "tiny_blocks" in pc.CACHE_MODELS and "proxy-copy" in READERS
        cache = pc.get_cache_model("tiny_blocks", num_blocks=64)
        assert (cache.options.block_size, cache.options.num_blocks) == (8, 64)
        try:
            pc.get_cache_model("tiny_blocks", block_sise=4)
        except pc.InvalidOptionError as exc:
            bad = str(exc)
        with pc.Lab("plug.duckdb", progress=False) as lab:
            s = lab.session("tail_marker", cache="tiny_blocks", system="You help. " * 200,
                            strategy_params={{"marker": "-- via plugin"}})
            s.step("hello", reply="hi")
            t = s.step("again", reply="ok")
            res = lab.import_log({str(EXCHANGES)!r}, format="proxy-copy")
            print(json.dumps({{"sid": s.id, "read": t.usage.cache_read_input_tokens,
                               "system": t.prepared.body["system"][0]["text"][-13:], "bad": bad,
                               "imported": len(res.sessions), "formats": sorted({{x.source for x in res.sessions}})}}))
    """, site=site, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["sid"].endswith("-tail_marker") and got["read"] > 0 and got["system"] == "-- via plugin"
    assert got["bad"].startswith("cache model 'tiny_blocks': unknown option 'block_sise' (did you mean 'block_size'?)")
    assert got["imported"] >= 1


def test_the_cli_finds_the_plugins(site: Path, tmp_path: Path) -> None:
    help_text = run(["replay", "--help"], site=site, cwd=tmp_path).stdout
    assert "tail_marker" in help_text and "tiny_blocks" in help_text
    # argparse wraps long help at spaces and hyphens: compare without the line breaks it adds
    assert "proxy-copy" in "".join(run(["import", "--help"], site=site, cwd=tmp_path).stdout.split())
    out = run(["replay", "tiny", "--strategy", "tail_marker", "--cache", "tiny_blocks", "--db", "cli.duckdb",
               "--quiet"], site=site, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "tail_marker" in out.stdout
    out = run(["import", str(EXCHANGES), "--format", "proxy-copy", "--db", "cli.duckdb", "--quiet"], site=site,
              cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # without the plugin: the same names are unknown, in one line
    out = run(["replay", "tiny", "--strategy", "tail_marker", "--db", "none.duckdb"], site=None, cwd=tmp_path)
    assert out.returncode == 2 and "unknown strategy 'tail_marker'" in out.stderr
    assert not (tmp_path / "none.duckdb").exists()


def test_a_session_of_a_missing_strategy_reopens_read_only(site: Path, tmp_path: Path) -> None:
    made = run("""
        import promptcache_nb as pc
        with pc.Lab("ro.duckdb", progress=False) as lab:
            s = lab.session("tail_marker", system="You help. " * 200)
            s.step("hello", reply="hi")
            s.step("again", reply="ok")
            print(s.id)
    """, site=site, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    sid = made.stdout.strip().splitlines()[-1]
    out = run(f"""
        import promptcache_nb as pc
        with pc.Lab("ro.duckdb", progress=False) as lab:
            s = lab.session(id={sid!r})
            turns = s.turns()
            assert len(turns) == 2, turns
            assert s.turn(1).diff is not None and s.turn(1).diff.shared_prefix_tokens > 0
            try:
                s.step("more", reply="no")
            except pc.errors.SessionError as exc:
                print(exc)
    """, site=None, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    message = out.stdout.strip().splitlines()[-1]
    assert message.startswith(f"session {sid!r} is read-only here: unknown strategy 'tail_marker'")
    assert "install the package" in message
