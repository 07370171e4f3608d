"""What one finished response counts for (pure but for the attempt's meter and record):
its usage by bucket in its dialect, its finish reason, the model that answered, or the
kind of error it is — and, where the gateway cannot read its spend, ``unmetered``, never
0 tokens."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from autopilot.gateway.attempt import Attempt, GatewayLimits
from autopilot.gateway.dialects import Dialect
from autopilot.gateway.evidence import StreamScan, error_kind, loads_bounded
from autopilot.gateway.policy import ERROR_BODY
from autopilot.gateway.record import Record


def account(att: Attempt, rec: Record, status: int, dialect: Dialect,
            scan: StreamScan | None, held: list[bytes], held_n: int, metered: bool,
            encoding: str, lim: GatewayLimits, redact: Callable[[str], str]) -> None:
    """Count one finished response: its usage by bucket, finish, who answered, or the
    kind of error it is; unmetered where its spend cannot be read (never 0 tokens)."""
    meter = att.meter
    unmetered: str | None = None
    doc: Any = None
    if encoding not in ("", "identity"):
        # asked for identity; an endpoint that encodes anyway is not read as 0 tokens
        unmetered = f"response encoded as {encoding[:20]!r}"
        usage, finish, estimate, model = None, None, 0, None
        scan = None
    elif scan is not None:
        rec.chunks = scan.chunks
        usage, finish, estimate = scan.usage, scan.finish, scan.chunks
        model = scan.model
        if usage is None and not scan.chunks:
            unmetered = "a stream with no usage and no content the gateway could read"
    else:
        if held_n <= lim.parse_cap:
            doc = loads_bounded(b"".join(held), lim.max_depth)
            if doc is None and status < 400:
                unmetered = "a response that is not JSON the gateway can read"
        elif status < 400:
            rec.unparsed = f"body over {lim.parse_cap} bytes"
            unmetered = f"a response over {lim.parse_cap} bytes"
        usage, finish, estimate = dialect.usage(doc), dialect.finish(doc), 0
        model = dialect.model(doc)
        if unmetered is None and usage is None and status < 400:
            unmetered = "a response without usage"
    kind = error_kind(status, error_text(doc, held) if status >= 400 else "",
                      dialect.refusal(status, doc) if status >= 400 else None)
    if kind is None and scan is not None and scan.state.error is not None:
        # An error the stream itself carried after a 200 (Anthropic's
        # overloaded_error mid-stream): the provider's, never the model's answer.
        why = scan.state.error
        kind = "throttled" if "overloaded" in why or "rate_limit" in why else \
            "endpoint_error"
        meter.error(kind, f"in-stream error: {why}"[:300])
        rec.error, rec.body = kind, redact(why)[:ERROR_BODY]
        if usage is not None:
            meter.count(usage, 0)
        return
    if kind is not None:
        meter.error(kind, f"HTTP {status}")
        rec.error, rec.body = kind, redact(error_text(doc, held))[:ERROR_BODY]
        return
    if usage is not None and usage.malformed and unmetered is None:
        unmetered = "usage of the wrong shape"
    if metered and unmetered is not None:
        rec.unmetered = unmetered
    meter.throttled_tail = 0  # answered: the provider took the cell's requests again
    meter.count(usage, estimate)
    meter.answered_as(model)
    if model is not None:
        rec.model = model
    rec.usage, rec.estimate = usage, estimate
    rec.finish_reason = finish or None


def error_text(doc: Any, held: list[bytes]) -> str:
    if doc is not None:
        return json.dumps(doc)[:ERROR_BODY * 2]
    return b"".join(held)[:ERROR_BODY * 2].decode("utf-8", "replace")


__all__ = ["account", "error_text"]
