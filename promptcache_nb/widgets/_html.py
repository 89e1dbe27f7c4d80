"""Pure HTML renderers shared by the widgets: no ipywidgets, no kernel, deterministic output.

Every piece of request or knowledge content passes through :func:`text_html`: prompts, tool results and
knowledge come from users and logs, so they are data, never markup, and their invisible characters (bidi
controls, zero-width, control characters) are shown as markers by the one implementation in
:mod:`promptcache_nb.request.diff` (``visible_html``). Other values go through :func:`esc`. Styles are
inline because the widgets' HTML is inserted as-is into JupyterLab, VS Code and static exports alike.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._util import escape_dollars
from ..analysis.crosscheck import provider_note
from ..request import PreparedRequest, Segment, canonical_json
from ..request.diff import visible as visible  # re-exported: plain-text markers (dropdown labels, status)
from ..request.diff import visible_html
from ..usage import Usage

STATE_COLORS = {"read": "#2e8b57", "write": "#e0a030", "uncached": "#c8553d"}
STATE_LABELS = {"read": "read from cache", "write": "written to cache", "uncached": "uncached"}

_MONO = "font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:11.5px"
# pre-wrap keeps the text's own line breaks; overflow-wrap breaks a line between words, and inside a word only
# when one is longer than the column (a hash, a URL), never mid-word otherwise
_CELL = (f"{_MONO};line-height:1.35;white-space:pre-wrap;overflow-wrap:anywhere;vertical-align:top;"
         "padding:3px 6px;")
_PATH = "font-size:10.5px;color:#666;font-family:sans-serif;margin-bottom:1px;"
_BOX = "border:1px solid #ddd;border-radius:4px;padding:6px 8px;margin:2px 0;line-height:1.4;"
_OLD = "background:#fbe3e0;"
_NEW = "background:#def3e4;"
_MARK_OLD = "background:#f4a7a0;"
_MARK_NEW = "background:#8fd6a5;"

#: Characters shown before / after the first differing character of the diverging segment.
CONTEXT_BEFORE = 160
CONTEXT_AFTER = 360
#: ... and at most these many lines of them (the lines holding the divergence included).
CONTEXT_LINES_BEFORE = 3
CONTEXT_LINES_AFTER = 8
#: Changed segments after the divergence shown in the side-by-side view before "show all" (the changed region:
#: a run of segments both requests hold unchanged shows as one line, however long).
MAX_ROWS = 3
#: Segments listed under "show all" before "… N more" (the HTML stays bounded on a 2,000-message session).
MAX_ALL_ROWS = 200
#: Characters of a segment shown in a row: one both requests share, and one only this request has
#: (new segments are what a pure append adds, so they get more room).
EXCERPT = 220
EXCERPT_NEW = 700
#: Knowledge entries on one page of the editor's list: its HTML stays bounded however large the book grows.
KNOWLEDGE_PAGE_SIZE = 50
#: Event codes listed (pending ones, those before a request) before "… and N more".
MAX_LISTED_EVENTS = 20


def esc(value: Any) -> str:
    """``str(value)`` as plain, escaped text: safe in attributes too (quotes escaped), and with invisible
    characters as plain markers (``⟨RLO⟩``, ``↵``), so no value can reorder or hide what follows it."""
    return html.escape(visible(str(value)), quote=True)


def text_html(value: Any) -> str:
    """Request or knowledge text as HTML: escaped, invisible characters shown as highlighted markers.

    Line breaks stay line breaks (the views use ``white-space: pre-wrap``); spaces at the end of a line are
    marked too. The markers come from :func:`promptcache_nb.request.diff.visible_html`.
    """
    lines = str(value).split("\n")
    last = len(lines) - 1
    return "\n".join(visible_html(line, ends_line=i < last) for i, line in enumerate(lines))


def fmt_int(n: Any) -> str:
    return "–" if n is None or _isna(n) else f"{int(n):,}"


def fmt_usd(x: Any) -> str:
    return "–" if x is None or _isna(x) else f"${float(x):,.4f}"


def _isna(x: Any) -> bool:
    try:
        return bool(x != x)  # NaN and pd.NA-like values
    except (TypeError, ValueError):
        return True


def segment_text(seg: Segment) -> str:
    """What a reader wants to see of a segment: a text block's text, otherwise its canonical JSON."""
    el = seg.element
    if isinstance(el, str):
        return el
    if isinstance(el, dict) and el.get("type") == "text" and isinstance(text := el.get("text"), str):
        return text
    if isinstance(el, dict) and "cache_control" in el:
        el = {k: v for k, v in el.items() if k != "cache_control"}  # markers never change what matches
    return canonical_json(el)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _excerpt(text: str, limit: int = EXCERPT) -> str:
    if len(text) <= limit:
        return text_html(text)
    return text_html(text[:limit]) + esc(f" … (+{len(text) - limit:,} chars)")


