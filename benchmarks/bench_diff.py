"""First divergence of two ~1 MB requests: PrefixDiff vs a plain byte compare.

Target (issue 5): path + byte offset + token offset of two 1 MB bodies in <= 5 ms. The baseline
serialises both bodies canonically and finds their first differing byte, which is what a byte-level
diff costs and which (because canonical JSON sorts keys) does not even land on the cache-relevant
change. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_diff.py [--mb 1] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import promptcache_nb as pc
from promptcache_nb._util import common_prefix_length
from promptcache_nb.request import canonical_bytes, prepare
from promptcache_nb.request.diff import compute_diff

WORDS = ("invoice proration ledger webhook retry settlement customer subscription dunning refund "
         "currency tax region audit export schema migration latency queue worker").split()


def text(seed: int, n_words: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] + str((seed + i) % 97) for i in range(n_words))


def bodies(mb: float, words_per_block: int) -> tuple[dict, dict, dict, str]:
    """Bodies of about ``mb`` MB: 12 tools, a long system prompt, then messages of ``words_per_block``
    words. ``b`` has one character changed in the middle of the history, another max_tokens and a moved
    breakpoint; ``b_plain`` only the changed character."""
    tools = [{"name": f"tool_{i:02d}", "description": text(1000 + i, 120),
              "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}} for i in range(12)]
    system = [{"type": "text", "text": "\n".join(f"Rule {i}: {text(i, 60)}" for i in range(180))}]
    messages = []
    size = len(canonical_bytes({"tools": tools, "system": system}))
    i = 0
    while size < mb * 1_000_000:
        role = "user" if i % 2 == 0 else "assistant"
        block = {"type": "text", "text": text(i, words_per_block)}
        messages.append({"role": role, "content": [block]})
        size += len(canonical_bytes(block)) + 30
        i += 1
    a = {"model": "claude-sonnet-4-5", "max_tokens": 4096, "tools": tools, "system": system,
         "messages": messages}
    mid = len(messages) // 2
    b_messages = [dict(m) for m in messages]
    old = messages[mid]["content"][0]["text"]
    at = len(old) // 2
    b_messages[mid] = {"role": messages[mid]["role"],
                       "content": [{"type": "text", "text": old[:at] + "X" + old[at + 1:]}]}
    b_plain = {**a, "messages": list(b_messages)}
    b_messages[-1] = {"role": messages[-1]["role"],
                      "content": [{**messages[-1]["content"][0], "cache_control": {"type": "ephemeral"}}]}
    b = {**a, "max_tokens": 8192, "messages": b_messages}
    return a, b, b_plain, f"messages[{mid}].content[0]"


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000, out


def run(mb: float, words_per_block: int, repeat: int) -> None:
    a, b, b_plain, expected = bodies(mb, words_per_block)
    pa, pb = prepare(a), prepare(b)
    print(f"bodies: {len(pa.canonical) / 1e6:.2f} MB, {len(pa.segments):,} segments; "
          f"the change is in {expected}; "
          "b also has another max_tokens and a moved cache_control marker")

    def prefix_diff() -> tuple:
        # fresh PreparedRequest wrappers so the per-request memo is cold, as for a new pair
        x = pc.PreparedRequest(a, pa.segments, pa.shape, pa.rest, pa.total_tokens)
        y = pc.PreparedRequest(b, pb.segments, pb.shape, pb.rest, pb.total_tokens)
        d = compute_diff(x, y)
        return d.path, d.byte_offset, d.token_offset

    ms, (path, byte, token) = timed(prefix_diff, repeat)
    print(f"  PrefixDiff of prepared requests (cold memo):      {ms:8.2f} ms -> {path}, byte {byte:,}, "
          f"~token {token:,}  (target <= 5 ms)")
    assert canonical_bytes(b)[byte:byte + 1] == b"X", "byte offset should point at the changed character"
    ms_b, raw = timed(lambda: common_prefix_length(canonical_bytes(a), canonical_bytes(b)), repeat)
    print(f"  baseline, serialise both + first differing byte:  {ms_b:8.2f} ms -> byte {raw:,}, inside "
          f"{canonical_bytes(b)[max(0, raw - 12):raw + 4]!r} (a volatile field, not the change)")
    ms_c, raw_c = timed(lambda: common_prefix_length(canonical_bytes(a), canonical_bytes(b_plain)), repeat)
    print(f"  same, only the changed character differing:       {ms_c:8.2f} ms -> byte {raw_c:,}")
    ca, cb = canonical_bytes(a), canonical_bytes(b_plain)
    ms_s, _ = timed(lambda: common_prefix_length(ca, cb), repeat)
    print(f"  same, bodies already serialised:                  {ms_s:8.2f} ms")
    ms_p, _ = timed(lambda: pc.diff(a, b), max(1, repeat // 10))
    print(f"  pc.diff(dict, dict), prepare() included:          {ms_p:8.2f} ms (hashing + token estimates)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    print("== large blocks (200 words)")
    run(args.mb, 200, args.repeat)
    print("== small blocks (12 words: a long tool loop)")
    run(args.mb, 12, args.repeat)


if __name__ == "__main__":
    main()
