"""The package layout follows the data flow: imports point upstream, never downstream, and no module reaches
itself through its imports (checked with ``ast``; imports under ``TYPE_CHECKING`` and inside functions count as any
other).

One turn travels scenario → strategy → request → cache model / live API → store → analysis → plots, and a
stored log travels reader (``readers/``) → request → store → analysis. ``pipeline`` turns one request into its
typed record (no SQL), ``_shared`` holds what a workspace's sessions share (simulated caches, knowledge), ``turn``
is a stored request as a session hands it back, ``session`` composes a request from the stages through it,
``workspace`` opens sessions and hands them its shared objects through ``session.SessionHost``; the writers
(``ingest/``: import_log, analyze, capture) store sessions through a Workspace, and ``lab`` is the Workspace with
those writers. Widgets and advice are views over a Lab; the CLI, the report and the public namespace sit on top.
Leaves (errors, helpers, typed options, domain values, the tokenizer, usage, the wire formats) import only leaves.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "promptcache_nb"

#: ``dialects`` (the wire formats) is a leaf: what an API's bodies, usage and streams look like depends on nothing
#: of ours but the usage record and the errors, and every stage reads it.
LEAVES = {"errors", "_util", "_data", "_lazy", "_options", "_registry", "_types", "_config", "_redact", "tokens", "usage", "dialects"}

#: A module may import (at module level or inside a function) only leaves and stages of a lower rank.
RANKS = {
    "scenario": 1,  # events as frozen values; the model check is injected by lab (set_model_check)
    "readers": 1,  # the log readers: bytes in, requests and their measured usage out (no store, no session)
    "strategies": 2,  # assemble a body from the session's state
    "request": 3,  # canonical JSON, segments, hashes, prefix diff
    "cache": 4,  # provider cache models
    "turn": 4.5,  # a stored request as a session hands it back; who hears of each one stored (on_record)
    "live": 5,  # backends and servers that apply a cache model or call the API
    "store": 6,  # DuckDB: every SQL statement
    "_protocols": 6.5,  # what reading a stored session needs (LabLike, StoredSession): over the store
    "analysis": 7,  # pandas views, observation, prices, what-ifs
    "plots": 8,
    "pipeline": 9,  # one request: build → (send) → ideal read → price → analyse → typed record; no SQL
    "_shared": 9,  # what a Lab's sessions share: simulated caches per scope (rebuilt from the store), knowledge
    "session_core": 9.5,  # a session's state: loaded from the store, swapped whole once a change is stored
    "session_record": 9.6,  # a session's request path: step / record → pipeline → store
    "session_views": 9.6,  # a session's stored requests read back (turns, turn, deltas)
    "session_knowledge": 9.6,  # KnowledgeBook: a session's view of its project's knowledge
    "session": 10,  # composes a request from the stages through the pipeline, writes it to the store
    "lab": 12.1,  # the Workspace with the writers above it (import_log, analyze, capture): the public Lab
    "advice": 12.2,  # counterfactual sessions and ranked advice over a Lab's stored sessions
    "workspace": 11,  # opens sessions, owns what they share (store, caches, knowledge); replays scenarios
    "ingest": 12,  # logs and calls into sessions through a Lab: import_log (serial or parallel), analyze, capture
    "widgets": 12.3,  # views over sessions (a Compare view opens its own Lab)
    "report": 13,
    "fleet": 12.25,  # after ingest (file groups), below the widgets (as the house's drawing puts it) and __init__ (pc.fleet): many logs on many processes or machines into a Parquet dataset; a read-only Lab over it
    "__init__": 13,  # the curated public namespace
    "cli": 14,
    "pytest_plugin": 14,  # the prompt_cache fixture: a Lab, a proxy and a simulator per test
}

#: Imports running up the stage order (each would be a place where the layout is not what the data flow says):
#: none since ``analysis/gate.py`` declares what it reads of a session instead of importing ``session`` (issue 39).
MAX_UPWARD_IMPORTS = 0


def node(module: str) -> str:
    """The layout node of a module name (``promptcache_nb.cache.openai`` -> ``cache``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module
    line: int
    lazy: bool  # inside a function


def _module_name(path: Path) -> tuple[str, str]:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


class _Imports(ast.NodeVisitor):
    """Collects a module's imports of the package, noting those inside a function. Imports under
    ``if TYPE_CHECKING:`` count as any other: an annotation that names a module above is a dependency on it."""

    def __init__(self, module: str, package: str) -> None:
        self.module, self.package = module, package
        self.depth = 0
        self.found: list[Import] = []

    def visit_FunctionDef(self, n: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.depth += 1
        self.generic_visit(n)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ImportFrom(self, n: ast.ImportFrom) -> None:
        targets: list[str] = []
        if n.level:
            base = self.package.split(".")
            base = base[: len(base) - (n.level - 1)]
            if n.module:
                targets = [".".join([*base, n.module])]
            else:  # from . import a, b: submodules
                targets = [".".join([*base, a.name]) for a in n.names]
        elif n.module and n.module.split(".")[0] == "promptcache_nb":
            targets = [n.module]
        self._add(targets, n.lineno)

    def visit_Import(self, n: ast.Import) -> None:
        self._add([a.name for a in n.names if a.name.split(".")[0] == "promptcache_nb"], n.lineno)

    def _add(self, targets: list[str], line: int) -> None:
        self.found.extend(Import(self.module, t, line, self.depth > 0) for t in targets)


@functools.cache
def package_imports() -> tuple[Import, ...]:
    """Every import of a ``promptcache_nb`` module by a ``promptcache_nb`` module (type-checking ones too)."""
    out: list[Import] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        visitor = _Imports(*_module_name(path))
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        out.extend(visitor.found)
    return tuple(out)


def violations(imports: Iterable[Import]) -> list[str]:
    """Imports against the layout: a leaf importing a stage, a module with no place, a stage importing one that is
    not upstream of it (the last kind: ``running up``)."""
    bad = []
    for imp in imports:
        src, dst = node(imp.source), node(imp.target)
        if src == dst or dst in LEAVES and src in LEAVES | set(RANKS):
            continue
        where = f"{imp.source.replace('.', '/')}.py:{imp.line}: {imp.source} imports {imp.target}"
        if src in LEAVES:
            bad.append(f"{where} (a leaf imports only leaves)")
        elif dst not in RANKS or src not in RANKS:
            bad.append(f"{where} ({src if src not in RANKS else dst} has no place in the layout: add it to RANKS)")
        elif RANKS[dst] >= RANKS[src]:
            bad.append(f"{where} ({dst} is not upstream of {src}: running up)")
    return bad


def test_imports_point_upstream() -> None:
    imports = package_imports()
    assert len(imports) > 100  # the walk found the package's imports
    bad = violations(imports)
    assert [b for b in bad if not b.endswith(": running up)")] == []
    assert len(bad) <= MAX_UPWARD_IMPORTS, bad


def _module_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (a name imported from a package that is a submodule counts as that
    submodule; a missing module as its nearest existing parent)."""
    modules = {_module_name(p)[0] for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in package_imports():
        target = imp.target
        while target not in modules and "." in target:
            target = target.rsplit(".", 1)[0]
        if target != imp.source and target in modules:
            graph[imp.source].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle() -> None:
    """No module reaches itself through imports, counting those under ``TYPE_CHECKING`` and inside functions: a
    cycle dodged with a late import is still a cycle (STYLE rule 24)."""
    assert import_cycles(_module_graph()) == []


def _room_graph() -> dict[str, set[str]]:
    """room -> the rooms it imports, a room being a top-level module or a whole folder (``analysis/``), as the
    house's drawing shows them (imports under ``TYPE_CHECKING`` and inside functions count)."""
    graph: dict[str, set[str]] = {}
    for imp in package_imports():
        src, dst = node(imp.source), node(imp.target)
        graph.setdefault(src, set())
        graph.setdefault(dst, set())
        if src != dst:
            graph[src].add(dst)
    return graph


def test_no_import_cycle_between_rooms() -> None:
    """No folder reaches itself through another room either: ``analysis/gate.py`` importing ``session.py`` made
    no cycle of files, yet it tied ``analysis/`` to the session files that use it, and a drawing of the house had to
    run 7 of their arrows back up."""
    assert import_cycles(_room_graph()) == []


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_readers_below_the_store_and_ingest_above_the_workspace() -> None:
    """Readers read (bytes in, records out) and sit below the store; the ingest writes sessions through a
    Workspace and sits above it, below the public Lab (STYLE rule 23)."""
    assert RANKS["readers"] < RANKS["store"] < RANKS["workspace"] < RANKS["ingest"] < RANKS["lab"]
    imports = package_imports()
    assert [i for i in imports if node(i.source) == "readers" and node(i.target) not in LEAVES | {
        "readers", "request", "scenario"}] == []
    assert [i for i in imports if node(i.target) == "ingest" and RANKS.get(node(i.source), 0) <= RANKS["ingest"]
            and node(i.source) != "ingest"] == []


def test_every_module_has_a_place() -> None:
    units = {node(_module_name(p)[0]) for p in PACKAGE.rglob("*.py")}
    assert units <= LEAVES | set(RANKS)


def test_the_pipeline_writes_nothing_and_the_session_never_imports_the_lab() -> None:
    """The request pipeline is pure (its record goes to the store through the session), and the Workspace sits
    above Session: a session gets its Workspace passed in (a ``SessionHost``), never imports it."""
    tree = ast.parse((PACKAGE / "pipeline.py").read_text(encoding="utf-8"))
    from_store = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and "store" in (n.module or "")
                  for a in n.names}
    assert from_store and from_store <= {"prefix_chain", "encode_message", "state_columns", "RequestWrite"}  # row codecs
    calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert not calls & {"execute", "sql", "query", "rows", "one", "scalar", "write_request", "transaction"}
    imports = package_imports()
    assert [i for i in imports if node(i.source).startswith("session") and node(i.target) in ("workspace", "lab")
            ] == []
    assert any(node(i.source) == "workspace" and node(i.target) == "session" for i in imports)


def test_checker_catches_a_downstream_import() -> None:
    down = Import("promptcache_nb.strategies.naive", "promptcache_nb.store._db", 1, lazy=False)
    leaf = Import("promptcache_nb.usage", "promptcache_nb.request", 1, lazy=False)
    lazy = Import("promptcache_nb.workspace", "promptcache_nb.ingest._import", 1, lazy=True)
    fine = Import("promptcache_nb.lab", "promptcache_nb.ingest._import", 1, lazy=False)
    assert len(violations([down, leaf, lazy, fine])) == 3


@pytest.mark.parametrize("unit", ["scenario", "readers", "strategies", "request", "cache"])
def test_upstream_stages_never_import_the_store(unit: str) -> None:
    """Values are pure: nothing before the store touches it (issue 12's layout)."""
    offenders = [i for i in package_imports() if node(i.source) == unit and node(i.target) == "store"]
    assert offenders == []


def _private_reach_ins(module: str, owners: set[str]) -> list[str]:
    """``x._name`` in ``module`` where ``x`` is a name in ``owners`` or an attribute named like one
    (``self._lab._knowledge``): a private member of another module's object."""
    tree = ast.parse((PACKAGE / module).read_text(encoding="utf-8"))
    found = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")):
            continue
        v = n.value
        name = v.id if isinstance(v, ast.Name) else v.attr if isinstance(v, ast.Attribute) else None
        if name in owners:
            found.append(f"{module}:{n.lineno}: {ast.unparse(n)}")
    return found


def test_lab_and_session_use_only_each_others_public_names() -> None:
    """Lab and Session were one object in two files (issue 25): each now uses the other's public names only;
    what they share lives in ``_shared`` (caches, knowledge), handed over through ``session.SessionHost``."""
    assert _private_reach_ins("workspace.py", {"s", "session", "open_", "old", "sess"}) == []
    assert _private_reach_ins("lab.py", {"s", "session", "open_", "old", "sess"}) == []
    for part in ("session.py", "session_core.py", "session_record.py", "session_views.py", "session_knowledge.py"):
        assert _private_reach_ins(part, {"lab", "_lab", "host"}) == []
    assert _private_reach_ins("ingest/_import.py", {"lab", "s", "session"}) == []


#: The wire formats' names: a comparison with one of them (or with anything named ``dialect``) asks which format a
#: body holds, which only ``promptcache_nb/dialects/`` may do (STYLE rule 19).
_FORMAT_NAMES = {"openai-chat", "openai-responses"}
#: Dialect comparisons allowed outside ``dialects/`` (each must carry a comment on its line saying why).
MAX_DIALECT_TESTS = 3


def _names_a_dialect(n: ast.AST) -> bool:
    if isinstance(n, ast.Name):
        return "dialect" in n.id.lower()
    if isinstance(n, ast.Attribute):
        return "dialect" in n.attr.lower()
    if isinstance(n, ast.Constant):
        return n.value in _FORMAT_NAMES
    if isinstance(n, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_dialect(e) for e in n.elts)
    return False


def dialect_tests(sources: dict[str, str]) -> list[tuple[str, int, str]]:
    """(module, line, source line) of every ``==`` / ``!=`` / ``in`` / ``not in`` that compares a dialect."""
    out = []
    for name, text in sorted(sources.items()):
        lines = text.splitlines()
        for n in ast.walk(ast.parse(text)):
            if (isinstance(n, ast.Compare)
                    and any(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in n.ops)
                    and any(_names_a_dialect(o) for o in [n.left, *n.comparators])):
                out.append((name, n.lineno, lines[n.lineno - 1]))
    return out


def test_no_module_outside_dialects_asks_which_wire_format_it_holds() -> None:
    """Everything that knows an API's shape sits in ``dialects/``; elsewhere code asks the dialect object."""
    sources = {str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))
               if "dialects" not in p.relative_to(PACKAGE).parts}
    found = dialect_tests(sources)
    assert len(found) <= MAX_DIALECT_TESTS, found
    uncommented = [f for f in found if "#" not in f[2]]
    assert uncommented == []


