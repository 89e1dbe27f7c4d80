"""SQL over every stored request at once: the rebuild rule and the per-session and per-group totals.

One query answers for a whole Lab (or a list of sessions) what a per-session Python loop answered one session at
a time (issue #23: 0.5 s per session before). The rule is the one :func:`~promptcache_nb.rebuilds` documents; the
analysis binds its parameters (the noise floor, the reason codes that are no rebuild), so the codes stay in
``cache/_reasons.py``:

* a **measured** request (live or imported usage), not a session's first, is a rebuild when its stored cause
  (``cache_detail.lost_tokens``, written by ``analysis.cause.measured_cause``) lost more than the noise floor and
  it names a cause: its ``cache_reason``, or the ``rebuild_reason`` found for a loss under the stored floor;
* a **simulated** request (idx > 0) is a rebuild when its cache model did not call it a hit and it sent again some
  of what the previous request held (``cache_detail.simulated_lost_tokens`` above 0, written by
  ``analysis._ideal.simulated_lost``); a request stored before that figure was stored, when it read less than the
  previous request carried over (``min(previous total, total)``).

A session is **legacy** when a cause it needs was never stored — a simulated request without ``cache_reason``, or a
measured one without ``lost_tokens`` whose previous sent request was measured (a store written before causes
were stored): the analysis recomputes those sessions from their bodies.
"""

from __future__ import annotations

#: ``f``: the requests of the sessions matched (``{where}``: :func:`where_sessions`), their figures only.
_TURNS = """
WITH f AS (
    SELECT session_id, idx, sent_at, model, total_tokens, input_tokens, cache_read_input_tokens,
           cache_creation_input_tokens, cache_creation_1h_input_tokens, output_tokens, usage_source, cache_reason,
           cost_usd, cost_no_cache_usd, ideal_cache_read, broke, openclaw_broke,
           usage_source IN ('live', 'imported') AS measured,
           input_tokens + cache_read_input_tokens + cache_creation_input_tokens AS known_total
    FROM turns WHERE {where})
"""
# The stored cause's figures are read from ``cache_detail`` here, once. ``candidate``: the part of the rule a row
# decides alone (all of it for a measured request; a simulated one also needs the previous request's total). The
# JSON text rides through the windows only on candidates (on every row, sorting it cost 5x the query; joined back
# from ``turns``, a second scan of the table cost a fifth of one session's query).
_FLAGGED = """
WITH c AS (
    SELECT session_id, idx, sent_at, model, total_tokens, input_tokens, cache_read_input_tokens,
           cache_creation_input_tokens, cache_creation_1h_input_tokens, output_tokens, usage_source, cache_reason,
           cache_detail, usage_source IN ('live', 'imported') AS measured,
           input_tokens + cache_read_input_tokens + cache_creation_input_tokens AS known_total,
           coalesce(TRY_CAST(coalesce(j[1], j[3]) AS BIGINT), 0) AS lost, coalesce(j[1], j[3]) IS NOT NULL AS has_lost,
           j[2] AS found_reason
    FROM (SELECT *, json_extract_string(cache_detail,  -- one parse
                                        ['$.lost_tokens', '$.rebuild_reason', '$.simulated_lost_tokens']) AS j
          FROM turns WHERE {where})),
f AS (
    SELECT * EXCLUDE (cache_detail, candidate), candidate, CASE WHEN candidate THEN cache_detail END AS cache_detail
    FROM (SELECT *,
                 CASE WHEN measured THEN lost > $2 AND coalesce(cache_reason, '') NOT IN ('cold', 'below_minimum')
                                         AND (CASE WHEN cache_reason IS NULL OR list_contains($1, cache_reason)
                                                   THEN found_reason ELSE cache_reason END) IS NOT NULL
                      ELSE idx > 0 AND cache_read_input_tokens IS NOT NULL AND coalesce(cache_reason, '') <> 'hit'
                           AND (NOT has_lost OR lost > 0)
                 END AS candidate
          FROM c)),
w AS (
    SELECT *, coalesce(known_total, total_tokens) AS total,
           row_number() OVER s AS pos,
           lag(coalesce(known_total, total_tokens)) OVER s AS prev_total,
           lag(sent_at) OVER s AS prev_at,
           -- the previous request that reached the API (a prompt total above 0): was it measured?
           last_value(CASE WHEN known_total > 0 THEN measured END IGNORE NULLS)
               OVER (s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_sent_measured
    FROM f WINDOW s AS (PARTITION BY session_id ORDER BY idx)),
x AS (
    SELECT *,
           CASE WHEN pos = 1 THEN false
                WHEN measured THEN candidate
                ELSE candidate AND (has_lost OR cache_read_input_tokens < greatest(0, least(prev_total, total)))
           END AS rebuild,
           bool_or(CASE WHEN measured THEN pos > 1 AND NOT has_lost AND known_total > 0
                                           AND coalesce(prev_sent_measured, false)
                        ELSE cache_reason IS NULL END) OVER (PARTITION BY session_id) AS legacy
    FROM w)
"""

