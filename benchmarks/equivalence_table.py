"""The strategy-equivalence table: does ``pc.counterfactual(s, strategy=X)`` land where strategy X's own replay does?

Each scenario is replayed (simulated, the offline Anthropic cache model) under a source strategy (``naive``,
``clock_in_system``), written as the recording proxy logs it (bodies, and the usage the cache model reported),
imported into a fresh Lab (no strategy information survives the log) and counterfactually fixed with the fix set
that stands for each target strategy (``pc.advice.STRATEGY_FIXES``). The table compares that counterfactual's cost
with the same scenario replayed under the target strategy itself; both figures are simulated.

    .venv/bin/python benchmarks/equivalence_table.py [--scenario NAME ...]

Prints a Markdown table (scenario, source, target, counterfactual cost, strategy replay cost, gap %, the advice's
predicted saving with its interval, the real saving — the log's cost minus the strategy's replay — and whether it
lies inside). The tests (``tests/test_advice_equivalence.py``) hold every gap within ±10 % and every real saving
inside its interval.

``subagents`` is a family of conversations: a parent (``subagents.yaml``) and the sub-agents it starts
(``subagents_explore.yaml``, ``subagents_bench.yaml``), each its own scenario file with the parent's system prompt and
tools. The scenario format describes one conversation and ``Lab.replay`` replays one, so the family is composed here:
one session per file in one project's cache scope (as a provider's account shares it), their turns sent in time order.
The log holds one file per session, imported as one account; each session is fixed on its own (the others beside it,
as logged) and the row adds them up.
"""

from __future__ import annotations

import argparse
import heapq
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import promptcache_nb as pc
from promptcache_nb.advice._counterfactual import Original
from promptcache_nb.analysis import load_turns

SCENARIOS = ("support_agent", "knowledge_churn", "git_status", "tool_reorder", "idle_gaps", "subagents")
#: scenarios of several conversations sharing one cache: the parent's file, then its sub-agents'
FAMILIES = {"subagents": ("subagents", "subagents_explore", "subagents_bench")}
SOURCES = ("naive", "clock_in_system")
TARGETS = ("clock_at_tail", "append_only", "durable_delta")


@dataclass(frozen=True)
class Row:
    """One cell of the table: a scenario's source log fixed as ``target``, against ``target``'s own replay."""

    scenario: str
    source: str
    target: str
    requests: int
    counterfactual_usd: float
    replay_usd: float
    #: the source log's measured cost, and the advice's predicted saving with its interval (anchored on it)
    measured_usd: float = 0.0
    saved_usd: float = 0.0
    saved_low_usd: float = 0.0
    saved_high_usd: float = 0.0

    @property
    def gap(self) -> float:
        """(counterfactual − replay) / replay."""
        return (self.counterfactual_usd - self.replay_usd) / self.replay_usd

    @property
    def real_saved_usd(self) -> float:
        """What switching to the target strategy really saved: the log's measured cost − the strategy's replay."""
        return self.measured_usd - self.replay_usd

    @property
    def inside(self) -> bool:
        """The real saving lies within the predicted saving's interval."""
        return self.saved_low_usd <= self.real_saved_usd <= self.saved_high_usd


def write_proxy_log(s: pc.Session, path: Path) -> Path:
    """The session's requests as the recording proxy logs them: bodies and the usage the cache model reported."""
    lines = []
    bodies = {t.idx: t.request.body for t in load_turns(s)}  # rebuilt in bulk (s.turn(i) rebuilds one, its diff too)
    for r in s.turns().itertuples():
        body = bodies[r.idx]
        usage = {"input_tokens": int(r.input_tokens), "cache_read_input_tokens": int(r.cache_read_input_tokens),
                 "cache_creation_input_tokens": int(r.cache_creation_input_tokens),
                 "cache_creation": {"ephemeral_5m_input_tokens": int(r.cache_creation_5m_input_tokens or 0),
                                    "ephemeral_1h_input_tokens": int(r.cache_creation_1h_input_tokens or 0)},
                 "output_tokens": int(r.output_tokens or 0)}
        lines.append({"v": 1, "at": r.sent_at.isoformat().replace("+00:00", "Z"), "method": "POST",
                      "url": "https://api.anthropic.com/v1/messages", "path": "/v1/messages", "status": 200,
                      "request": body,
                      "response": {"id": f"msg_01Eq{r.idx:04d}", "type": "message", "role": "assistant",
                                   "model": body["model"], "content": [{"type": "text", "text": "ok"}],
                                   "stop_reason": "end_turn", "usage": usage},
                      "usage": usage, "request_id": f"req_011Eq{r.idx:04d}", "latency_ms": 900,
                      "provider": "anthropic"})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def scenario_path(name: str) -> Path:
    return pc.data_path("scenarios") / f"{name}.yaml"


