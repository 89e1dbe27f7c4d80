"""The notebooks' prose agrees with what is on screen after Run All (issue 40).

Prose that depends on the data is computed in the notebook (``pc.widgets.markdown``), so it says what the
data says; its hidden checks cells run under nbval. The written prose (Markdown cells) may only state numbers
the page shows where the sentence is — in an output or code above it, or in the code cells it introduces (up to
the next Markdown cell, their hidden checks included) — or a documented rule of the package, checked here
against the package's own constant. A number in a sentence that matches nothing there is a claim about a state
the reader cannot see, and fails; so does a number the page only shows sections away.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import promptcache_nb as pc
from promptcache_nb.analysis.cause import NOISE_FLOOR
from promptcache_nb.analysis.observe import MAX_STABLE_CACHE_READ_RATIO, MIN_CACHE_BREAK_TOKEN_DROP
from promptcache_nb.analysis.prices import prices_for
from promptcache_nb.cache.anthropic import TTL_SECONDS
from promptcache_nb.cache.deepseek import UNIT_TOKENS
from promptcache_nb.cache.openai import INCREMENT
from promptcache_nb.cache.vllm import BLOCK_SIZE
from promptcache_nb.strategies._lore import DELTA_BUDGET_TOKENS

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*.ipynb"))
# a number, with its unit when it has one; not part of a name, a version, an issue or a path
NUMBER = re.compile(r"(?<![\w#.\-/])(\d[\d,]*(?:\.\d+)?)(?![\w.]*\w)")
# "request 6", "requests 3 and 4", "requests 3–5"; "scenario turn 3" (a quoted "…" is the widgets' wording)
REQUEST = re.compile(r"\b[Rr]equests?\s+(\d+(?:\s*(?:,|–|-|and|or|to)\s*\d+)*)\b")
TURN = re.compile(r"(?<!\(\")\bscenario turns?\s+(\d+)\b")


def _rules() -> dict[str, str]:
    """Numbers the prose states as the package's rules, each from the package (a change there fails here)."""
    sonnet = prices_for("claude-sonnet-4-5")
    write_5m, read = round(sonnet.cache_write_5m / sonnet.input, 2), round(sonnet.cache_read / sonnet.input, 2)
    minimum = pc.get_cache_model("anthropic").min_cacheable_tokens("claude-sonnet-4-5")
    return {
        f"{NOISE_FLOOR:,}": "the rebuild noise floor (analysis.cause.NOISE_FLOOR)",
        f"{MIN_CACHE_BREAK_TOKEN_DROP:,}": "OpenClaw's break drop (analysis.observe)",
        f"{write_5m:g}": "the 5-minute write price over the input price",
        f"{read:g}": "the cache-read price over the input price",
        f"{INCREMENT}": "OpenAI's cache hit increment (cache.openai.INCREMENT)",
        f"{minimum:,}": "Sonnet's minimum cacheable prefix",
        f"{DELTA_BUDGET_TOKENS:,}": "Lore's delta budget (strategies._lore)",
    }


def _unit_rules() -> list[tuple[str, str, str]]:
    """Small numbers the prose states as rules only with their unit (a bare "2" or "5" is no rule): (number,
    the unit that must follow it, why), each from the package."""
    sonnet = prices_for("claude-sonnet-4-5")
    return [
        (f"{round(sonnet.cache_write_1h / sonnet.input, 2):g}", r"\s*×", "the 1-hour write price over the input's"),
        (f"{TTL_SECONDS['5m'] / 60:g}", r"(?:\s*min|-minute)", "Anthropic's default cache lifetime"),
        (f"{TTL_SECONDS['1h'] / 3600:g}", r"(?:\s*h\b|-hour)", "Anthropic's extended cache lifetime"),
        (f"{UNIT_TOKENS}", r"-token", "DeepSeek's cache unit (cache.deepseek)"),
        (f"{BLOCK_SIZE}", r"-token", "vLLM's KV block size (cache.vllm)"),
        (f"{MAX_STABLE_CACHE_READ_RATIO * 100:g}", r"\s*%", "OpenClaw's break ratio (analysis.observe)"),
    ]


#: Numbers that are neither data nor our rules, each with why the page can state it as it is.
CITED = {
    "03_durable_deltas": {"400": "an HTTP 400 from the API", "24": "the dollars Lore's own issue reports",
                          "27": "the busts Lore's own issue reports"},
    "01_quickstart": {"4": "the stepper's wording, quoted as an example (\"scenario turn 4 of 12\")",
                      "12": "the stepper's wording, quoted as an example (\"scenario turn 4 of 12\")"},
    "04_providers": {"0.5": "OpenAI's read price by model family (provider docs)",
                     "5": "OpenAI's in-memory retention, 5–10 minutes idle (provider docs)",
                     "10": "OpenAI's in-memory retention, 5–10 minutes idle (provider docs)",
                     "0": "vLLM is self-hosted: no list price",
                     "4,000": "250 vLLM blocks of 16 tokens, the numbers the sentence gives"},
    "05_live_api": {"2.12": "the anthropic SDK version that lists the model's end of life",
                    "30": "the model's end-of-life date", "2026": "the model's end-of-life date",
                    "20": "the offline token estimator's stated accuracy (tokens.py: ±20 %)"},
}


