"""First divergence of two ~1 MB request bodies: ``pc.diff(a_dict, b_dict)`` beside a plain serialise-and-compare.

Target (issue 14, item 2): ``pc.diff`` of two raw 1 MB bodies finds the first divergence (path, field
changes) in <= 5 ms, tokenising nothing. The baseline serialises both bodies canonically and finds their first
differing byte — what a byte-level diff costs, and (canonical JSON sorts keys) not even at the cache-relevant
change. Also timed: the offsets and shared tokens on first access (they prepare the prefix before the
divergence: hashes and token estimates), the whole requests on first access (the added/removed lists and
breakpoints read them), the diff of two already prepared requests, and the old raw path (both bodies prepared
whole, then compared). Each figure is the median CPU time (``time.process_time``: the machine is shared, and
wall time would time the other jobs too) of ``--repeat`` runs, cold: a fresh diff each run. Prints figures;
asserts only that the answers are right.

    .venv/bin/python benchmarks/bench_diff.py [--mb 1] [--repeat 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import promptcache_nb as pc
from promptcache_nb._util import common_prefix_length
from promptcache_nb.request import SegmentMemo, canonical_bytes, prepare
from promptcache_nb.request.diff import compute_diff

WORDS = ("invoice proration ledger webhook retry settlement customer subscription dunning refund "
         "currency tax region audit export schema migration latency queue worker").split()


def text(seed: int, n_words: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] + str((seed + i) % 97) for i in range(n_words))


def fill(mb: float, head: dict, turn: Callable[[int], dict]) -> list[dict]:
    """Messages (``turn(i)``) until ``head`` plus them is about ``mb`` MB."""
    size = len(canonical_bytes(head))
    out: list[dict] = []
    while size < mb * 1_000_000:
        out.append(turn(len(out)))
        size += len(canonical_bytes(out[-1])) + 1
    return out


def anthropic(mb: float, words_per_block: int) -> dict:
    """12 tools, a long system prompt, then messages of one ``words_per_block``-word text block."""
    tools = [{"name": f"tool_{i:02d}", "description": text(1000 + i, 120),
              "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}} for i in range(12)]
    system = [{"type": "text", "text": "\n".join(f"Rule {i}: {text(i, 60)}" for i in range(180))}]
    head = {"model": "claude-sonnet-4-5", "max_tokens": 4096, "tools": tools, "system": system}

    def turn(i: int) -> dict:
        return {"role": "user" if i % 2 == 0 else "assistant",
                "content": [{"type": "text", "text": text(i, words_per_block)}]}

    return {**head, "messages": fill(mb, head, turn)}


def openai_chat(mb: float, words_per_block: int) -> dict:
    tools = [{"type": "function", "function": {"name": f"tool_{i:02d}", "description": text(1000 + i, 120),
                                               "parameters": {"type": "object", "properties": {}}}} for i in range(12)]
    head: dict[str, Any] = {"model": "gpt-4.1", "max_completion_tokens": 4096, "tools": tools,
            "messages": [{"role": "system", "content": "\n".join(f"Rule {i}: {text(i, 60)}" for i in range(180))}]}
    return {**head, "messages": head["messages"] + fill(mb, head, lambda i: {
        "role": "user" if i % 2 == 0 else "assistant", "content": text(i, words_per_block)})}


def openai_responses(mb: float, words_per_block: int) -> dict:
    head = {"model": "gpt-5", "max_output_tokens": 4096,
            "instructions": "\n".join(f"Rule {i}: {text(i, 60)}" for i in range(180))}
    return {**head, "input": fill(mb, head, lambda i: {
        "role": "user" if i % 2 == 0 else "assistant", "content": text(i, words_per_block)})}


def history_key(body: dict) -> str:
    return "input" if "input" in body else "messages"


def edited(a: dict, where: str) -> tuple[dict, str]:
    """``a`` with one character changed ``where`` (middle or last message of the history, system prompt) and
    another output limit; ``b`` shares every unchanged message and block with ``a``, as an edited copy does."""
    b = dict(a)
    key = history_key(a)
    msgs = list(a[key])
    if where == "system" and "system" in a:
        old = a["system"][0]["text"]
        b["system"] = [{**a["system"][0], "text": old[:100] + "X" + old[101:]}]
        return b, "system[0]"
    if where == "system" and "instructions" in a:
        b["instructions"] = a["instructions"][:100] + "X" + a["instructions"][101:]
        return b, "instructions"
    i = 0 if where == "system" else len(msgs) // 2 if where == "middle" else len(msgs) - 1  # (Chat: a system message)
    m = msgs[i]
    if isinstance(m["content"], str):
        old = m["content"]
        msgs[i] = {**m, "content": old[: len(old) // 2] + "X" + old[len(old) // 2 + 1:]}
        path = f"{key}[{i}]"
    else:
        old = m["content"][0]["text"]
        msgs[i] = {**m, "content": [{**m["content"][0], "text": old[: len(old) // 2] + "X" + old[len(old) // 2 + 1:]}]}
        path = f"messages[{i}].content[0]"
    b[key] = msgs
    for limit in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if limit in b:
            b[limit] = 8192
    return b, path


def median_ms(fn: Callable[..., Any], repeat: int, setup: Callable[[], Any] | None = None) -> tuple[float, Any]:
    """Median CPU time of ``fn()`` (or ``fn(setup())``, setup untimed) over ``repeat`` runs, and its result."""
    times, out = [], None
    for _ in range(repeat):
        arg = setup() if setup else None
        t = time.process_time()
        out = fn(arg) if setup else fn()
        times.append(time.process_time() - t)
    return statistics.median(times) * 1000, out


def case(a: dict, where: str, repeat: int) -> None:
    b, expected = edited(a, where)
    a_json, b_json = json.loads(json.dumps(a)), json.loads(json.dumps(b))  # nothing shared between them

    base, _ = median_ms(lambda: common_prefix_length(canonical_bytes(a), canonical_bytes(b)), repeat)
    fast, d = median_ms(lambda: pc.diff(a, b), repeat)
    unshared, d2 = median_ms(lambda: pc.diff(a_json, b_json), repeat)
    assert d.path == d2.path == expected, (d.path, expected)
    offsets, (byte, token) = median_ms(lambda d: (d.byte_offset, d.token_offset), max(3, repeat // 3),
                                       setup=lambda: pc.diff(a, b))
    assert canonical_bytes(b)[byte:byte + 1] == b"X", "byte offset should point at the changed character"
    whole, _ = median_ms(lambda d: (d.previous, d.current, d.added, d.ignored_changes), max(3, repeat // 5),
                         setup=lambda: pc.diff(a, b))
    memo = SegmentMemo()
    pa, pb = prepare(a, memo=memo), prepare(b, memo=memo)

    def prepared_diff() -> tuple:
        # fresh PreparedRequest wrappers so the per-request memo is cold, as for a new pair
        x = pc.request.PreparedRequest(pa.body, pa.segments, pa.shape, pa.rest, pa.total_tokens)
        y = pc.request.PreparedRequest(pb.body, pb.segments, pb.shape, pb.rest, pb.total_tokens)
        dd = compute_diff(x, y)
        return dd.path, dd.byte_offset, dd.token_offset

    prep, answer = median_ms(prepared_diff, repeat)
    assert answer == (d.path, byte, token), (answer, d.path, byte, token)

    def old_path() -> Any:  # what pc.diff(dict, dict) did before: prepare both whole, then compare
        m = SegmentMemo()
        return compute_diff(prepare(a, memo=m), prepare(b, memo=m)).path

    old, _ = median_ms(old_path, max(3, repeat // 5))
    print(f"  {where:<8}{base:>10.2f}{fast:>10.2f}{unshared:>10.2f}{offsets:>10.1f}{whole:>10.1f}"
          f"{prep:>10.2f}{old:>10.1f}  -> {d.path}, byte {byte:,}, ~token {token:,}")


def run(name: str, a: dict, repeat: int) -> None:
    size = len(canonical_bytes(a)) / 1e6
    print(f"== {name}: {size:.2f} MB, {len(prepare(a).segments):,} segments")
    print(f"  {'change':<8}{'baseline':>10}{'pc.diff':>10}{'unshared':>10}{'offsets':>10}{'whole':>10}"
          f"{'prepared':>10}{'old path':>10}")
    for where in ("middle", "last", "system"):
        case(a, where, repeat)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    print("median CPU ms. baseline: canonical json.dumps of both bodies + first differing byte. pc.diff: raw dicts,\n"
          "b an edited copy sharing a's unchanged objects; unshared: both parsed from JSON. offsets: .byte_offset +\n"
          ".token_offset on first access; whole: the whole requests on first access (lists, breakpoints).\n"
          "prepared: compute_diff of two prepared requests. old path: pc.diff of raw dicts before (prepare both).\n"
          "target: pc.diff <= 5 ms")
    run("Anthropic Messages, 200-word blocks", anthropic(args.mb, 200), args.repeat)
    run("Anthropic Messages, 12-word blocks (a long tool loop)", anthropic(args.mb, 12), args.repeat)
    run("OpenAI Chat Completions, 200-word messages", openai_chat(args.mb, 200), args.repeat)
    run("OpenAI Responses, 200-word input items", openai_responses(args.mb, 200), args.repeat)


if __name__ == "__main__":
    main()
