"""JSON from untrusted bytes, bounded in depth (pure): a harness's request body, an
endpoint's response or one event of its stream."""

from __future__ import annotations

import json
from typing import Any

STREAM_DEPTH = 64  # JSON nesting read in one stream event


def loads_bounded(data: bytes | str, max_depth: int) -> Any:
    """JSON from untrusted bytes, or None: invalid (UTF-8 included), or nested deeper
    than ``max_depth``. The C parser guards its own recursion (RecursionError, caught
    here); the depth is then checked without recursion, looking at containers only."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return doc  # fewer brackets than the bound (counted in C): cannot nest deeper
    return None if _deeper_than(doc, max_depth) else doc


def _deeper_than(doc: Any, limit: int) -> bool:
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


__all__ = ["STREAM_DEPTH", "loads_bounded"]
