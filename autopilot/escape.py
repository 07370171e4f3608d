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
    return value