def shared_segments(previous: PreparedRequest | None, current: PreparedRequest) -> int:
    """The number of leading segments whose content hashes match (the cache-relevant shared prefix)."""
    if previous is None:
        return 0
    k = 0
    for a, b in zip(previous.segments, current.segments, strict=False):
        if a.content_hash != b.content_hash or a.kind != b.kind or a.role != b.role:
            break
        k += 1
    return k


def divergence_index(previous: PreparedRequest, current: PreparedRequest, diff: Any = None) -> int:
    """Index of the first segment that differs: the PrefixDiff's when given, else by content hash."""
    if diff is not None and hasattr(diff, "index") and hasattr(diff, "pure_append"):
        if diff.index is None:
            return len(previous.segments)
        return min(int(diff.index), len(previous.segments), len(current.segments))
    return shared_segments(previous, current)


def _attr(obj: Any, *names: str) -> Any:
    for n in names:
        v = getattr(obj, n, None)
        if v is not None:
            return v
    return None


def diff_summary(diff: Any, previous: PreparedRequest | None, current: PreparedRequest | None) -> str:
    """One escaped sentence: where the two requests first differ, and how much prefix they share."""
    if current is None:
        return "no request yet"
    if previous is None:
        return "first request: nothing to compare against, everything is new"
    summary = getattr(diff, "summary", None)
    if callable(summary):  # the PrefixDiff's own wording (request/diff.py)
        return esc(summary())
    k = shared_segments(previous, current)
    shared_tok = sum(s.tokens for s in current.segments[:k])
    path = _attr(diff, "path")
    pure = _attr(diff, "pure_append")
    token_offset = _attr(diff, "token_offset")
    byte_offset = _attr(diff, "byte_offset")
    shared_attr = _attr(diff, "shared_prefix_tokens")
    if shared_attr is not None:
        shared_tok = int(shared_attr)
    if pure is None:
        pure = k == len(previous.segments) and len(current.segments) >= k and previous.model == current.model
    if previous.model != current.model:
        return (f"model changed {esc(previous.model)} → {esc(current.model)}: caches are per model, "
                f"nothing is shared")
    if pure:
        added = len(current.segments) - len(previous.segments)
        return (f"pure append: the previous request is a prefix of this one "
                f"({fmt_int(shared_tok)} shared tokens, +{added} segment{'s' if added != 1 else ''})")
    if path is None and k < len(current.segments):
        path = current.segments[k].path
    elif path is None and k < len(previous.segments):
        path = previous.segments[k].path
    where = f"first difference at <code>{esc(path)}</code>"
    if byte_offset is not None:
        where += f" (byte {fmt_int(byte_offset)}"
        where += f", token ≈{fmt_int(token_offset)})" if token_offset is not None else ")"
    elif token_offset is not None:
        where += f" (token ≈{fmt_int(token_offset)})"
    return f"{where}; shared prefix {fmt_int(shared_tok)} tokens ({k} of {len(current.segments)} segments)"


def _marked(text: str, j: int, mark_style: str) -> str:
    start = max(0, j - CONTEXT_BEFORE)
    head = text[start:j]
    lines = head.split("\n")
    if len(lines) > CONTEXT_LINES_BEFORE:  # a prompt's blank lines would push the change off screen
        head = "\n".join(lines[-CONTEXT_LINES_BEFORE:])
        start = j - len(head)
    if start:  # "…" says text was left out ("… " mid-line: a space ending a line would show as a marker)
        head = ("…" if head.startswith("\n") else "… ") + head
    tail = text[j:j + CONTEXT_AFTER]
    lines = tail.split("\n")
    if len(lines) > CONTEXT_LINES_AFTER:
        tail = "\n".join(lines[:CONTEXT_LINES_AFTER])
    out = text_html(head) + f'<mark style="{mark_style}">{text_html(tail) or "∅"}</mark>'
    left = len(text) - j - len(tail)
    return out + (f" … (+{left:,} chars)" if left else "")


