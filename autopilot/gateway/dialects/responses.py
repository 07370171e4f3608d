"""OpenAI's Responses API (``POST /responses``): what Codex CLI speaks.

Usage: ``input_tokens`` (cache-inclusive; ``input_tokens_details.cached_tokens`` is the
cache read), ``output_tokens`` (reasoning inclusive;
``output_tokens_details.reasoning_tokens``). A stream is named events (``event:``
lines, the same name as the data's ``type``): ``response.output_text.delta`` and the
other deltas carry text, ``response.completed`` / ``response.incomplete`` /
``response.failed`` carry the whole response with its usage, ``error`` an error. The
arm's reasoning setting goes in the request's own ``reasoning`` object.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from autopilot.gateway.dialects.base import (
    Counts,
    Dialect,
    Route,
    StreamState,
    Usage,
    minus,
)
from autopilot.gateway.jsonbound import STREAM_DEPTH, loads_bounded
from autopilot.state.tokens import Tokens

# Deltas are most of a stream: one that carries text is told in C without parsing it.
_DELTA = re.compile(rb'"type"\s*:\s*"response\.[a-z_.]*delta"')
_NONEMPTY = re.compile(rb'"delta"\s*:\s*"(?!")|"delta"\s*:\s*\{')
_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed",
                   "response.created", "response.in_progress"})


def usage_of_responses(u: Any) -> Usage:
    counts = Counts(u)
    total = counts.get("input_tokens")
    cached = counts.get("input_tokens_details", "cached_tokens")
    return counts.usage(Tokens(input=minus(total, cached), cache_read=cached,
                               output=counts.get("output_tokens"),
                               reasoning=counts.get("output_tokens_details", "reasoning_tokens")))


class Responses(Dialect):
    name: ClassVar[str] = "responses"

    def route(self, method: str, path: str) -> Route | None:
        if method == "POST" and path.endswith("/responses"):
            return Route(self, generates=True, metered=True, keyed=True)
        if method == "POST" and path.endswith("/responses/input_tokens"):
            return Route(self, keyed=True)  # counting tokens: free, but keyed
        return None

    def usage(self, doc: Any) -> Usage | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("usage"), dict):
            return None
        return usage_of_responses(doc["usage"])

    def finish(self, doc: Any) -> str | None:
        if not isinstance(doc, dict):
            return None
        status = doc.get("status")
        details = doc.get("incomplete_details")
        if status == "incomplete" and isinstance(details, dict) \
                and isinstance(details.get("reason"), str):
            return str(details["reason"])[:40]  # e.g. max_output_tokens
        return status[:40] if isinstance(status, str) and status != "in_progress" else None

    def event(self, state: StreamState, name: str | None, payload: bytes) -> None:
        if (name is not None and name.endswith("delta")) or _DELTA.search(payload[:120]):
            if _NONEMPTY.search(payload):
                state.chunks += 1
            return
        doc = loads_bounded(payload, STREAM_DEPTH)
        if not isinstance(doc, dict):
            return
        kind = doc.get("type") if isinstance(doc.get("type"), str) else name
        if kind == "error" or kind == "response.failed":
            err = doc.get("error")
            if kind == "response.failed" and isinstance(doc.get("response"), dict):
                err = doc["response"].get("error")
            state.error = _words(err) or "the stream ended in an error"
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            state.done = True
        if kind in _ENDS and isinstance(doc.get("response"), dict):
            resp = doc["response"]
            state.usage = self.usage(resp) or state.usage
            state.finish = self.finish(resp) or state.finish
            state.model = self.model(resp) or state.model


def _words(err: Any) -> str | None:
    if isinstance(err, dict):
        parts = [str(err.get(k))[:200] for k in ("code", "type", "message") if err.get(k)]
        return ": ".join(parts) or None
    return None


DIALECT = Responses()

__all__ = ["DIALECT", "Responses", "usage_of_responses"]
