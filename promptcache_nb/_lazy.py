"""Heavy dependencies bound at module level but loaded on first use, so ``import promptcache_nb`` stays light
(``tests/test_import_time.py``): pandas and numpy (~0.5 s together), genai_prices (~0.35 s, its price table) and
the two matplotlib modules the plots use (matplotlib loads with the first plot drawn).

``from .._lazy import pandas as pd`` at the top of a module binds a stand-in that imports pandas the first time
one of its attributes is read (``pd.DataFrame``); from then on it hands out the real module's attributes. Type
checkers see the real modules. Other heavy or optional imports (the anthropic SDK, starlette, ipywidgets,
zstandard...) stay inside the one function that needs them, each with its reason.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any


class _OnFirstUse:
    """A module imported when one of its attributes is first read."""

    def __init__(self, name: str) -> None:
        self.__name = name

    def __getattr__(self, attr: str) -> Any:  # only for names not read before (the instance holds those)
        value = getattr(importlib.import_module(self.__name), attr)
        setattr(self, attr, value)  # the next read is a plain attribute lookup, as fast as the module's own
        return value

    def __repr__(self) -> str:
        return f"<module {self.__name!r}, imported on first use>"


if TYPE_CHECKING:
    import genai_prices as genai_prices
    import matplotlib.figure as mpl_figure
    import matplotlib.ticker as mpl_ticker
    import numpy as numpy
    import pandas as pandas
else:
    genai_prices = _OnFirstUse("genai_prices")
    mpl_figure = _OnFirstUse("matplotlib.figure")
    mpl_ticker = _OnFirstUse("matplotlib.ticker")
    numpy = _OnFirstUse("numpy")
    pandas = _OnFirstUse("pandas")

__all__ = ["genai_prices", "mpl_figure", "mpl_ticker", "numpy", "pandas"]