def side_by_side_html(
    previous: PreparedRequest | None, current: PreparedRequest | None, *, diff: Any = None
) -> str:
    """The escaped side-by-side prefix diff: shared segments collapsed, the divergence highlighted with a few
    lines around it, then the changed region (each run of unchanged segments as one line, the first
    :data:`MAX_ROWS` changed segments); the rest under "show all N segments" (an HTML ``<details>``)."""
    if current is None:
        return f'<div style="{_BOX}color:#777">no request yet</div>'
    rows: list[str] = []
    summary = diff_summary(diff, previous, current)
    head = f'<div style="margin:2px 0 4px 0"><b>prefix diff</b> · {summary}</div>'
    if previous is None:
        total = sum(s.tokens for s in current.segments)
        rows.append(
            f'<tr><td colspan="2" style="{_CELL}color:#555">{len(current.segments)} segments, '
            f"{fmt_int(total)} estimated tokens, all new</td></tr>"
        )
        return _table(head, rows)
    p, c = previous.segments, current.segments
    k = divergence_index(previous, current, diff)
    if k:
        tok = sum(s.tokens for s in c[:k])
        span = c[0].path if k == 1 else f"{c[0].path} … {c[k - 1].path}"
        rows.append(
            f'<tr><td colspan="2" style="{_CELL}color:#555;background:#f4f4f4">'
            f"▸ {k} identical segment{'s' if k != 1 else ''} ({esc(span)}), {fmt_int(tok)} tokens</td></tr>"
        )
    field = getattr(diff, "field", None)
    if field is not None:  # a top-level field (model, tool_choice…) invalidates the cache from here
        for ch in getattr(diff, "field_changes", ()) or ():
            label = f'<div style="{_PATH}">{esc(ch.path)} (top-level field)</div>'
            rows.append(
                '<tr data-role="divergence">'
                f'<td style="{_CELL}{_OLD}">{label}<mark style="{_MARK_OLD}">{text_html(ch.before)}</mark></td>'
                f'<td style="{_CELL}{_NEW}">{label}<mark style="{_MARK_NEW}">{text_html(ch.after)}</mark></td></tr>'
            )
        start = k
    elif k < len(p) and k < len(c):
        a, b = segment_text(p[k]), segment_text(c[k])
        j = _common_prefix(a, b)
        rows.append(
            '<tr data-role="divergence">'
            f'<td style="{_CELL}{_OLD}">{_path(p[k])}{_marked(a, j, _MARK_OLD)}</td>'
            f'<td style="{_CELL}{_NEW}">{_path(c[k])}{_marked(b, j, _MARK_NEW)}</td></tr>'
        )
        start = k + 1
    else:
        start = k
    n = max(len(p), len(c))
    rest = [_row(p[i] if i < len(p) else None, c[i] if i < len(c) else None) for i in range(start, n)]
    rows += _changed_region(rest)
    if any(r.same for r in rest) or sum(not r.same for r in rest) > MAX_ROWS:  # something is folded
        # the whole tail, row by row, behind a click: HTML-only, so it opens in JupyterLab, VS Code and a static
        # export alike (no script)
        listed = [r.html for r in rest[:MAX_ALL_ROWS]]
        if len(rest) > MAX_ALL_ROWS:
            listed.append(_note_row(f"… {len(rest) - MAX_ALL_ROWS:,} more segments (pc.diff(previous, current) "
                                    "lists every path)"))
        more = (f'<details class="pcnb-diff-all" style="margin-top:2px"><summary style="font-size:12px;'
                f'cursor:pointer;color:#1f3b73">show all {len(rest):,} segment{"s" if len(rest) != 1 else ""} '
                f"after the divergence</summary>{_rows_table(listed)}</details>")
        return _table(head, rows, _folded_details(diff), more)
    return _table(head, rows, _folded_details(diff))


def _folded_details(diff: Any) -> str:
    """The PrefixDiff's own table (path, offsets, lists of paths), folded under its summary line."""
    if diff is None or not hasattr(diff, "_repr_html_"):
        return ""
    return ('<details style="margin:2px 0 4px 0"><summary style="font-size:12px;cursor:pointer">'
            f"PrefixDiff details</summary>{diff._repr_html_()}</details>")


@dataclass(frozen=True)
class _Row:
    """One segment position after the divergence: its two cells as HTML, and whether both sides hold the same
    content there (sent again uncached, but unchanged)."""

    html: str
    same: bool
    path: str
    tokens: int


