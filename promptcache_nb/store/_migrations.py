"""Append-only named migrations. Never edit one after it ships: add the next ``mNNN_*`` function.

Each runs in its own transaction and its name is recorded in ``_migrations`` (llm's pattern).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from operator import attrgetter

import duckdb

from . import _rollups

Migration = Callable[[duckdb.DuckDBPyConnection], None]
MIGRATIONS: list[Migration] = []


def migration(fn: Migration) -> Migration:
    # kept in name order whatever the order of definition, so migrations written side by side (m007, m008)
    # always apply in the order of their names
    bisect.insort(MIGRATIONS, fn, key=attrgetter("__name__"))
    return fn


@migration
def m001_initial(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("""
        CREATE TABLE projects (
            id TEXT PRIMARY KEY,
            created_at TIMESTAMPTZ NOT NULL
        )""")
    con.execute("""
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            project_id TEXT NOT NULL,
            strategy TEXT NOT NULL,
            cache_model TEXT NOT NULL,
            model TEXT NOT NULL,
            created_at TIMESTAMPTZ NOT NULL,
            config JSON NOT NULL            -- host prompt, tools, clock, strategy/cache params
        )""")
    # Content-addressed segment bodies: stored once however many turns reuse them.
    con.execute("""
        CREATE TABLE blocks (
            hash TEXT PRIMARY KEY,          -- digest of the exact canonical bytes
            kind TEXT NOT NULL,             -- tool | system | msg-start | msg | msg-str | msg-empty | rest
            body TEXT NOT NULL,             -- canonical JSON of the segment
            tokens INTEGER,                 -- estimated tokens (NULL for rest)
            bytes INTEGER NOT NULL
        )""")
    # A hash tree of request prefixes: node = (parent, block). Requests sharing a prefix share nodes,
    # so a turn stores only the nodes its new tail adds (simonw/llm's idea for conversations).
    con.execute("""
        CREATE TABLE prefix_nodes (
            id TEXT PRIMARY KEY,
            parent TEXT,                    -- NULL at the root
            depth INTEGER NOT NULL,
            kind TEXT NOT NULL,
            role TEXT,
            block_hash TEXT NOT NULL
        )""")
    con.execute("""
        CREATE TABLE turns (
            session_id TEXT NOT NULL,
            idx INTEGER NOT NULL,                       -- 0-based request index within the session
            "at" TIMESTAMPTZ NOT NULL,                  -- UTC ("at" is a DuckDB keyword: quote it)
            model TEXT NOT NULL,
            tail_node TEXT,                             -- last prefix_nodes id (ordered block hashes)
            rest_hash TEXT NOT NULL,                    -- blocks row: other top-level fields + shape
            n_segments INTEGER NOT NULL,
            total_tokens INTEGER NOT NULL,              -- estimated
            body_bytes INTEGER NOT NULL,
            input_tokens INTEGER,
            cache_read_input_tokens INTEGER,
            cache_creation_input_tokens INTEGER,
            cache_creation_5m_input_tokens INTEGER,
            cache_creation_1h_input_tokens INTEGER,
            output_tokens INTEGER,
            usage_source TEXT NOT NULL,                 -- simulated | live | imported
            usage_raw JSON,
            ideal_cache_read INTEGER NOT NULL,
            cost_usd DOUBLE,
            cost_no_cache_usd DOUBLE,
            cache_reason TEXT,                          -- the cache model's reason code
            cache_detail JSON,
            events JSON NOT NULL,                       -- events applied before this request
            request_id TEXT,
            user_text TEXT,
            reply JSON,                                 -- assistant content that answered this request
            -- prefix diff vs the previous request of the session
            diverge_path TEXT,
            diverge_byte BIGINT,
            diverge_token INTEGER,
            shared_prefix_tokens INTEGER,
            pure_append BOOLEAN,
            -- OpenClaw-style observation
            broke BOOLEAN,
            previous_cache_read INTEGER,
            changes JSON,
            explanation TEXT,
            PRIMARY KEY (session_id, idx)
        )""")
    con.execute("""
        CREATE TABLE knowledge (
            id TEXT NOT NULL,
            project_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            key TEXT,                                   -- scenario key, if any
            title TEXT NOT NULL,
            content TEXT NOT NULL,
            category TEXT NOT NULL,
            deleted BOOLEAN NOT NULL,
            updated_at TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (id, version)
        )""")
    con.execute("CREATE INDEX idx_knowledge_project ON knowledge (project_id)")
    con.execute("""
        CREATE TABLE session_state (
            session_id TEXT PRIMARY KEY,
            ltm_pin_text TEXT,
            ltm_pin_keys JSON,
            ltm_cache_text TEXT,
            stable_ltm_text TEXT,
            host_prompt TEXT NOT NULL,
            tools JSON NOT NULL,
            model TEXT NOT NULL,
            extra JSON NOT NULL,                        -- strategy-specific persisted state
            updated_at TIMESTAMPTZ NOT NULL
        )""")
    # The conversation as the agent knows it (strategy-independent); compaction marks rows compacted.
    con.execute("""
        CREATE TABLE session_messages (
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            turn_idx INTEGER NOT NULL,
            message JSON NOT NULL,
            compacted BOOLEAN NOT NULL,
            PRIMARY KEY (session_id, seq)
        )""")
    # Lore's table (docs/seed_designs.md#lore-data-model), same shape.
    con.execute("""
        CREATE TABLE session_prompt_deltas (
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            project_id TEXT NOT NULL,
            selector JSON NOT NULL,
            content JSON NOT NULL,
            PRIMARY KEY (session_id, seq)
        )""")
    con.execute("CREATE INDEX idx_session_prompt_deltas_project ON session_prompt_deltas (project_id)")



@migration
def m002_calibrations(con: duckdb.DuckDBPyConnection) -> None:
    # Fitted token-estimate calibrations (analysis/calibrate.py): measured ~= ratio * estimated + overhead.
    con.execute("""
        CREATE TABLE calibrations (
            model TEXT NOT NULL,                        -- the model the measured turns used ('*' = all)
            tokenizer TEXT NOT NULL,                    -- the estimator that was calibrated
            ratio DOUBLE NOT NULL,
            overhead DOUBLE NOT NULL,                   -- tokens per request
            n INTEGER NOT NULL,                         -- measured turns fitted
            mean_abs_error_pct DOUBLE NOT NULL,         -- calibrated estimate vs measured, in sample
            max_abs_error_pct DOUBLE NOT NULL,
            raw_mean_abs_error_pct DOUBLE NOT NULL,     -- the uncalibrated estimator, same turns
            loo_mean_abs_error_pct DOUBLE,              -- leave-one-out (NULL below 3 turns)
            fitted_at TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (model, tokenizer, fitted_at)
        )""")


@migration
def m003_segment_map(con: duckdb.DuckDBPyConnection) -> None:
    # read / write / uncached per segment, run-length encoded ("r120w3u1"), for segment-map views of
    # stored turns without re-simulating the session.
    con.execute("ALTER TABLE turns ADD COLUMN segment_map TEXT")


@migration
def m004_transport(con: duckdb.DuckDBPyConnection) -> None:
    # how the request travelled (direct simulator, or http to an endpoint): part of the observation
    # snapshot, so a restart must rebuild it from the row rather than guess it from the usage source.
    con.execute("ALTER TABLE turns ADD COLUMN transport TEXT")


@migration
def m005_imports(con: duckdb.DuckDBPyConnection) -> None:
    # Imported sessions (lab.import_log): no strategy, a source (format:file), a parent (sub-agents and
    # compaction calls); each request keeps where it was read and a key that makes re-import idempotent.
    con.execute("ALTER TABLE sessions ALTER COLUMN strategy DROP NOT NULL")
    con.execute("ALTER TABLE sessions ADD COLUMN source TEXT")
    con.execute("ALTER TABLE sessions ADD COLUMN parent_id TEXT")
    con.execute("ALTER TABLE turns ADD COLUMN source_ref TEXT")
    con.execute("ALTER TABLE turns ADD COLUMN dedupe_key TEXT")


@migration
def m006_compact_store(con: duckdb.DuckDBPyConnection) -> None:
    # Content-addressed rows without a PRIMARY KEY: their ART indexes over 32-character hashes were most of a
    # long session's file (about 1 MB per 10k prefix nodes, rewritten at each checkpoint). The store dedups
    # them itself (Store._known_blocks / _known_nodes, loaded at open, checked before every insert), and
    # readers join them by hash. NOT NULL constraints stay.
    con.execute("""
        CREATE TABLE blocks_m006 (
            hash TEXT NOT NULL,
            kind TEXT NOT NULL,
            body TEXT NOT NULL,
            tokens INTEGER,
            bytes INTEGER NOT NULL
        )""")
    con.execute("INSERT INTO blocks_m006 SELECT hash, kind, body, tokens, bytes FROM blocks")
    con.execute("DROP TABLE blocks")
    con.execute("ALTER TABLE blocks_m006 RENAME TO blocks")
    con.execute("""
        CREATE TABLE prefix_nodes_m006 (
            id TEXT NOT NULL,
            parent TEXT,
            depth INTEGER NOT NULL,
            kind TEXT NOT NULL,
            role TEXT,
            block_hash TEXT NOT NULL
        )""")
    con.execute("INSERT INTO prefix_nodes_m006 SELECT id, parent, depth, kind, role, block_hash FROM prefix_nodes")
    con.execute("DROP TABLE prefix_nodes")
    con.execute("ALTER TABLE prefix_nodes_m006 RENAME TO prefix_nodes")
    # How many history messages a strategy built the request from (NULL for recorded requests): with the
    # session_messages rows it gives back the history the previous request saw, so strategies need not
    # persist a message count (and rewrite session_state) on every turn.
    con.execute("ALTER TABLE turns ADD COLUMN n_messages INTEGER")


@migration
def m007_body_problems(con: duckdb.DuckDBPyConnection) -> None:
    # What the API would refuse in a request body an import stored as the log held it (a lenient import:
    # request.validate.check_request): JSON list of {path, problem}; NULL when the body was clean, or checked
    # strictly (record() refuses such a body). A later reader sees the flag without validating again.
    con.execute("ALTER TABLE turns ADD COLUMN body_problems TEXT")


@migration
def m008_pending_events(con: duckdb.DuckDBPyConnection) -> None:
    # The events recorded since a session's last request, one row each: recording one inserts a row instead of
    # rewriting session_state.extra, whose JSON held the whole list (O(pending events) bytes per knowledge.add).
    # The next request deletes its session's rows in its own transaction. No primary key: rows live only until
    # that request, read in seq order.
    con.execute("""
        CREATE TABLE session_pending_events (
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL,                       -- 0, 1, ... in order of recording
            code TEXT NOT NULL                          -- knowledge_add:<short id>, tools, compaction, ...
        )""")
    # A store written before keeps the list in session_state.extra._pending_events: move it into rows.
    con.execute("""
        INSERT INTO session_pending_events
        SELECT session_id, generate_subscripts(codes, 1) - 1, unnest(codes)
        FROM (SELECT session_id, json_extract_string(extra, '$._pending_events[*]') AS codes
              FROM session_state WHERE json_exists(extra, '$._pending_events'))""")
    con.execute("""
        UPDATE session_state SET extra = json_merge_patch(extra, '{"_pending_events": null}')
        WHERE json_exists(extra, '$._pending_events')""")


@migration
def m009_bigint_tokens_and_request_notes(con: duckdb.DuckDBPyConnection) -> None:
    # Token counts as BIGINT: one request reporting 2**31 tokens or more (a long-lived proxy's cumulative figure,
    # a corrupt line) overflowed INT32 and aborted a whole import. Every token count of a request, and a block's
    # estimated tokens, widen; nothing else is a token count.
    for column in ("total_tokens", "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
                   "cache_creation_5m_input_tokens", "cache_creation_1h_input_tokens", "output_tokens",
                   "ideal_cache_read", "diverge_token", "shared_prefix_tokens", "previous_cache_read"):
        con.execute(f"ALTER TABLE turns ALTER COLUMN {column} SET DATA TYPE BIGINT")
    con.execute("ALTER TABLE blocks ALTER COLUMN tokens SET DATA TYPE BIGINT")
    # What a figure of the request assumed, one sentence per line (a cache write whose 5m/1h split was not
    # reported, priced at the 5-minute rate); NULL when nothing was assumed.
    con.execute("ALTER TABLE turns ADD COLUMN notes TEXT")
    # Where cost_usd came from: the price table (``genai-prices anthropic/claude-sonnet-4-6``), explicit prices
    # (``user``) or the cost the provider reported in its response (``reported by provider``); NULL when unpriced.
    con.execute("ALTER TABLE turns ADD COLUMN cost_source TEXT")


@migration
def m010_request_latency(con: duckdb.DuckDBPyConnection) -> None:
    # How long a live call took, from sending the request to its response's last byte (milliseconds), as the
    # capture or the recording proxy measured it; NULL for simulated requests and logs that do not say.
    con.execute("ALTER TABLE turns ADD COLUMN latency_ms DOUBLE")


@migration
def m011_sent_at(con: duckdb.DuckDBPyConnection) -> None:
    # ``turns."at"`` is a DuckDB keyword: ``select idx, at from turns`` failed unless the user knew to quote it.
    # The column is renamed; m001 keeps its name as it shipped.
    con.execute('ALTER TABLE turns RENAME COLUMN "at" TO sent_at')


@migration
def m012_reasoning_tokens(con: duckdb.DuckDBPyConnection) -> None:
    # The part of output_tokens spent reasoning, as the provider reported it (Usage.reasoning_tokens: OpenAI's
    # reasoning_tokens, Codex's reasoning_output_tokens, Gemini's thoughtsTokenCount, OTel's
    # gen_ai.usage.reasoning.output_tokens): a split of the output, never added to it; NULL when not reported.
    con.execute("ALTER TABLE turns ADD COLUMN reasoning_tokens BIGINT")


@migration
def m013_usage_first(con: duckdb.DuckDBPyConnection) -> None:
    # A usage-first import stores each request's measured figures only; what comes from its body (segments,
    # estimated tokens, the ideal read, the prefix diff) is filled in when the session is analysed. Until then
    # those columns are NULL, and the session has a row in ``unanalysed_sessions`` saying how to analyse it.
    for column in ("rest_hash", "n_segments", "total_tokens", "body_bytes", "ideal_cache_read"):
        con.execute(f"ALTER TABLE turns ALTER COLUMN {column} DROP NOT NULL")
    # where the request's bytes live: the log line that opened it (byte offset and length in the decompressed
    # file, and a digest of those bytes, so an analysis can tell the file changed since it was imported)
    con.execute("ALTER TABLE turns ADD COLUMN source_offset BIGINT")
    con.execute("ALTER TABLE turns ADD COLUMN source_length BIGINT")
    con.execute("ALTER TABLE turns ADD COLUMN source_digest TEXT")
    con.execute("""
        CREATE TABLE unanalysed_sessions (
            session_id TEXT PRIMARY KEY,
            import_seq BIGINT NOT NULL,     -- the order a deep import would have stored it in
            file_group TEXT NOT NULL,       -- the import's file group: analysed together, in the import's order
            files JSON NOT NULL             -- the log files its requests were read from
        )""")


@migration
def m014_one_verdict(con: duckdb.DuckDBPyConnection) -> None:
    # One verdict per request (issue #38): ``broke`` now says the request read less than it could have (the rebuild
    # rule of store/_rollups.py); OpenClaw's read-drop verdict, which ``broke`` held until now, moves to its own
    # column as a cross-check. The verdict of an analysed store is recomputed here from its stored causes, with the
    # rule's parameters as they were when this migration was written (a migration is a snapshot: later changes to
    # the codes or the floor must not rewrite what it did). A legacy session (causes never stored) keeps its value
    # until it is analysed again.
    con.execute("ALTER TABLE turns ADD COLUMN openclaw_broke BOOLEAN")
    con.execute("UPDATE turns SET openclaw_broke = broke")
    not_rebuild = ["below_minimum", "cold", "hit", "no_breakpoint", "unsupported"]
    con.execute(_rollups._FLAGGED.format(where="$3::VARCHAR IS NULL") + """
        , verdict AS (SELECT session_id, idx, rebuild FROM x WHERE NOT legacy)
        UPDATE turns SET broke = CASE WHEN turns.cache_read_input_tokens IS NULL THEN NULL ELSE verdict.rebuild END
        FROM verdict WHERE turns.session_id = verdict.session_id AND turns.idx = verdict.idx""",
                [not_rebuild, 256, None])


@migration
def m015_provider_cache_miss_reason(con: duckdb.DuckDBPyConnection) -> None:
    # The provider's own diagnosis of a request's cache prefix (Anthropic's response ``diagnostics``, asked for
    # with ``diagnostics.previous_message_id``; docs/provider_cache_rules.md#anthropic-cache-diagnostics): the
    # ``cache_miss_reason.type`` (``none`` when nothing diverged, ``pending`` when not yet diagnosed) and its
    # estimate of the tokens after the divergence. NULL when nobody asked: a measurement beside our simulation.
    con.execute("ALTER TABLE turns ADD COLUMN provider_cache_miss_reason TEXT")
    con.execute("ALTER TABLE turns ADD COLUMN provider_cache_missed_tokens BIGINT")


def applied(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [r[0] for r in con.execute("SELECT name FROM _migrations ORDER BY applied_order").fetchall()]


def rollback_if_active(con: duckdb.DuckDBPyConnection) -> bool:
    """Roll back the open transaction; False when there is none (COMMIT finished, e.g. before a Ctrl-C landed,
    or DuckDB already ended it). Never raises "no transaction is active" over the error being handled."""
    try:
        con.rollback()
    except duckdb.TransactionException:
        return False
    return True


def migrate(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Apply pending migrations; return the names applied now. Idempotent.

    Each migration, its ``_migrations`` row (and, the first time, the ``_migrations`` table itself) commit
    together: a migration that fails leaves nothing behind. A new store (no ``_migrations`` table yet) gets every
    migration in one transaction: a Ctrl-C or a failure while it is created leaves the file blank, never a store
    some migrations short (which a read-only open and ``doctor`` rightly call incomplete).
    """
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = current_schema() AND table_name = '_migrations'").fetchall()[0][0]
    done = set(applied(con)) if exists else set()
    pending = [(i, fn) for i, fn in enumerate(MIGRATIONS) if fn.__name__ not in done]
    groups = [pending] if not exists and pending else [[item] for item in pending]
    now_applied = []
    for group in groups:
        con.begin()
        try:
            con.execute("""
                CREATE TABLE IF NOT EXISTS _migrations (
                    name TEXT PRIMARY KEY, applied_order INTEGER NOT NULL, applied_at TIMESTAMPTZ NOT NULL
                )""")
            for i, fn in group:
                fn(con)
                con.execute("INSERT INTO _migrations VALUES (?, ?, now())", [fn.__name__, i])
            con.commit()
        except BaseException:
            rollback_if_active(con)
            raise
        now_applied += [fn.__name__ for _, fn in group]
    return now_applied
