"""The curated namespace: few top-level names, the rest in their subpackage; a moved name still resolves, with one
DeprecationWarning naming its new spelling; Tab completion (``dir``) lists the public names of lazy modules."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import promptcache_nb as pc

ROOT = Path(__file__).resolve().parent.parent
#: Names kept free under the 47 budget for what comes next (none now).
RESERVED = 0


def test_the_top_level_is_small_and_every_name_resolves() -> None:
    # issue #24 adds capture and assert_cache_stable (the names its README section and CI template use); issue #36
    # adds fidelity (the error bars every advised dollar carries, named pc.fidelity in the issue); issue #38 adds
    # provider_crosscheck (the provider's own miss reasons beside ours, named pc.provider_crosscheck in the issue)
    assert len(pc.__all__) + RESERVED <= 47, len(pc.__all__)
    assert pc.__all__ == sorted(pc.__all__)
    for name in pc.__all__:
        assert getattr(pc, name) is not None, name
    assert set(pc.__all__) <= set(dir(pc))
    assert not set(pc._MOVED) & set(pc.__all__)


def test_readme_names_are_importable() -> None:
    assert pc.AnthropicCache is pc.cache.AnthropicCache
    assert pc.errors.RateLimitError.__mro__[1] is pc.errors.APIError
    assert pc.tokens.tokenizer_family("claude-sonnet-4-5")


def test_lazy_modules_list_their_public_names() -> None:
    assert "Stepper" in dir(pc.widgets) and "Any" not in dir(pc.widgets) and "TYPE_CHECKING" not in dir(pc.widgets)
    assert {"AnthropicBackend", "RecordingProxy"} <= set(dir(pc.live))
    assert {"import_log", "ImportResult"} <= set(dir(pc.ingest)) and "import_log" not in dir(pc.readers)
    assert {"Lab", "AnthropicBackend", "STRATEGIES"} <= set(dir(pc))


@pytest.mark.parametrize("old", sorted(pc._MOVED))
def test_a_moved_name_resolves_to_its_new_home(old: str) -> None:
    module, _, attr = pc._MOVED[old].rpartition(".")
    new = getattr(getattr(pc, module), attr)
    pc._warned.discard(old)
    with pytest.warns(DeprecationWarning, match=rf"promptcache_nb\.{old} moved: use pc\.{module}\.{attr}"):
        assert getattr(pc, old) is new


def test_an_old_name_warns_once() -> None:
    code = """
import warnings
import promptcache_nb as pc
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first, second = pc.SessionError, pc.SessionError
    from promptcache_nb import SessionError
assert first is second is SessionError is pc.errors.SessionError
assert [str(w.message) for w in caught] == [
    "promptcache_nb.SessionError moved: use pc.errors.SessionError (promptcache_nb.errors.SessionError)"], caught
assert caught[0].category is DeprecationWarning and caught[0].filename == "<string>"
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.returncode == 0, out.stderr


def test_every_subpackage_the_docs_spell_pc_x_resolves_after_import_promptcache_nb_alone() -> None:
    """``pc.fleet.import_logs`` as the fleet docstring and notebook 08 write it: in a fresh interpreter (in this one
    another test may have imported the subpackage already, which sets the attribute)."""
    code = ("import promptcache_nb as pc\n"
            "for sub in ('advice', 'analysis', 'errors', 'fleet', 'plots', 'tokens', 'widgets'):\n"
            "    assert getattr(pc, sub).__name__ == 'promptcache_nb.' + sub, sub\n"
            "assert callable(pc.fleet.import_logs) and callable(pc.fleet.open) and callable(pc.fleet.example_fleet)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.returncode == 0, out.stderr


def test_the_registries_stay_live() -> None:
    """``pc.STRATEGIES`` and ``pc.CACHE_MODELS`` list what is registered now, plugins included."""
    assert pc.STRATEGIES == pc.strategies.strategy_names() and pc.STRATEGIES[0] == "naive"
    assert pc.CACHE_MODELS == pc.cache.cache_model_names()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pc.strategies.STRATEGY_REGISTRY.lookup("naive") is pc.strategies.strategy_class("naive")