def _row(left: Segment | None, right: Segment | None) -> _Row:
    same = left is not None and right is not None and left.content_hash == right.content_hash
    lstyle = "" if same else _OLD
    rstyle = "" if same else _NEW
    left_html = _path(left) + _excerpt(segment_text(left)) if left else ""
    limit = EXCERPT if same else EXCERPT_NEW
    right_html = _path(right) + _excerpt(segment_text(right), limit) if right else ""
    seg = right or left
    assert seg is not None  # a row has a segment on one side at least
    return _Row(f'<tr><td style="{_CELL}{lstyle if left else ""}">{left_html}</td>'
                f'<td style="{_CELL}{rstyle if right else ""}">{right_html}</td></tr>',
                same, seg.path, right.tokens if right else 0)


def _note_row(text: str, *, shaded: bool = False) -> str:
    return (f'<tr><td colspan="2" style="{_CELL}color:#555{";background:#f4f4f4" if shaded else ""}">'
            f"{esc(text)}</td></tr>")


def _changed_region(rest: Sequence[_Row]) -> list[str]:
    """The rows after the divergence as the view shows them before "show all": each run of unchanged segments
    as one line, the first :data:`MAX_ROWS` changed ones in full, then how many changed ones are left."""
    out: list[str] = []
    changed = 0
    i = 0
    while i < len(rest):
        if rest[i].same:
            j = i
            while j < len(rest) and rest[j].same:
                j += 1
            run = rest[i:j]
            span = run[0].path if len(run) == 1 else f"{run[0].path} … {run[-1].path}"
            out.append(_note_row(f"▸ {len(run)} unchanged segment{'s' if len(run) != 1 else ''} ({span}), "
                                 f"{sum(r.tokens for r in run):,} tokens: the same content, sent again after "
                                 "the divergence", shaded=True))
            i = j
            continue
        if changed == MAX_ROWS:
            left = sum(not r.same for r in rest[i:])
            out.append(_note_row(f"… {left} more changed segment{'s' if left != 1 else ''} (show all, below)"))
            break
        out.append(rest[i].html)
        changed += 1
        i += 1
    return out


def _path(seg: Segment) -> str:
    return f'<div style="{_PATH}">{esc(seg.path)} · {seg.tokens:,} tok</div>'


_COLUMNS = ('<table style="border-collapse:collapse;width:100%;table-layout:fixed">'
            '<colgroup><col style="width:50%"><col style="width:50%"></colgroup>')


def _rows_table(rows: list[str]) -> str:
    return _COLUMNS + "".join(rows) + "</table>"


def _table(head: str, rows: list[str], details: str = "", more: str = "") -> str:
    return (
        f'<div class="pcnb-diff" style="{_BOX}">{head}{details}'
        + _COLUMNS
        + '<tr><th style="text-align:left;font-size:11px">previous request</th>'
        '<th style="text-align:left;font-size:11px">this request</th></tr>'
        + "".join(rows)
        + f"</table>{more}</div>"
    )


#: Why a segment map has no states, by case (the map says the one that applies, never a guess).
NO_STATES_MEASURED = "measured usage: the API reports totals, not a state per segment"
NO_STATES_SIMULATED = "the cache model reported no state per segment for this request"
NO_STATES_GIVEN = ("no segment states were passed: DiffView.for_turns(turn) or states=turn.segment_states "
                   "colours them")


def no_states_reason(measured: bool) -> str:
    """Why a stored request has no per-segment states: its usage is measured (the API reports totals), or the
    cache model simulating it reported none."""
    return NO_STATES_MEASURED if measured else NO_STATES_SIMULATED


def segment_map_html(segments: Sequence[Segment], states: Sequence[str], *, why: str | None = None) -> str:
    """A strip with one box per segment, as wide as its tokens, coloured read / write / uncached.

    Without states, one line says why (``why``: :data:`NO_STATES_MEASURED`, :data:`NO_STATES_SIMULATED` or
    :data:`NO_STATES_GIVEN`, the default)."""
    if not segments:
        return ""
    if len(states) != len(segments):
        return (f'<div class="pcnb-segmap-missing" style="{_BOX}color:#777;font-size:12px">segment map: no '
                f"per-segment cache states ({esc(why or NO_STATES_GIVEN)})</div>")
    total = sum(max(s.tokens, 1) for s in segments)
    boxes, sums = [], dict.fromkeys(STATE_COLORS, 0)
    for seg, st in zip(segments, states, strict=True):
        sums[st] = sums.get(st, 0) + seg.tokens
        pct = 100 * max(seg.tokens, 1) / total
        boxes.append(
            f'<div data-state="{esc(st)}" title="{esc(seg.path)} · {seg.tokens:,} tok · {esc(st)}" '
            f'style="flex:0 0 {pct:.3f}%;min-width:2px;height:16px;background:{STATE_COLORS.get(st, "#999")};'
            'border-right:1px solid #fff;box-sizing:border-box"></div>'
        )
    legend = " · ".join(
        f'<span style="color:{STATE_COLORS[k]}">■</span> {STATE_LABELS[k]} {fmt_int(v)}'
        for k, v in sums.items()
    )
    return (
        f'<div class="pcnb-segmap" style="{_BOX}">'
        '<div style="font-size:12px;margin-bottom:3px"><b>segment map</b> '
        f"(tools → system → messages; estimated tokens) {legend}</div>"
        f'<div style="display:flex;width:100%;border:1px solid #ccc">{"".join(boxes)}</div></div>'
    )


