"""What the gateway learns from each request and response, as plain data (pure).

The proxy (autopilot.gateway.proxy) moves bytes; this module decides what they mean:
which requests carry an arm's settings and how they are merged in, what an error is a
sign of, what a response says the model used, and the running totals of one attempt
(``Meter``). Everything here reads untrusted input — a harness's request body, an
endpoint's response — so every value is shape-checked and bounded before it counts.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from autopilot.gateway.dialects import CHAT, Dialect, StreamState, Usage
from autopilot.gateway.jsonbound import STREAM_DEPTH, loads_bounded
from autopilot.state.tokens import Tokens

if TYPE_CHECKING:  # a type only: the data path serving this loads no pydantic
    from autopilot.state.cellevents import MeterSummary

if TYPE_CHECKING:  # the attempt's data path runs this module: it must not load config
    from autopilot.config import Preset

LINE_CAP = 1 << 20  # one SSE line we still parse; a longer one is passed, not parsed

ErrorKind = Literal["endpoint_error", "throttled", "context_overflow", "request_error",
                    "client_closed"]

# How llama-server, vLLM and hosted providers word "the prompt does not fit".
_CONTEXT = re.compile(
    r"context[ _-]?(length|window|size)|maximum context|exceeds? the available context|"
    r"context_length_exceeded|too many tokens|prompt is too long|max_model_len|"
    r"maximum (input|model) length",
    re.IGNORECASE)


def merge(body: Any, settings: Mapping[str, Any]) -> Any:
    """The request body with the arm's settings deep-merged in (the arm wins: it is the
    experiment). Nested objects merge key by key; anything else is replaced."""
    if not isinstance(body, dict):
        return body
    out = dict(body)
    for key, value in settings.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def error_kind(status: int | None, text: str = "", vendor: str | None = None
               ) -> ErrorKind | None:
    """What a failed request is a sign of. ``status`` None: no answer at all (refused,
    reset, timed out): the endpoint's fault, as a 5xx is. A 429, Anthropic's 529 and
    what a dialect's own words say is capacity (``vendor``: its reading, e.g.
    ``overloaded_error``) are the provider asking us to slow down: infrastructure, never
    the model's FAIL. A 400 that says the prompt does not fit is the model's context,
    not the harness's request."""
    if vendor in ("throttled", "endpoint_error"):
        return vendor  # type: ignore[return-value]
    if status in (429, 529):
        return "throttled"
    if status is None or status >= 500:
        return "endpoint_error"
    if status >= 400:
        if status in (400, 413, 422) and _CONTEXT.search(text[:4000]):
            return "context_overflow"
        return "request_error"
    return None


@dataclass
class StreamScan:
    """Reads a server-sent event stream as it passes, in its dialect: the last usage it
    carried, the finish reason, who answered, an error it carried, and how many events
    carried text (the estimate when the endpoint sends no usage). Holds at most one
    partial line, cut at LINE_CAP."""
    dialect: Dialect = CHAT
    state: StreamState = field(default_factory=StreamState)
    _event: str | None = None  # the current event's name (an ``event:`` line)
    _partial: bytes = b""
    _skipping: bool = False  # inside an over-long line: drop to its end

    @property
    def usage(self) -> Usage | None:
        return self.state.usage

    @property
    def finish(self) -> str | None:
        return self.state.finish

    @property
    def model(self) -> str | None:
        return self.state.model

    @property
    def chunks(self) -> int:
        return self.state.chunks

    def feed(self, data: bytes) -> None:
        buf = self._partial + data
        lines = buf.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if self._skipping:
                self._skipping = False
                continue
            self._line(line)
        if len(self._partial) > LINE_CAP:
            self._partial, self._skipping = b"", True

    def _line(self, line: bytes) -> None:
        line = line.strip()
        if not line:
            self._event = None  # a blank line ends an event
            return
        if line.startswith(b"event:"):
            self._event = line[6:].strip()[:80].decode("ascii", "replace")
            return
        if not line.startswith(b"data:"):
            return
        self.dialect.event(self.state, self._event, line[5:].strip())


