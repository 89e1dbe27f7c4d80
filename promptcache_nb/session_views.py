"""A session's stored requests read back: the turns frame, a Turn rebuilt byte-identical, deltas, what-ifs."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from . import analysis as _analysis
from ._types import RequestRecord
from .cache import CacheModel
from .errors import SessionError
from .request import SegmentMemo, prepare, visible
from .session_core import SessionCore
from .store import Store
from .turn import TURN_COLUMNS, Turn

if TYPE_CHECKING:
    import pandas as pd


class SessionViews(SessionCore):
    """What a session stored, read back (:class:`~promptcache_nb.Session` is one)."""

    # -- reading back -------------------------------------------------------------------------
    def turns(self) -> pd.DataFrame:
        """One row per request, oldest first. Token figures: see ``usage_source`` (simulated = estimated).
        ``body_problems``: what the API would refuse in an imported body stored as its log held it (JSON list of
        ``{path, problem}``; None when clean)."""
        self._check_open()
        df = self._lab.store.turns_frame(self.id, TURN_COLUMNS)
        # a label for reading: the user's text with invisible characters shown (the body keeps the raw text)
        df["user_text"] = [visible(t) if isinstance(t, str) else t for t in df["user_text"]]
        return df

    def turn(self, index: int) -> Turn:
        """A stored turn, rebuilt from the store (body byte-identical to what was sent)."""
        self._check_open()
        store = self._lab.store
        rec = store.read_request(self.id, index)
        if rec is None:
            raise SessionError(f"session {self.id!r} has no turn {index}")
        return _stored_turn(store, rec, memo=self._memo)

    @property
    def last_turn(self) -> Turn | None:
        n = self._state.next_index
        return None if n == 0 else self.turn(n - 1)

    def deltas(self) -> pd.DataFrame:
        """This session's ``session_prompt_deltas`` rows."""
        return self._lab.store.deltas_frame(self.id)

    def resimulate(self, cache: str | CacheModel = "openai", **kwargs: Any) -> pd.DataFrame:
        """This session's stored requests replayed under another cache model (``pc.resimulate``)."""
        self._check_open()
        return _analysis.resimulate(self._lab, self.id, cache, **kwargs)

    def efficiency(self) -> float | None:
        """Σ cache_read / Σ ideal_cache_read over the session (None before any ideal read)."""
        df = self.turns()
        ideal = df.ideal_cache_read.sum()
        return None if ideal == 0 else float(df.cache_read_input_tokens.sum() / ideal)


def _stored_turn(store: Store, rec: RequestRecord, *, memo: SegmentMemo) -> Turn:
    """A stored request as a :class:`Turn`: its body rebuilt, its diff and observation from the stored columns."""
    sid, index = rec.session_id, rec.idx
    bodies = store.turn_bodies(sid, [index - 1, index] if index > 0 else [index])
    body, prev_body = bodies[index], bodies.get(index - 1)
    prepared = prepare(body, memo=memo)  # the session's tokenizer
    diff, obs = _analysis.stored_diff_and_observation(store, sid, index, prev_body, body, memo=memo,
                                                      current=prepared)
    return Turn(
        prepared=prepared,
        session_id=sid, index=index, at=rec.sent_at, request=body, usage=rec.usage,
        ideal_cache_read=rec.ideal_cache_read or 0, total_tokens=rec.total_tokens or 0, cost_usd=rec.cost_usd,
        cost_no_cache_usd=rec.cost_no_cache_usd, cache_reason=rec.cache_reason, cache_detail=rec.detail,
        events=rec.event_codes, request_id=rec.request_id,
        reply=store.resolve_refs([json.loads(rec.reply)], session_id=sid)[0]["content"] if rec.reply else None,
        diff=diff, observation=obs, prompt_cache_info=obs.prompt_cache_info() if obs is not None else None,
        segment_states=rec.segment_states, cost_source=rec.cost_source,
    )