def usage_html(
    usage: Usage,
    *,
    ideal_cache_read: int | None = None,
    cost_usd: float | None = None,
    cost_no_cache_usd: float | None = None,
    cache_reason: str | None = None,
) -> str:
    """Usage of one request as a small table, with the measured / simulated label."""
    rows = [
        ("cache read", fmt_int(usage.cache_read_input_tokens), STATE_COLORS["read"]),
        ("cache write", fmt_int(usage.cache_creation_input_tokens), STATE_COLORS["write"]),
        ("uncached", fmt_int(usage.input_tokens), STATE_COLORS["uncached"]),
        ("output", fmt_int(usage.output_tokens), "#555"),
    ]
    if ideal_cache_read is not None:
        rows.append(("ideal cache read", fmt_int(ideal_cache_read), "#1f3b73"))
    body = "".join(
        f'<tr><td style="padding:1px 8px 1px 0"><span style="color:{color}">■</span> {name}</td>'
        f'<td style="text-align:right;{_MONO}" data-field="{name.replace(" ", "_")}">{value}</td></tr>'
        for name, value, color in rows
    )
    extra = ""
    if cost_usd is not None:
        extra += f"<div>cost {fmt_usd(cost_usd)} (no caching: {fmt_usd(cost_no_cache_usd)})</div>"
    if cache_reason:
        extra += f"<div>cache model: <code>{esc(cache_reason)}</code></div>"
    return (
        f'<div class="pcnb-usage" style="{_BOX}font-size:12.5px"><b>usage</b> · '
        f'<i data-field="label">{esc(usage.label)}</i><table style="border-collapse:collapse">{body}</table>'
        f"{extra}</div>"
    )


def _changes(value: Any) -> list[str]:
    if value is None or (not isinstance(value, str | list | tuple | dict) and _isna(value)):
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return [value]
    if isinstance(value, dict):
        value = [value]
    out = []
    for ch in value if isinstance(value, Iterable) else [value]:
        if isinstance(ch, dict):
            code, detail = ch.get("code"), ch.get("detail")
        else:
            code, detail = getattr(ch, "code", None), getattr(ch, "detail", None)
        if code is None:
            out.append(str(ch))
        else:
            out.append(f"{code}: {detail}" if detail else str(code))
    return out


def observation_html(
    observation: Any = None,
    *,
    row: dict[str, Any] | None = None,
    cache_reason: str | None = None,
    cache_detail: dict[str, Any] | None = None,
) -> str:
    """The observation (the verdict, OpenClaw's change codes, the explanation), from the object or the stored
    row. The verdict is ``broke`` (the request read less than it could have), never OpenClaw's read-drop rule."""
    row = row or {}
    broke = _attr(observation, "broke")
    if broke is None:
        broke = row.get("broke")
    changes = _changes(_attr(observation, "changes") if observation is not None else row.get("changes"))
    explanation = _attr(observation, "explanation")
    if explanation is None:
        explanation = row.get("explanation")
    prev_read = _attr(observation, "previous_cache_read")
    if prev_read is None:
        prev_read = row.get("previous_cache_read")
    parts = []
    if broke is not None and not _isna(broke):
        verdict = ("<b style='color:#c8553d'>cache break</b>" if bool(broke)
                   else "<b style='color:#2e8b57'>no break</b>")
        lost = _attr(observation, "lost_tokens")
        if bool(broke) and lost:
            verdict += f": sent again {fmt_int(lost)} tokens the cache held"
        elif prev_read is not None and not _isna(prev_read):
            verdict += f" (previous request read {fmt_int(prev_read)})"
        parts.append(f"<div>{verdict}</div>")
    if changes:
        listed = "; ".join(f"<code>{text_html(c)}</code>" for c in changes[:MAX_LISTED_EVENTS])
        if len(changes) > MAX_LISTED_EVENTS:
            listed += f" … and {len(changes) - MAX_LISTED_EVENTS:,} more"
        parts.append(f"<div>changes: {listed}</div>")
    if explanation is not None and not _isna(explanation) and str(explanation):
        parts.append(f'<div data-field="explanation">{text_html(explanation)}</div>')  # may quote content
    provider = provider_note(row) if row else None  # the provider's own diagnosis beside ours (a measurement)
    if provider:
        parts.append(f'<div data-field="provider">{text_html(provider)}</div>')
    if not parts and cache_reason:
        where = (cache_detail or {}).get("divergence_path")
        text = f"cache model reason <code>{esc(cache_reason)}</code>"
        if where:
            text += f" — divergence at <code>{esc(where)}</code>"
        parts.append(f"<div>{text}</div>")
    if not parts:
        parts.append("<div style='color:#777'>no observation for this turn</div>")
    return (f'<div class="pcnb-observation" style="{_BOX}font-size:12.5px"><b>observation</b>'
            f'{"".join(parts)}</div>')