def replay_family(lab: pc.Lab, names: tuple[str, ...], strategy: str) -> tuple[pc.Session, ...]:
    """A parent scenario and its sub-agents' under ``strategy``: one session each, in one project's cache scope (the
    parent's knowledge is the project's), every turn sent when its own clock says, all of them in time order."""
    scs = [pc.load_scenario(scenario_path(n)) for n in names]
    project = f"{names[0]}/{strategy}"
    sessions = []
    for k, sc in enumerate(scs):
        s = lab.new_session(strategy, model=sc.model, project=project, system=sc.host_prompt, tools=list(sc.tools),
                            start=sc.start, cache_scope="project")
        if k == 0:
            s.knowledge.add_many(sc.knowledge, at=sc.start)
            s.clear_pending_events()
        sessions.append(s)
    due = [(sc.start, k, 0) for k, sc in enumerate(scs) if sc.turns]
    heapq.heapify(due)
    while due:
        at, k, i = heapq.heappop(due)
        turn = scs[k].turns[i]
        for event in turn.events:
            sessions[k] = sessions[k].apply(event, at=at)
        done = sessions[k].step(turn.user, turn.reply, at=at, tool_calls=turn.tool_calls)
        if i + 1 < len(scs[k].turns):
            heapq.heappush(due, (done.at + scs[k].turns[i + 1].after, k, i + 1))
    return tuple(sessions)


def replay_all(lab: pc.Lab, scenario: str) -> dict[str, tuple[pc.Session, ...]]:
    """The scenario replayed under every source and target strategy (a family: each of its sessions)."""
    if scenario in FAMILIES:
        return {st: replay_family(lab, FAMILIES[scenario], st) for st in (*SOURCES, *TARGETS)}
    return {st: (lab.replay(scenario_path(scenario), strategy=st),) for st in (*SOURCES, *TARGETS)}


def _cost(sessions: tuple[pc.Session, ...]) -> float:
    return sum(float(s.turns().cost_usd.sum()) for s in sessions)


def rows_for(lab: pc.Lab, scenario: str, replays: dict[str, tuple[pc.Session, ...]], source: str,
             workdir: Path) -> list[Row]:
    """The three targets' rows for one (scenario, source): the source's replay logged (a file per session, one
    account), imported and fixed (each session beside the others)."""
    folder = workdir / f"{scenario}-{source}"
    folder.mkdir()
    for k, s in enumerate(replays[source]):
        write_proxy_log(s, folder / f"{k}.jsonl")
    imported = lab.import_log(folder, account=f"{scenario}-{source}").sessions
    measured = sum(float(s.turns().cost_usd.sum()) for s in imported)
    out = []
    for target in TARGETS:
        cost = saved = low = high = 0.0
        requests = 0
        for s in imported:
            cf = pc.counterfactual(s, strategy=target)
            orig = Original.load(s)
            rep = orig.anchored(orig.plan(pc.advice.STRATEGY_FIXES[target]))
            requests += len(cf.turns())
            cost += float(cf.turns().cost_usd.sum())
            saved, low, high = saved + rep.saved, low + rep.low, high + rep.high
        out.append(Row(scenario, source, target, requests, cost, _cost(replays[target]), measured, saved, low, high))
    return out


def markdown(rows: list[Row]) -> str:
    head = ("| scenario | from | fixed as | counterfactual $ | strategy replay $ | gap | predicted saving (interval) "
            "| real saving | inside |\n|---|---|---|---:|---:|---:|---|---:|---|\n")
    return head + "".join(f"| `{r.scenario}` ({r.requests} requests) | `{r.source}` | `{r.target}` | "
                          f"{r.counterfactual_usd:.2f} | {r.replay_usd:.2f} | {r.gap * 100:+.1f} % | "
                          f"{r.saved_usd:.2f} ({r.saved_low_usd:.2f} to {r.saved_high_usd:.2f}) | "
                          f"{r.real_saved_usd:.2f} | {'yes' if r.inside else 'no'} |\n" for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="default: all five")
    args = parser.parse_args()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp, pc.Lab(progress=False) as lab:
        for scenario in args.scenario or SCENARIOS:
            replays = replay_all(lab, scenario)
            for source in SOURCES:
                rows += rows_for(lab, scenario, replays, source, Path(tmp))
    print(markdown(rows), end="")


if __name__ == "__main__":
    main()
