"""Escaping for everything that comes from outside (a harness, a grader, an endpoint,
the state dir) on its way to a medium that interprets it.

A ``finish_reason`` of ``<img src=x onerror=...>`` rendered by a markdown viewer runs
script; ``\\x1b]8;;javascript:...`` on a terminal is a link; ``[link=...]`` in a rich
string is markup; a newline or ``|`` breaks a markdown table. Each medium has one
function here, and each starts by removing control characters (C0 except tab, DEL, C1,
and the bidi overrides that make text read differently than it is).
"""

from __future__ import annotations

import math
import re
from typing import Any

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# Markdown's inline specials (md() output is always inline, never at a line start, so
# '#', '-', '+', '.' cannot open a heading or a list there); '<', '>' and '&' become
# entities first, so a renderer that passes HTML through gets text.
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()|~!])")


def clean(value: Any, limit: int = 200) -> str:
    """Text with control characters replaced by spaces, cut to ``limit`` characters."""
    text = value if isinstance(value, str) else repr(value)
    if not text.isprintable():  # C-fast check first: most values have nothing to strip
        text = _CONTROL.sub(" ", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_CONTROL_KEEP_LINES = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def block(text: str) -> str:
    """Multi-line text (a log tail) with control characters removed, newlines kept."""
    return _CONTROL_KEEP_LINES.sub("", text.replace("\r\n", "\n"))


def md(value: Any, limit: int = 200) -> str:
    """Inline markdown (a table cell, a list item): no markup, no HTML, one line."""
    text = clean(value, limit)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", text)


def term(value: Any, limit: int = 200) -> str:
    """Plain text for a terminal: control characters (escape sequences) removed."""
    return clean(value, limit)


def rich(value: Any, limit: int = 200) -> str:
    """Text inside a rich markup string: control characters removed, markup escaped."""
    from rich.markup import escape

    return escape(clean(value, limit))


def sane(value: Any, depth: int = 0) -> Any:
    """A state-dir value made safe to show: strings without control characters (and
    bounded), containers recursed to a fixed depth. Markup and HTML escaping are each
    view's job; this removes what no view should ever pass through."""
    if isinstance(value, str):
        return clean(value, 2000)
    if depth > 8:
        return None
    if isinstance(value, dict):
        return {clean(str(k), 200): sane(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [sane(v, depth + 1) for v in value[:10_000]]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_INT:
        return None  # a 401-digit integer overflows the first float it meets
    return value


_MAX_INT = 2**63

VALUE_CAP = 4096  # characters of one string we journal or log from outside
ITEMS_CAP = 1000  # entries of one list or dict


def bounded(value: Any, limit: int = VALUE_CAP, depth: int = 0) -> Any:
    """A value to journal or log, bounded: long strings cut with a marker saying how
    much, long lists and dicts cut, nesting past 16 levels dropped. A grader writing a
    5 MB verdict word costs the journal 4 KB, not 20 MB (and the log the same)."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        return f"{value[:limit]}…[cut {len(value) - limit} chars]"
    if depth > 16:
        return "…[cut: nested too deep]"
    if isinstance(value, dict):
        if len(value) <= ITEMS_CAP and all(
                isinstance(k, str) and isinstance(v, int | float | bool | None)
                and len(k) <= limit for k, v in value.items()):
            return value  # the common case: a flat record of numbers, checked cheaply
        items = list(value.items())
        out = {bounded(str(k), 200): bounded(v, limit, depth + 1) for k, v in items[:ITEMS_CAP]}
        if len(items) > ITEMS_CAP:
            out["…"] = f"[cut {len(items) - ITEMS_CAP} entries]"
        return out
    if isinstance(value, list | tuple):
        out_list = [bounded(v, limit, depth + 1) for v in value[:ITEMS_CAP]]
        if len(value) > ITEMS_CAP:
            out_list.append(f"…[cut {len(value) - ITEMS_CAP} items]")
        return out_list
    return value


def finite(value: Any, default: float = 0.0) -> float:
    """A number from outside as a float: ``default`` for anything that is not a finite
    number (a string, a bool, NaN, an integer too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    try:
        f = float(value)
    except OverflowError:
        return default
    return f if math.isfinite(f) else default