def error_html(exc: BaseException) -> str:
    """A visible, escaped error box for a failed click (the widget never swallows a callback error)."""
    return (
        f'<div class="pcnb-error" style="{_BOX}border-color:#c8553d;background:#fdf0ee;color:#8a1f11">'
        f"<b>{esc(type(exc).__name__)}</b>: {text_html(exc)}</div>"
    )


def _code_list(codes: Sequence[str], limit: int = MAX_LISTED_EVENTS) -> str:
    """Event codes as ``<code>`` items, the first ``limit`` of them and "… and N more"."""
    shown = ", ".join(f"<code>{esc(e)}</code>" for e in codes[:limit])
    if len(codes) > limit:
        shown += f" … and {len(codes) - limit:,} more"
    return shown


def header_html(
    *, index: int | None, n_requests: int, at: Any = None, events: Sequence[str] = (),
    user_text: str | None = None,
    scenario: str | None = None, position: int | None = None, n_scenario: int | None = None,
    pending: Sequence[str] = (), batch: tuple[int, int] | None = None,
) -> str:
    """"Request i" (of those stored) plus when, which events preceded it, what the user said, and how far
    the scenario is ("4 of 12 scenario turns played": a scenario turn is one user turn, which sends one
    request, or several with a tool loop)."""
    if index is None:
        title = f'<b data-field="request">no requests yet</b> · {n_requests} stored'
    else:
        title = (f'<b data-field="request">Request {index}</b> '
                 f'<span style="color:#555">(requests 0–{n_requests - 1} stored)</span>')
        if at is not None:
            title += f" · {esc(f'{at:%Y-%m-%d %H:%M:%S}')} UTC"
    if scenario is not None and n_scenario is not None:
        title += (f' · scenario <code>{esc(scenario)}</code>: <span data-field="played">{position} of '
                  f"{n_scenario}</span> scenario turns played")
    lines = [f"<div>{title}</div>"]
    if batch is not None and batch[0] != batch[1]:
        lines.append('<div style="font-size:12px">'
                     f"this scenario turn sent requests {batch[0]}–{batch[1]} (a tool loop); "
                     "the slider shows each</div>")
    if index is not None:
        ev = _code_list(events) or "none"
        lines.append(f'<div style="font-size:12px">events before this request: {ev}</div>')
        if user_text:
            lines.append(f'<div style="font-size:12px">user: {_excerpt(user_text, 200)}</div>')
    if pending:
        lines.append(
            '<div style="font-size:12px;color:#6a3d9a">pending for the next request: '
            + _code_list(pending) + "</div>"
        )
    return f'<div class="pcnb-header" style="font-size:13px">{"".join(lines)}</div>'


def status_html(text: str, *, kind: str = "info") -> str:
    """The one-line "what the last click did" under a widget's buttons (``kind``: info, busy, warn)."""
    if not text:
        return ""
    color = {"info": "#1f3b73", "busy": "#555", "warn": "#8a5a00"}.get(kind, "#1f3b73")
    return (f'<div class="pcnb-status" data-kind="{esc(kind)}" style="font-size:12.5px;color:{color};'
            f'margin:2px 0">{text_html(text)}</div>')


