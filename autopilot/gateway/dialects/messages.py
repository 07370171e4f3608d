"""Anthropic's Messages API (``POST /v1/messages``): what Claude Code speaks.

The key goes in ``x-api-key`` (with the client's own ``anthropic-version``). Usage:
``input_tokens`` is fresh input only; ``cache_creation_input_tokens`` and
``cache_read_input_tokens`` are the cache buckets beside it; ``output_tokens`` includes
any thinking. A stream is named events: ``message_start`` carries the message with its
input usage, ``content_block_delta`` the text (``text_delta``, ``thinking_delta``,
``input_json_delta``), ``message_delta`` the stop reason and the cumulative output
usage, ``error`` an error mid-stream (``overloaded_error``: Anthropic asking us to slow
down, as its HTTP 529 does). ``/v1/messages/count_tokens`` is free and carries the key.
The arm's thinking setting goes in the request's own ``thinking`` object.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from autopilot.gateway.dialects.base import Counts, Dialect, Route, StreamState, Usage
from autopilot.gateway.jsonbound import STREAM_DEPTH, loads_bounded
from autopilot.state.tokens import Tokens

ANTHROPIC_VERSION = "2023-06-01"
# A delta event that carries text (told in C, without parsing it).
_TEXT = re.compile(rb'"(?:text|thinking|partial_json)"\s*:\s*"(?!")')
# Anthropic's error types that are its capacity, not the request (HTTP 429 and 529).
THROTTLE_TYPES = frozenset({"overloaded_error", "rate_limit_error"})


class Messages(Dialect):
    name: ClassVar[str] = "messages"
    key_header: ClassVar[str] = "x-api-key"
    key_scheme: ClassVar[str] = ""
    models_path: ClassVar[str] = "/v1/models?limit=1000"

    def route(self, method: str, path: str) -> Route | None:
        if method != "POST":
            return None
        if path.endswith("/messages"):
            return Route(self, generates=True, metered=True, keyed=True)
        if path.endswith("/messages/count_tokens"):
            return Route(self, keyed=True)
        return None

    def probe_headers(self, key: str) -> dict[str, str]:
        return {**self.auth(key), "anthropic-version": ANTHROPIC_VERSION}

    def usage(self, doc: Any) -> Usage | None:
        reported = doc.get("usage") if isinstance(doc, dict) else None
        if not isinstance(reported, dict):
            return None
        counts = Counts(reported)
        return counts.usage(Tokens(input=counts.get("input_tokens"),
                                   cache_write=counts.get("cache_creation_input_tokens"),
                                   cache_read=counts.get("cache_read_input_tokens"),
                                   output=counts.get("output_tokens")))

    def finish(self, doc: Any) -> str | None:
        reason = doc.get("stop_reason") if isinstance(doc, dict) else None
        return reason[:40] if isinstance(reason, str) else None

    def event(self, state: StreamState, name: str | None, payload: bytes) -> None:
        if name == "content_block_delta" or (name is None and b'"content_block_delta"'
                                             in payload[:60]):
            if _TEXT.search(payload):
                state.chunks += 1
            return
        if name == "message_stop" or (name is None and b'"message_stop"' in payload[:40]):
            state.done = True
            return
        if name in ("ping", "content_block_stop"):
            return
        doc = loads_bounded(payload, STREAM_DEPTH)
        if not isinstance(doc, dict):
            return
        kind = doc.get("type")
        if kind == "message_start" and isinstance(doc.get("message"), dict):
            msg = doc["message"]
            state.model = self.model(msg) or state.model
            state.usage = (self.usage(msg) or Usage()).over(state.usage)
        elif kind == "message_delta":
            # cumulative counts: the last event's word stands, bucket by bucket
            got = self.usage(doc)
            if got is not None:
                state.usage = got.over(state.usage)
            delta = doc.get("delta")
            state.finish = self.finish(delta) or state.finish
        elif kind == "error":
            state.error = _error_type(doc) or "error"

    def refusal(self, status: int, doc: Any) -> str | None:
        if _error_type(doc) in THROTTLE_TYPES or status == 529:
            return "throttled"
        return None


def _error_type(doc: Any) -> str | None:
    err = doc.get("error") if isinstance(doc, dict) else None
    kind = err.get("type") if isinstance(err, dict) else None
    return kind[:60] if isinstance(kind, str) else None


DIALECT = Messages()

__all__ = ["ANTHROPIC_VERSION", "DIALECT", "THROTTLE_TYPES", "Messages"]