def test_dialect_checker_catches_a_comparison() -> None:
    src = 'if p.dialect == "anthropic":\n    pass\nif kind in ("openai-chat", "x"):\n    pass\nok = a == b\n'
    assert [line for _, line, _ in dialect_tests({"m.py": src})] == [1, 3]


def test_frozen_values_get_no_side_attributes() -> None:
    """A value stays a value (STYLE rule 18): ``object.__setattr__`` only inside ``__post_init__`` (at most 2), so
    derived data lives in declared fields (``PreparedRequest.derived``), visible to mypy and to
    ``dataclasses.replace``."""
    sites: list[tuple[str, int, str]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for n in ast.walk(fn):
                if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "__setattr__"
                        and isinstance(n.func.value, ast.Name) and n.func.value.id == "object"):
                    sites.append((str(path.relative_to(PACKAGE)), n.lineno, fn.name))
    assert len(sites) <= 2, sites
    assert all(name == "__post_init__" for _, _, name in sites), sites


def test_docs_layout_lists_every_module() -> None:
    """docs/layout.md is the folder list, one line per module: a new module is added there, or this fails."""
    layout = (PACKAGE.parent / "docs" / "layout.md").read_text(encoding="utf-8")
    block = layout.split("```text", 1)[1].split("```", 1)[0]
    listed = set(re.findall(r"[\w]+\.py", block))
    modules = {p.name for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    assert sorted(modules - listed) == []
    folders = {p.parent.name + "/" for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE}
    assert sorted(f for f in folders if f not in block) == []


#: Imports inside a function (any module, ours or not). One is there for start-up time only: a heavy or optional
#: dependency loaded by the one function that needs it, with its reason in a comment (STYLE rule 24). pandas,
#: numpy, genai_prices and the plots' matplotlib modules are bound at module level through ``_lazy`` instead.
MAX_INLINE_IMPORTS = 17
#: Inline imports with no reason: none (issue 39).
MAX_UNEXPLAINED_INLINE_IMPORTS = 0

_PRAGMA = re.compile(r"#\s*(type:|noqa|pragma)[^#]*")


@dataclass(frozen=True)
class InlineImport:
    module: str  # path relative to the package
    line: int
    text: str
    explained: bool  # a comment (not just a pragma) on its line or on the line above


def _has_reason(line: str) -> bool:
    return "#" in _PRAGMA.sub("", line)


def inline_imports(sources: dict[str, str]) -> list[InlineImport]:
    """Every ``import`` / ``from ... import`` inside a function body (nested functions and methods included)."""
    found = []
    for name, text in sorted(sources.items()):
        lines = text.splitlines()

        def walk(n: ast.AST, in_function: bool, name: str = name, lines: list[str] = lines) -> None:
            for child in ast.iter_child_nodes(n):
                if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                    at = child.lineno - 1
                    explained = _has_reason(lines[at]) or at > 0 and _has_reason(lines[at - 1])
                    found.append(InlineImport(name, child.lineno, lines[at].strip(), explained))
                walk(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

        walk(ast.parse(text), False)
    return found


def test_inline_imports_are_few_and_say_why() -> None:
    """An import inside a function is for start-up time only (heavy or optional dependencies), never to dodge the
    layering: at most MAX_INLINE_IMPORTS, each with its reason on its line or the line above."""
    sources = {str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))}
    found = inline_imports(sources)
    assert len(found) > 0  # the walk sees function bodies
    assert len(found) <= MAX_INLINE_IMPORTS, [f"{f.module}:{f.line}: {f.text}" for f in found]
    unexplained = [f"{f.module}:{f.line}: {f.text}" for f in found if not f.explained]
    assert len(unexplained) <= MAX_UNEXPLAINED_INLINE_IMPORTS, unexplained


def test_inline_import_counter_sees_nested_bodies_and_reasons() -> None:
    src = ("import os\n\n"
           "def f():\n    import json  # heavy\n\n    class C:\n        def g(self):\n"
           "            # optional\n            from x import y\n            import z  # type: ignore\n\n"
           "if True:\n    import sys\n")
    found = inline_imports({"m.py": src})
    assert [(f.line, f.explained) for f in found] == [(4, True), (9, True), (10, False)]