#: The one line over the stepper's side-by-side columns where they are narrow, and the width below which it shows.
PAIR_HINT = "narrow window: collapse the file browser (Ctrl+B) to see both side by side at full width"
PAIR_HINT_BELOW_PX = 900
#: The hint as HTML, shown only while its own full-width box (``pcnb-pair-hint-box``) is narrower than
#: :data:`PAIR_HINT_BELOW_PX`: a CSS container query, so it needs no script and follows the file browser being
#: opened or closed. Where container queries are unknown the line simply shows.
PAIR_HINT_HTML = (
    "<style>.pcnb-pair-hint-box { container-type: inline-size; } "
    f"@container (min-width: {PAIR_HINT_BELOW_PX}px) {{ .pcnb-pair-hint {{ display: none; }} }}</style>"
    f'<div class="pcnb-pair-hint" style="font-size:12.5px;color:#8a5a00;margin:2px 0">{esc(PAIR_HINT)}</div>')


def png_html(png: bytes, *, alt: str) -> str:
    """A PNG inlined as a data URL (static snapshots: no kernel, no file next to the notebook)."""
    if not png:
        return ""
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{esc(alt)}" style="max-width:100%" src="data:image/png;base64,{data}">'


#: nbconvert's and JupyterLab's rendered-HTML styles right-align table cells; a snapshot reads like the live
#: widget, left-aligned (cells that align numbers right say so in their own inline style, which wins).
#: (specific enough to beat ``:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon td``)
SNAPSHOT_CSS = ("div.pcnb-snapshot.pcnb-snapshot td, div.pcnb-snapshot.pcnb-snapshot th, "
                "div.pcnb-snapshot.pcnb-snapshot tr { text-align: left; vertical-align: top; }")


def snapshot_html(kind: str, body: str) -> str:
    """A widget's static snapshot: what a notebook shows where no kernel runs (GitHub, nbviewer, nbconvert).

    The live widget view is preferred wherever ipywidgets runs; this HTML is the fallback beside it in the
    same output, so an unrun notebook still shows the widget's state when its cell last ran.
    """
    return escape_dollars(
        f'<div class="pcnb-snapshot pcnb-snapshot-{esc(kind)}" style="{_BOX}text-align:left">'
        f"<style>{SNAPSHOT_CSS}</style>"
        '<div style="font-size:11px;color:#777;margin-bottom:2px">static snapshot of the '
        f"{esc(kind)} widget as its cell last ran (run the notebook for the live widget)</div>"
        f"{body}</div>")


@dataclass(frozen=True)
class KnowledgePage:
    """One page of the knowledge editor's list, and where it sits among the entries.

    ``rows`` are the page's rows (raw text); ``first`` is the index of ``rows[0]`` among the ``matching``
    entries (those the ``query`` keeps, all ``total`` entries without one); ``page`` counts from 0.
    """

    rows: tuple[dict[str, Any], ...]
    page: int
    pages: int
    first: int
    matching: int
    total: int
    query: str = ""
    page_size: int = KNOWLEDGE_PAGE_SIZE

    @property
    def has_previous(self) -> bool:
        return self.page > 0

    @property
    def has_next(self) -> bool:
        return self.page < self.pages - 1

    @property
    def label(self) -> str:
        """"entries 1–50 of 100,000" (plain text; a query is shown with invisible characters as markers)."""
        whole = f"{self.total:,} in all"
        if self.query:
            if not self.matching:
                return f"no entries match “{visible(self.query)}” ({whole})"
            return (f"entries {self.first + 1:,}–{self.first + len(self.rows):,} of {self.matching:,} matching "
                    f"“{visible(self.query)}” ({whole})")
        if not self.total:
            return "no entries"
        return f"entries {self.first + 1:,}–{self.first + len(self.rows):,} of {self.total:,}"


def _matches(row: dict[str, Any], needle: str) -> bool:
    return any(needle in str(row.get(name) or "").casefold()
               for name in ("title", "category", "content", "short_id", "key"))


