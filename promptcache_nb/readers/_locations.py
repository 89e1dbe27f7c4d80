"""Where each agent keeps its logs by default (``promptcache-nb import --agent NAME``).

The places come from each agent's own source (``../shared/reference/agent_log_formats.md`` and
``log_formats.md``): an environment variable the agent honours first, then its usual folder. Only the files
that hold requests are listed (``ui_messages.json``, not the task's other files), so a default import reports
no companion file as unreadable.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ..errors import ImportFormatError

__all__ = ["AGENTS", "OTHER_SOURCES", "agent_log_files", "agent_log_places"]

#: The agents ``--agent`` knows, in the order the help lists them.
AGENTS = ("pi", "openclaw", "gemini-cli", "opencode", "cline", "claude-code", "codex")
#: Who writes each ``--agent`` name's logs (the name a user knows them by).
AGENT_TITLES = {"pi": "pi / oh-my-pi", "openclaw": "OpenClaw", "gemini-cli": "Gemini CLI", "opencode": "OpenCode",
                "cline": "Cline / Roo Code", "claude-code": "Claude Code", "codex": "Codex CLI"}
#: Logs that have no usual place: where they are is where you said (format name, where, how they are written).
OTHER_SOURCES = (
    ("exchanges", "the recording proxy", "wherever `promptcache-nb proxy --log PATH` writes (any agent you can "
                                         "point at a URL; picoclaw and Lore keep no per-request usage: use this)"),
    ("vcr", "vcrpy / pytest-recording", "your tests' `cassettes/` folders"),
    ("har", "a browser", "a network tab's HAR export"),
    ("otlp", "OpenTelemetry (GenAI spans; Claude Code, Codex, Gemini CLI events)",
     "an SDK or collector file exporter's output, or `promptcache-nb otel` live (its spool)"),
)

# VS Code and its forks keep extension storage under <config>/<product>/User/globalStorage/<extension id>.
_EDITORS = ("Code", "Code - Insiders", "Cursor", "VSCodium", "Windsurf")


def _editor_roots(home: Path, env: Mapping[str, str]) -> list[Path]:
    if sys.platform == "darwin":
        base = home / "Library" / "Application Support"
    elif sys.platform == "win32":
        base = Path(env.get("APPDATA", str(home / "AppData" / "Roaming")))
    else:
        base = Path(env.get("XDG_CONFIG_HOME", str(home / ".config")))
    return [base / editor / "User" / "globalStorage" for editor in _EDITORS]


def _places(agent: str, home: Path, env: Mapping[str, str]) -> list[tuple[Path, str]]:
    """(folder, glob pattern) pairs where ``agent`` writes its logs."""
    if agent == "pi":
        pi = Path(env["PI_CODING_AGENT_DIR"]) if env.get("PI_CODING_AGENT_DIR") else home / ".pi" / "agent"
        omp = Path(env["OMP_CODING_AGENT_DIR"]) if env.get("OMP_CODING_AGENT_DIR") else home / ".omp" / "agent"
        return [(pi / "sessions", "**/*.jsonl"), (omp / "sessions", "**/*.jsonl")]
    if agent == "openclaw":
        root = Path(env["OPENCLAW_STATE_DIR"]) if env.get("OPENCLAW_STATE_DIR") else home / ".openclaw"
        return [(root / "agents", "*/sessions/*.jsonl"), (root / "logs", "cache-trace.jsonl"),
                (root / "logs", "anthropic-payload.jsonl")]
    if agent == "gemini-cli":
        return [(home / ".gemini" / "tmp", "*/chats/**/*.json"), (home / ".gemini" / "tmp", "*/chats/**/*.jsonl")]
    if agent == "opencode":
        if env.get("OPENCODE_DB"):
            db = Path(env["OPENCODE_DB"])
            return [(db.parent, db.name)]
        data = Path(env.get("XDG_DATA_HOME", str(home / ".local" / "share"))) / "opencode"
        return [(data, "opencode*.db"), (data / "storage" / "session", "*/*.json")]
    if agent == "cline":
        cline = Path(env["CLINE_DIR"]) if env.get("CLINE_DIR") else home / ".cline"
        places = [(cline / "data" / "tasks", "*/ui_messages.json"),
                  (cline / "data" / "sessions", "*/*.messages.json")]
        for root in _editor_roots(home, env):
            places += [(root / "saoudrizwan.claude-dev" / "tasks", "*/ui_messages.json"),
                       (root / "rooveterinaryinc.roo-cline" / "tasks", "*/ui_messages.json")]
        return places
    if agent == "claude-code":
        root = Path(env["CLAUDE_CONFIG_DIR"]) if env.get("CLAUDE_CONFIG_DIR") else home / ".claude"
        return [(root / "projects", "**/*.jsonl")]
    if agent == "codex":
        root = Path(env["CODEX_HOME"]) if env.get("CODEX_HOME") else home / ".codex"
        return [(root / "sessions", "**/*.jsonl"), (root / "sessions", "**/*.jsonl.zst")]
    raise ImportFormatError("--agent", f"unknown agent {agent!r}; known: {', '.join(AGENTS)}")


def agent_log_places(*, home: Path | None = None, env: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    """Where each agent writes its logs (``agent``, ``writer``, ``where``: folder and pattern, ``~`` for the home
    folder when ``home`` is not given), then the sources without a usual place (:data:`OTHER_SOURCES`).

    ``env`` defaults to none set (each agent's default places); pass ``os.environ`` for yours.

    Example:
        >>> agent_log_places()[0]
        {'agent': 'pi', 'writer': 'pi / oh-my-pi', 'where': '~/.pi/agent/sessions/**/*.jsonl'}
    """
    root = Path("~") if home is None else home
    rows = [{"agent": agent, "writer": AGENT_TITLES[agent], "where": str(folder / pattern)}
            for agent in AGENTS for folder, pattern in _places(agent, root, {} if env is None else env)]
    rows += [{"agent": f"(format {fmt})", "writer": writer, "where": where} for fmt, writer, where in OTHER_SOURCES]
    return rows


def agent_log_files(agent: str, *, home: Path | None = None, env: Mapping[str, str] | None = None) -> list[Path]:
    """The log files ``agent`` wrote in its usual places, sorted.

    Raises:
        ImportFormatError: an unknown agent, or no log there (one line naming every place looked in).

    Example:
        >>> agent_log_files("codex", home=Path("/nonexistent"), env={})
        Traceback (most recent call last):
        ...
        promptcache_nb.errors.ImportFormatError: --agent codex: no logs found; looked in ...
    """
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    places = _places(agent, home, env)
    found = sorted({f for folder, pattern in places if folder.is_dir() for f in folder.glob(pattern) if f.is_file()})
    if not found:
        looked = ", ".join(dict.fromkeys(str(folder / pattern) for folder, pattern in places))
        raise ImportFormatError(f"--agent {agent}", f"no logs found; looked in {looked}")
    return found
