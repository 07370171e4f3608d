"""The dialects the gateway speaks, one module each, and how a request finds its own.

``route_of`` tells a request's dialect by its method and path alone (never by anything
the harness claims). A path with ``//``, ``..`` or a percent-escape is no dialect's
route: a key is never attached to a path an upstream might read differently.
"""

from __future__ import annotations

from typing import Literal

from autopilot.gateway.dialects.base import Dialect, Route, StreamState, Usage
from autopilot.gateway.dialects.chat import DIALECT as CHAT
from autopilot.gateway.dialects.gemini import DIALECT as GEMINI
from autopilot.gateway.dialects.messages import DIALECT as MESSAGES
from autopilot.gateway.dialects.responses import DIALECT as RESPONSES

DialectName = Literal["chat", "responses", "messages", "gemini"]

# Checked in order: the first dialect that knows a route has it.
DIALECTS: dict[str, Dialect] = {d.name: d for d in (CHAT, RESPONSES, MESSAGES, GEMINI)}


def route_of(method: str, path: str) -> Route | None:
    """The route a request is to the dialect that knows it, or None."""
    trimmed = path.rstrip("/")
    if "//" in trimmed or "/../" in trimmed + "/" or "%" in trimmed:
        return None
    for dialect in DIALECTS.values():
        route = dialect.route(method, trimmed)
        if route is not None:
            return route
    return None


__all__ = ["CHAT", "DIALECTS", "GEMINI", "MESSAGES", "RESPONSES", "Dialect", "DialectName",
           "Route", "StreamState", "Usage", "route_of"]
