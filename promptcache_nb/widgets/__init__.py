"""Notebook widgets: thin ipywidgets views over pure controllers (``pc.widgets``).

- :class:`Stepper` — step a session one scenario turn at a time ("Next turn", "Run to end", "Restart", a
  request slider) and see each request's diff, segment map, usage, observation and the savings chart.
- :class:`KnowledgeEditor` — list, add, edit and remove knowledge entries between turns.
- :class:`DiffView` — the escaped side-by-side prefix diff plus the segment map.
- :class:`SavingsChart` — :func:`promptcache_nb.plots.plot_savings` as a widget.
- :class:`Compare` — one scenario under several strategies in lockstep.
- :class:`WhatIf` — tick fixes and see what they would have saved on a session's own requests.
- :func:`markdown` and :func:`table` — computed prose whose ``$`` stays money, and DataFrames that fit a notebook.
- :class:`Monitor` — a captured session's calls as they arrive (``lab.capture(client)``): rows, running read %,
  $ saved, the latest request's diff and observation.

Every button has a kernel-side twin (``stepper.next()``, ``editor.edit(...)``) and every view a controller
(``stepper.controller``) that works without a kernel. While a click works its buttons are disabled, a
progress bar moves for multi-request work, and a status line says what it did; every view also renders a
static HTML snapshot for notebooks opened without a kernel. A *request* is one stored API call; a
*scenario turn* is one user turn (one request, or several with a tool loop). The views import ipywidgets
on first use, so ``import promptcache_nb`` stays light for the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._controllers import CompareController, KnowledgeController, MonitorController, StepperController, TurnView
from ._display import Table, markdown, table
from ._whatif import WhatIfController

if TYPE_CHECKING:  # pragma: no cover
    from ._views import Compare, DiffView, KnowledgeEditor, Monitor, SavingsChart, Stepper, WhatIf

_VIEWS = ("Compare", "DiffView", "KnowledgeEditor", "Monitor", "SavingsChart", "Stepper", "WhatIf")


def __getattr__(name: str) -> Any:
    if name in _VIEWS:
        from . import _views  # ipywidgets loads with the first view asked for, not with pc.widgets

        return getattr(_views, name)
    raise AttributeError(f"module 'promptcache_nb.widgets' has no attribute {name!r}")



def __dir__() -> list[str]:
    return sorted(__all__)  # the public names, the lazily loaded ones included (Tab completion)


__all__ = [  # sorted; a literal so linters see the re-exports
    "Compare", "CompareController", "DiffView", "KnowledgeController", "KnowledgeEditor", "Monitor",
    "MonitorController", "SavingsChart", "Stepper", "StepperController", "Table", "TurnView", "WhatIf",
    "WhatIfController", "markdown", "table",
]