#: Parameters: ``$1`` the reason codes that are no rebuild, ``$2`` the noise floor, ``$3`` the sessions
#: (:func:`where_sessions`).
#: Every rebuild of the sessions matched (and the first row of each legacy session, ``legacy`` true), in order.
REBUILD_ROWS = _FLAGGED + """
SELECT x.session_id, x.idx, x.sent_at, x.model, x.measured, x.usage_source, x.input_tokens, x.cache_read_input_tokens,
       x.cache_creation_input_tokens, x.cache_creation_1h_input_tokens, x.output_tokens, x.total, x.prev_total,
       x.lost, epoch(x.sent_at - x.prev_at) AS gap_seconds, x.cache_reason, x.cache_detail, x.legacy,
       s.cache_model, json_extract(s.config, '$.prices')::VARCHAR AS session_prices
FROM x JOIN sessions s ON s.id = x.session_id
WHERE (x.rebuild AND NOT x.legacy) OR (x.legacy AND x.pos = 1)
ORDER BY x.session_id, x.idx
"""

#: The sum columns every roll-up carries (a request's figures; NULLs are unknown, summed as nothing).
_SUMS = """
    count(*) AS requests,
    count(*) FILTER (WHERE measured) AS measured_requests,
    coalesce(sum(cache_read_input_tokens), 0) AS cache_read,
    coalesce(sum(cache_creation_input_tokens), 0) AS cache_write,
    coalesce(sum(input_tokens), 0) AS uncached,
    coalesce(sum(ideal_cache_read), 0) AS ideal_cache_read,
    count(*) FILTER (WHERE broke) AS breaks,
    count(*) FILTER (WHERE openclaw_broke) AS openclaw_breaks,
    sum(cost_usd) AS cost_usd,
    sum(cost_no_cache_usd) AS cost_no_cache_usd,
    count(cost_usd) AS priced_requests
"""

#: One row per session (every session of the store, or those matched), in creation order (rebuilds are counted
#: from :data:`REBUILD_ROWS` by the analysis, which also prices them).
SESSION_TOTALS = _TURNS + """
, per AS (SELECT session_id, """ + _SUMS + """, min(sent_at) AS started,
                   string_agg(DISTINCT model, ', ' ORDER BY model) AS models
            FROM f GROUP BY session_id)
SELECT s.id AS session, s.project_id AS project, s.strategy, s.cache_model AS cache, s.model,
       coalesce(s.parent_id, '') AS parent, coalesce(s.source, '') AS source, s.created_at,
       coalesce(per.requests, 0) AS requests, coalesce(per.measured_requests, 0) AS measured_requests,
       coalesce(per.cache_read, 0) AS cache_read, coalesce(per.cache_write, 0) AS cache_write,
       coalesce(per.uncached, 0) AS uncached, coalesce(per.ideal_cache_read, 0) AS ideal_cache_read,
       coalesce(per.breaks, 0) AS breaks, coalesce(per.openclaw_breaks, 0) AS openclaw_breaks, per.cost_usd,
       per.cost_no_cache_usd, coalesce(per.priced_requests, 0) AS priced_requests, per.started,
       coalesce(per.models, s.model, '') AS models
FROM sessions s LEFT JOIN per ON per.session_id = s.id
WHERE {where_s}
ORDER BY s.created_at, s.id
"""