def _prose(cell: dict) -> str:
    text = "".join(cell["source"])
    text = re.sub(r"```.*?```|`[^`]*`", " ", text, flags=re.S)  # code is names, not claims
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    text = re.sub(r"\(?#\d+\)?", " ", text)  # issue numbers
    text = re.sub(r"^#+\s*\d+\.", " ", text, flags=re.M)  # section numbers
    text = re.sub(r"\b[Nn]otebooks?\s+0\d(?:\s*(?:,|and|or)\s*0\d)*", " ", text)  # notebook names
    text = re.sub(r"\*\*0\d\b", " ", text)  # "**02 — seven strategies**"
    return re.sub(r"^\s*\d+\.\s", " ", text, flags=re.M)  # numbered lists


def _shown(cells: list[dict]) -> str:
    """What the page shows besides the prose: every output, and the code that set the numbers."""
    return "\n".join(json.dumps(c.get("outputs", [])) + "".join(c["source"])
                     for c in cells if c["cell_type"] == "code")


def _around(cells: list[dict], n: int) -> str:
    """What is on the page where Markdown cell ``n`` is: the code and outputs above it, and the code cells it
    introduces (up to the next Markdown cell, their hidden checks included)."""
    end = next((k for k in range(n + 1, len(cells)) if cells[k]["cell_type"] == "markdown"), len(cells))
    return _shown(cells[:end])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_number_in_the_prose_is_on_the_page_or_a_rule(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    rules, unit_rules, cited = _rules(), _unit_rules(), CITED.get(path.stem, {})
    unexplained = []
    for n, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        text, shown = _prose(cell), _around(cells, n)
        for m in NUMBER.finditer(text):
            number = m.group(1).rstrip(",")
            if any(number == n and re.match(unit, text[m.end():]) for n, unit, _ in unit_rules):
                continue
            if number in rules or number in cited or re.search(rf"(?<![\d,.]){re.escape(number)}(?!\d|,\d)",
                                                                shown):
                continue
            unexplained.append(f"cell {n}: {number!r} in …{text[max(0, m.start() - 50):m.end() + 30]!r}")
    assert unexplained == [], f"{path.name}: numbers in the prose the page does not show: {unexplained}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_request_the_prose_names_is_one_an_output_above_it_shows(path):
    """"request 6" (or "requests 3 and 4") in a Markdown cell names a request that an output or code above it, or
    the code it introduces, shows as a request index; "scenario turn 3" one it shows as a scenario turn: the
    reader has it on screen where the sentence is (not merely the digit somewhere on the page)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    wrong = []
    for n, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        around, text = _around(cells, n), _prose(cell)
        for m in REQUEST.finditer(text):
            for idx in re.findall(r"\d+", m.group(1)):
                if not re.search(rf"(?:request|Request|idx|\"index\"|requests \d+–)\D{{0,40}}\b{idx}\b", around):
                    wrong.append(f"cell {n}: request {idx}")
        for m in TURN.finditer(text):
            turn = m.group(1)
            if not re.search(rf"(?:scenario turns?|played\W+)\D{{0,12}}\b{turn}\b|\b{turn} of \d+\D{{0,20}}scenario "
                             "turns", around):
                wrong.append(f"cell {n}: scenario turn {turn}")
    assert wrong == [], f"{path.name}: {wrong}"


def test_the_rules_the_prose_states_are_the_package_rules():
    rules = _rules()
    assert {"256", "1,000", "1.25", "0.1", "1,024", "400", "128"} <= set(rules)
    assert [(n, u) for n, u, _ in _unit_rules()] == [("2", r"\s*×"), ("5", r"(?:\s*min|-minute)"),
                                                    ("1", r"(?:\s*h\b|-hour)"), ("64", "-token"),
                                                    ("16", "-token"), ("95", r"\s*%")]


def test_computed_prose_is_rendered_once_never_printed_and_shown_again():
    """A result is printed once: no cell prints a text and then renders the same text as Markdown."""
    twice = []
    for path in NOTEBOOKS:
        for n, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            outs = cell.get("outputs", [])
            streams = "".join("".join(o.get("text", "")) for o in outs if o.get("output_type") == "stream")
            rendered = ["".join(o.get("data", {}).get("text/markdown", "")) for o in outs]
            if any(r and (r.strip() in streams or streams.strip() and streams.strip() in r) for r in rendered):
                twice.append(f"{path.name} cell {n}")
    assert twice == []
