"""Markdown the docs site reads differently from GitHub, fixed as the site is built (the sources stay as written).

Two spellings in this repository's docs and docstrings are Markdown on GitHub and in a terminal but something else
to mkdocs: a source citation pair such as ``[A1][A2]`` is a reference link to ``A2`` (which autorefs then cannot
find: a warning, so ``mkdocs build --strict`` fails), and a Google-style ``Example:`` section is not a section to
griffe (only ``Examples:`` is), so its ``>>>`` lines would render as block quotes instead of code.

``mkdocs.yml`` loads this file twice: as a mkdocs hook (``on_page_markdown``: the pages) and as a griffe extension
(``DocstringMarkup``: the docstrings mkdocstrings renders).
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

#: the ``]`` between two source tags (``[A1][A2]``, ``[B1][B3]``): escaping the second ``[`` keeps both as text
CITATION_PAIR = re.compile(r"(\[[A-Z]\d+\])(?=\[[A-Z]\d+\])")
#: a Google ``Example:`` heading on its own line, at any indent
EXAMPLE_HEADING = re.compile(r"^(\s*)Example:\s*$", re.M)


def escape_citations(text: str) -> str:
    """``[A1][A2]`` -> ``[A1]\\[A2]``: the same text on the page, and no reference link."""
    return CITATION_PAIR.sub(r"\1\\", text)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """mkdocs hook: the pages' citation pairs, outside code (fences and inline code are left alone)."""
    parts = re.split(r"(```.*?```|`[^`\n]*`)", markdown, flags=re.S)
    return "".join(p if p.startswith("`") else escape_citations(p) for p in parts)


class DocstringMarkup(Extension):
    """griffe extension: ``Example:`` read as ``Examples:`` (doctests become code) and citation pairs escaped."""

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        text = EXAMPLE_HEADING.sub(r"\1Examples:", obj.docstring.value)
        obj.docstring.value = escape_citations(text)