#: What a measured request may be grouped by: its session's project, its own model, its UTC day or hour, the
#: billing window it falls in (``w.start``: the latest window start at or before it, ``$1`` the starts).
GROUP_KEYS = {
    "project": "s.project_id",
    "model": "f.model",
    "day": """CAST(timezone('UTC', f.sent_at) AS DATE)""",
    "hour": """date_trunc('hour', timezone('UTC', f.sent_at))""",
    "window": "w.start",
}

#: One row per group of the measured requests (``{key}``: a :data:`GROUP_KEYS` value; ``{windows}``: the join to
#: the billing windows' starts when grouping by window, else nothing).
GROUP_TOTALS = _TURNS.format(where="true") + """
SELECT {key} AS "group", count(DISTINCT f.session_id) AS sessions, """ + _SUMS + """
FROM f JOIN sessions s ON s.id = f.session_id {windows}
WHERE measured
GROUP BY ALL ORDER BY 1
"""
#: The join :data:`GROUP_TOTALS` uses for windows: each request to the latest window start at or before it.
WINDOW_JOIN = """ASOF JOIN (SELECT unnest($1::TIMESTAMPTZ[]) AS start) w ON f.sent_at >= w.start"""

#: The time of every measured request (live or imported usage), oldest first: what the billing windows are cut from.
MEASURED_TIMES = """
SELECT sent_at FROM turns WHERE usage_source IN ('live', 'imported') ORDER BY sent_at
"""

#: One session's requests in order, their measured (or simulated) figures and their stored cause: ``$1`` the
#: session. ``cause`` is the stored explanation, else the reason code, else NULL (not analysed yet).
SESSION_REQUESTS = """
SELECT idx, sent_at, model, cache_read_input_tokens AS cache_read, cache_creation_input_tokens AS cache_write,
       input_tokens AS uncached, output_tokens AS output, cost_usd, cost_no_cache_usd,
       CASE WHEN usage_source IN ('live', 'imported') THEN 'measured' ELSE 'simulated' END AS usage,
       coalesce(explanation, cache_reason) AS cause
FROM turns WHERE session_id = $1 ORDER BY idx
"""

#: Each account-scope session's first request (the scope's owner: ``config.account``, else ``local``), and, when
#: it read something, the latest request another session of the account (same cache model) sent within an hour
#: before it that left at least that much cached (read + write): the likely writer, by size and time. ``$1``:
#: the default account.
FIRST_READS = """
WITH s AS (
    SELECT id, cache_model, coalesce(json_extract_string(config, '$.account'), $1) AS account
    FROM sessions WHERE json_extract_string(config, '$.cache_scope') = 'account'),
first AS (
    SELECT t.session_id, s.account, s.cache_model, t.sent_at, t.usage_source, t.cache_read_input_tokens AS read,
           t.cache_detail
    FROM turns t JOIN s ON s.id = t.session_id WHERE t.idx = 0),
writer AS (
    SELECT f.session_id, arg_max(o.session_id, o.sent_at) AS likely_writer, max(o.sent_at) AS written_at
    FROM first f JOIN s os ON os.account = f.account AND os.cache_model = f.cache_model AND os.id != f.session_id
    JOIN turns o ON o.session_id = os.id
    WHERE f.read > 0 AND o.sent_at < f.sent_at AND o.sent_at >= f.sent_at - INTERVAL 1 HOUR
      AND o.cache_read_input_tokens + o.cache_creation_input_tokens >= f.read
    GROUP BY f.session_id)
SELECT f.session_id, f.account, f.sent_at, f.usage_source, f.read, f.cache_detail, w.likely_writer, w.written_at
FROM first f LEFT JOIN writer w USING (session_id)
ORDER BY f.sent_at, f.session_id
"""


def where_sessions(session_ids: list[str] | None, param: str, column: str = "session_id") -> tuple[str, object]:
    """A filter on ``column`` to the sessions named by the parameter ``param`` (``$3``) and that parameter's value:
    one id compares equal (DuckDB then skips the other sessions' row groups), several are a list, None is all."""
    if session_ids is None:
        return f"{param}::VARCHAR IS NULL", None
    if len(session_ids) == 1:
        return f"{column} = {param}::VARCHAR", session_ids[0]
    return f"list_contains({param}::VARCHAR[], {column})", session_ids