@dataclass
class Meter:
    """One attempt's requests through the gateway, summed; ``in_flight`` and
    ``progress`` are what the watchdog reads (a request started, a chunk arrived, a
    response ended: each moves ``progress``)."""
    requests: int = 0
    answered: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0  # every input token, cache-inclusive
    completion_tokens: int = 0  # output, reasoning included
    reasoning_tokens: int = 0
    # The cache buckets: None until a response reports one (absent, not 0).
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    estimated: int = 0  # responses whose completion count is an estimate (no usage)
    malformed_usage: int = 0
    in_flight: int = 0
    progress: int = 0
    bytes_in: int = 0
    failovers: int = 0  # requests sent to another replica than the cell's own
    first_error: str | None = None  # the first request's error kind ("" when it was fine)
    last_error: str | None = None
    models: dict[str, int] = field(default_factory=dict)  # who the responses say answered
    unmetered: int = 0  # answered requests whose spend the gateway could not read
    unauthorized: int = 0  # requests refused for not carrying the attempt's key (401)
    refused: int = 0  # the attempt's own requests refused for their route or model (403)
    # Requests at the end of the attempt the provider refused as throttled (429, 529,
    # overloaded), none answered since: a harness that gave up on them gave up on the
    # provider, not on the task (autopilot.cell.validity.throttled_out).
    throttled_tail: int = 0

    def answered_as(self, model: str | None) -> None:
        if model is not None and (model in self.models or len(self.models) < 8):
            self.models[model] = self.models.get(model, 0) + 1

    def count(self, usage: Usage | None, estimate: int = 0) -> None:
        if usage is not None and usage.malformed:
            self.malformed_usage += 1
        if usage is not None and usage.completion is not None:
            self.completion_tokens += usage.completion
        elif estimate:
            self.completion_tokens += estimate
            self.estimated += 1
        if usage is not None:
            tokens = usage.tokens
            self.prompt_tokens += tokens.prompt or 0
            self.reasoning_tokens += tokens.reasoning or 0
            if tokens.cache_read is not None:
                self.cache_read_tokens = (self.cache_read_tokens or 0) + tokens.cache_read
            if tokens.cache_write is not None:
                self.cache_write_tokens = (self.cache_write_tokens or 0) + tokens.cache_write

    def tokens(self) -> Tokens:
        """The attempt's tokens by bucket (fresh input is the input no cache bucket
        holds; reasoning is said only where some response reported it)."""
        cached = (self.cache_read_tokens or 0) + (self.cache_write_tokens or 0)
        return Tokens(input=max(self.prompt_tokens - cached, 0),
                      cache_write=self.cache_write_tokens,
                      cache_read=self.cache_read_tokens, output=self.completion_tokens,
                      reasoning=self.reasoning_tokens or None)

    def error(self, kind: str, why: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.last_error = why[:300]
        if kind == "throttled":
            self.throttled_tail += 1

    def summary(self) -> MeterSummary:
        return {"requests": self.requests, "answered": self.answered,
                "errors": dict(self.errors), "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "reasoning_tokens": self.reasoning_tokens,
                "tokens": self.tokens().as_dict(), "estimated": self.estimated,
                "malformed_usage": self.malformed_usage, "failovers": self.failovers,
                "first_error": self.first_error or None, "last_error": self.last_error,
                "models": dict(self.models), "unmetered": self.unmetered,
                "unauthorized": self.unauthorized, "refused": self.refused,
                "throttled_tail": self.throttled_tail}


def mode_line(preset: Preset) -> str:
    """What --dry-run says of the gateway."""
    gateway, endpoint = preset.gateway, preset.endpoint
    if not gateway.enabled:
        return "gateway: off (gateway = false): harnesses talk to the endpoint directly"
    routed = [f"{arm.label} -> {arm.route.dialect} {arm.route.origin()} ({arm.route.model})"
              for arm in preset.arms if arm.route]
    if not preset.uses_gateway:
        return f"gateway: not used for a {endpoint.engine!r} endpoint: harnesses reach it directly"
    arms = [arm.label for arm in preset.arms if arm.requests_settings]
    key, name = "", endpoint.key_env()
    if name:
        key = f"; ${name} stays here, the harness gets its attempt's key"
    return ("gateway: a 127.0.0.1 listener per attempt; {port}/{host}/{base_url} name it, "
            "{endpoint_port}/{endpoint_base_url} the endpoint; request settings from "
            + (", ".join(arms) if arms else "no arm") + key
            + ("; routes: " + ", ".join(routed) if routed else ""))


__all__ = ["STREAM_DEPTH", "ErrorKind", "Meter", "StreamScan", "Usage", "error_kind",
           "loads_bounded", "merge", "mode_line"]
