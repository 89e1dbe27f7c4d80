"""The rules the code cites live in the repository: every ``docs/<file>.md#<anchor>`` named in the package, the
tests, the benchmarks, the README or the notebooks is a ``##`` section of that file, and no docstring cites
a document the repository does not hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CITATION = re.compile(r"docs/([\w-]+\.md)#([\w-]+)")
# citations of the team's notes by section number, or of a brief, which are not in the repository
OUTSIDE = re.compile(r"(?<!docs/)\b(?:provider_cache_rules|seed_designs)\.md\s*§|\brules §|\bthe brief\b")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {slug(m.group(1)) for line in lines if (m := re.match(r"#{2,3} (.+)", line))}


def cited_files() -> list[Path]:
    files = [*sorted((ROOT / "promptcache_nb").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py")),
             *sorted((ROOT / "benchmarks").glob("*.py")), *sorted((ROOT / "notebooks").glob("*.ipynb")),
             ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]
    return [f for f in files if f.exists()]


def citations() -> list[tuple[str, str, str]]:
    """(where, file, anchor) for every ``docs/<file>.md#<anchor>`` in the repository's text."""
    out = []
    for path in cited_files():
        text = path.read_text(encoding="utf-8")
        for m in CITATION.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{path.relative_to(ROOT)}:{line}", m.group(1), m.group(2)))
    return out


def test_slug_matches_github() -> None:
    assert slug("Anthropic TTL and refresh") == "anthropic-ttl-and-refresh"
    assert slug("oh-my-pi append-only context") == "oh-my-pi-append-only-context"
    assert slug("Lore: data model") == "lore-data-model"


def test_the_code_cites_the_docs() -> None:
    found = citations()
    cited = {f for _, f, _ in found}
    assert {"provider_cache_rules.md", "seed_designs.md"} <= cited
    assert len(found) >= 30


@pytest.mark.parametrize("doc", sorted({f for _, f, _ in citations()}))
def test_every_cited_anchor_exists(doc: str) -> None:
    path = DOCS / doc
    assert path.exists(), f"docs/{doc} is cited but not in the repository"
    known = anchors(path)
    missing = [f"{where}: docs/{doc}#{a}" for where, f, a in citations() if f == doc and a not in known]
    assert missing == [], f"sections of docs/{doc}: {sorted(known)}"


def test_docs_own_links_resolve() -> None:
    for path in DOCS.rglob("*.md"):
        known = anchors(path)
        local = re.findall(r"\]\(#([\w-]+)\)", path.read_text(encoding="utf-8"))
        assert [a for a in local if a not in known] == [], path.name


def test_no_citation_outside_the_repository() -> None:
    offenders = []
    for path in [*(ROOT / "promptcache_nb").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        if path.name == "test_citations.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []
