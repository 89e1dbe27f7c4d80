"""What to change, and what it would have saved: counterfactual replays of a stored session's own requests.

:func:`counterfactual` stores a session's requests transformed by fixes (:mod:`._fixes`) as a new simulated
session; :func:`advise` runs every applicable fix alone and all together and ranks them by dollars saved;
:func:`compaction_timing` says whether each compaction threw away a warm cache.
"""

from __future__ import annotations

from ._advice import Advice, advise
from ._compaction import compaction_timing
from ._counterfactual import COUNTERFACTUAL, counterfactual
from ._fidelity import fidelity
from ._fixes import FIX_NAMES, FIX_SOURCES, STRATEGY_FIXES

#: The fix names, in the order they apply.
FIXES = FIX_NAMES

__all__ = ["COUNTERFACTUAL", "FIXES", "FIX_SOURCES", "STRATEGY_FIXES", "Advice", "advise", "compaction_timing",
           "counterfactual", "fidelity"]