def knowledge_page(rows: Sequence[dict[str, Any]], *, page: int = 0, query: str = "",
                   containing: str | None = None, page_size: int = KNOWLEDGE_PAGE_SIZE) -> KnowledgePage:
    """One page of knowledge rows: those whose title, category, content, short id or key contain ``query``
    (case-insensitive), ``page_size`` at a time. ``page`` is clamped to the pages there are; ``containing``
    (an entry id) picks the page holding that entry instead, when the query keeps it.

    Only the page's rows are kept, so rendering costs the same for 50 entries or 100,000.

    Example:
        >>> rows = [{"id": f"id{i}", "short_id": f"id{i}", "title": f"t{i}", "category": "note",
        ...          "version": 1, "content": "c", "key": None} for i in range(120)]
        >>> knowledge_page(rows, page=2).label
        'entries 101–120 of 120'
        >>> knowledge_page(rows, containing="id60").page
        1
    """
    if page_size < 1:
        raise ValueError(f"page_size must be at least 1, not {page_size}")
    needle = query.strip().casefold()
    matching = [r for r in rows if _matches(r, needle)] if needle else rows
    pages = max(1, -(-len(matching) // page_size))
    if containing:
        at = next((i for i, r in enumerate(matching) if r.get("id") == containing), None)
        if at is not None:
            page = at // page_size
    page = min(max(page, 0), pages - 1)
    first = page * page_size
    return KnowledgePage(rows=tuple(matching[first:first + page_size]), page=page, pages=pages, first=first,
                         matching=len(matching), total=len(rows), query=query.strip(), page_size=page_size)


def knowledge_table_html(rows: Sequence[dict[str, Any]] | KnowledgePage, *, pending: Sequence[str] = ()) -> str:
    """The editor's list, one page of it: title, category, short id, version, content (escaped and
    shortened), under "entries 1–50 of N" when there is more than one page. ``rows``: a
    :class:`KnowledgePage`, or every row (then their first page)."""
    view = rows if isinstance(rows, KnowledgePage) else knowledge_page(rows)
    if not view.rows:
        empty = "no knowledge entries" if not view.total else "no entries on this page"
        body = f'<tr><td colspan="5" style="color:#777;padding:3px 6px">{esc(empty)}</td></tr>'
    else:
        body = "".join(
            f'<tr data-id="{esc(r["short_id"])}">'
            f'<td style="{_MONO};padding:2px 6px">{esc(r["short_id"])}</td>'
            f'<td style="padding:2px 6px;overflow-wrap:normal">{text_html(r["title"])}</td>'
            f'<td style="padding:2px 6px;white-space:nowrap">{text_html(r["category"])}</td>'
            f'<td style="padding:2px 6px;text-align:right">v{int(r["version"])}</td>'
            f'<td style="padding:2px 6px;color:#555;font-size:11.5px">{_excerpt(r["content"], 90)}</td></tr>'
            for r in view.rows
        )
    note = ""
    if pending:
        note = ('<div style="font-size:12px;color:#6a3d9a">applies before the next request: '
                + _code_list(pending) + "</div>")
    where = ""  # a book of one page lists every entry: nothing to say
    if view.pages > 1 or view.query:
        where = f' · <span data-field="page">{esc(view.label)}</span>'
    return (
        f'<div class="pcnb-knowledge" style="{_BOX}font-size:12.5px"><b>knowledge</b> ({view.total:,} entries)'
        f"{where}"
        '<table style="border-collapse:collapse;width:100%">'
        '<tr style="text-align:left;font-size:11px;color:#555"><th>id</th><th>title</th><th>category</th>'
        f"<th>version</th><th>content</th></tr>{body}</table>{note}</div>"
    )


def summary_table_html(rows: Sequence[dict[str, Any]]) -> str:
    """Compare's table: one row per strategy."""
    cols: list[tuple[str, str, Callable[[Any], str]]] = [
        ("strategy", "strategy", lambda v: f"<code>{esc(v)}</code>"),
        ("requests", "requests", fmt_int),
        ("cache read %", "cache_read_pct", lambda v: f"{float(v):.1f}%"),
        # a ratio 0–1, as the CLI, the report and compare_df give it (one unit everywhere)
        ("efficiency (0–1)", "efficiency", lambda v: "n/a" if _isna(v) else f"{float(v):.3f}"),
        ("cache write", "cache_write", fmt_int),
        ("uncached", "uncached", fmt_int),
        ("breaks", "breaks", fmt_int),
        ("cost", "cost_usd", fmt_usd),
        ("saved vs no cache", "saved_usd", fmt_usd),
        ("last reason", "last_reason", lambda v: f"<code>{esc(v)}</code>" if v else "–"),
    ]
    head = "".join(f'<th style="text-align:right;padding:2px 8px">{esc(name)}</th>' for name, _, _ in cols)
    body = "".join(
        "<tr>" + "".join(
            f'<td style="text-align:right;padding:2px 8px;{_MONO}">{fmt(r.get(key))}</td>'
            for _, key, fmt in cols
        ) + "</tr>"
        for r in rows
    )
    return (f'<div class="pcnb-compare" style="{_BOX}font-size:12.5px">'
            f'<table style="border-collapse:collapse"><tr>{head}</tr>{body}</table></div>')
