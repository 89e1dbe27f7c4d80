"""The manual's own facts: the changelog lists every deprecated top-level name with the release that removes it,
the reliability page's corpus counts are the corpus's, and every page is in the site's nav."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

import promptcache_nb as pc

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def test_the_changelog_lists_every_deprecated_name_and_its_removal():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    deprecated = changelog.split("### Deprecated", 1)[1].split("\n## ", 1)[0]
    listed = dict(re.findall(r"^\| `pc\.(\w+)` \| `pc\.([\w.]+)` \|$", deprecated, re.M))
    assert listed == pc._MOVED
    assert "0.2.0 removes them" in deprecated


def test_the_reliability_page_counts_the_bad_input_corpus():
    corpus = ROOT / "tests" / "bad_inputs"
    counts = {d.name: len(yaml.safe_load((d / "expected.yaml").read_text(encoding="utf-8")))
              for d in corpus.iterdir() if d.is_dir()}
    text = " ".join((DOCS / "reliability.md").read_text(encoding="utf-8").split())
    assert f"holds {counts['server_requests']} raw requests" in text
    assert (f"{sum(counts.values())} cases — {counts['scenarios']} malformed scenarios, {counts['bodies']} request "
            f"bodies") in text
    assert f"{counts['server_requests']} raw server requests and {counts['stores']} foreign or corrupted stores" in text
    assert f"{sum(counts.values())} of {sum(counts.values())} give one clean line" in text


def test_every_page_is_in_the_nav():
    """mkdocs --strict (make test) refuses a page left out; this says which, without building the site."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = set(re.findall(r":\s*([\w/.-]+\.md)\s*$", config.split("\nnav:", 1)[1], re.M))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages == nav


def test_every_public_subpackage_has_an_api_page():
    subpackages = {name for name in pc.__all__ if type(getattr(pc, name)).__name__ == "module"}
    pages = {p.stem for p in (DOCS / "api").glob("*.md")}
    assert subpackages <= pages
    for name in subpackages:
        assert f"::: promptcache_nb.{name}" in (DOCS / "api" / f"{name}.md").read_text(encoding="utf-8")
