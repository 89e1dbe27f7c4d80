"""Files shipped inside the package (scenarios, example logs), found through importlib.resources."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from .errors import PromptCacheError


def data_path(*parts: str) -> Path:
    """A file or folder shipped with promptcache_nb, e.g. ``pc.data_path("scenarios", "tiny.yaml")`` or
    ``pc.data_path("logs")`` (the example agent logs notebook 06 imports)."""
    path = Path(str(resources.files("promptcache_nb").joinpath("data", *parts)))
    if not path.exists():
        shipped = sorted(p.name for p in Path(str(resources.files("promptcache_nb").joinpath("data"))).iterdir())
        raise PromptCacheError(f"no bundled data {'/'.join(parts)!r}; shipped: {', '.join(shipped)}")
    return path
