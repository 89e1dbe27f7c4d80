"""How rows encode content (pure: the request pipeline computes them, the store writes them): prefix chains,
messages as block references, a session's state columns, a ``turns`` row as a RequestRecord."""

from __future__ import annotations

import json
from operator import attrgetter
from typing import Any

from .._types import MessageBlock, RequestRecord
from .._util import common_prefix_length, digest
from ..request import PreparedRequest, canonical_json
from ..request._canonical import prefix_record

_CHAIN_KEY = attrgetter("chain_key")
_TOOLS_JSON: list[Any] = [None, None]  # (tools list object, its canonical JSON): tools rarely change


def _tools_json(tools: list[Any]) -> str:
    if _TOOLS_JSON[0] is not tools:
        _TOOLS_JSON[0], _TOOLS_JSON[1] = tools, canonical_json(tools)
    return str(_TOOLS_JSON[1])


# -- how rows encode content (pure: the request pipeline computes them, the store writes them) -------------

def prefix_chain(req: PreparedRequest, prev_keys: list[str], prev_nodes: list[str]) -> tuple[list[str], list[str], int]:
    """The ``prefix_nodes`` id of each segment (a node is the hash of its parent's id and its segment's key, so
    equal prefixes share nodes), extending the previous request's chain.

    Returns (keys, node_ids, shared): ``prev_keys`` / ``prev_nodes`` are the previous request's; the leading
    segments ``req`` shares with it as the same objects keep their keys, and its first ``shared`` nodes are
    reused, so a request costs O(new segments).
    """
    k = prefix_record(req)[1]
    if k and len(prev_keys) >= k:
        keys = prev_keys[:k] + list(map(_CHAIN_KEY, req.segments[k:]))
    else:
        keys = list(map(_CHAIN_KEY, req.segments))
    shared = common_prefix_length(keys, prev_keys, k if k and len(prev_keys) >= k else 0)
    nodes = prev_nodes[:shared]
    parent = nodes[-1] if nodes else None
    for key in keys[shared:]:
        parent = digest(((parent or "") + "/" + key).encode(), tag="node")
        nodes.append(parent)
    return keys, nodes, shared


def encode_message(message: dict[str, Any]) -> tuple[str, list[MessageBlock]]:
    """A message as block references (``{"role", "blocks": [hash...]}`` or ``{"role", "str": hash}``, canonical
    JSON) and its content blocks: each body is stored once in ``blocks``, however many messages use it."""
    role, content = message["role"], message["content"]
    if isinstance(content, str):
        body = canonical_json(content)
        h = digest(body.encode(), tag="seg")
        return canonical_json({"role": role, "str": h}), [(h, "msg-str", body, content)]
    blocks: list[MessageBlock] = []
    for i, element in enumerate(content):
        body = canonical_json(element)
        blocks.append((digest(body.encode(), tag="seg"), "msg-start" if i == 0 else "msg", body, element))
    return canonical_json({"role": role, "blocks": [b[0] for b in blocks]}), blocks


def state_columns(state: dict[str, Any]) -> dict[str, Any]:
    """A session's state dict as ``session_state`` column values (JSON columns canonicalised)."""
    return {
        "ltm_pin_text": state.get("ltm_pin_text"),
        "ltm_pin_keys": None if state.get("ltm_pin_keys") is None else json.dumps(state["ltm_pin_keys"]),
        "ltm_cache_text": state.get("ltm_cache_text"),
        "stable_ltm_text": state.get("stable_ltm_text"),
        "host_prompt": state["host_prompt"],
        "tools": _tools_json(state["tools"]),
        "model": state["model"],
        "extra": canonical_json(state.get("extra", {})),
    }


_RECORD_COLUMNS = RequestRecord.columns()
_RECORD_SELECT = ", ".join('"' + c + '"' for c in _RECORD_COLUMNS)
_RECORD_VALUES = attrgetter(*_RECORD_COLUMNS)
_INSERT_REQUEST = f"INSERT INTO turns ({_RECORD_SELECT}) VALUES ({', '.join('?' * len(_RECORD_COLUMNS))})"
