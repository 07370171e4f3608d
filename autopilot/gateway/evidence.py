"""What the gateway learns from each request and response, as plain data (pure).

The proxy (autopilot.gateway.proxy) moves bytes; this module decides what they mean:
which requests carry an arm's settings and how they are merged in, what an error is a
sign of, what a response says the model used, and the running totals of one attempt
(``Meter``). Everything here reads untrusted input — a harness's request body, an
endpoint's response — so every value is shape-checked and bounded before it counts.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from autopilot.state.budget import count_or_none

if TYPE_CHECKING:  # the attempt's data path runs this module: it must not load config
    from autopilot.config import Preset

# Routes whose JSON body is a generation request: the arm's settings go into these.
MODEL_ROUTES = ("/chat/completions", "/completions")
# Routes a model is used (and paid for) through: each response's usage is read, and one
# the gateway cannot read is marked unmetered. The only routes a provider's key reaches.
METERED_ROUTES = (*MODEL_ROUTES, "/responses", "/embeddings")
LINE_CAP = 1 << 20  # one SSE line we still parse; a longer one is passed, not parsed
STREAM_DEPTH = 64  # JSON nesting read in one stream event

ErrorKind = Literal["endpoint_error", "throttled", "context_overflow", "request_error",
                    "client_closed"]

# How llama-server, vLLM and hosted providers word "the prompt does not fit".
_CONTEXT = re.compile(
    r"context[ _-]?(length|window|size)|maximum context|exceeds? the available context|"
    r"context_length_exceeded|too many tokens|prompt is too long|max_model_len|"
    r"maximum (input|model) length",
    re.IGNORECASE)


def is_model_route(method: str, path: str) -> bool:
    return method == "POST" and path.rstrip("/").endswith(MODEL_ROUTES)


def is_provider_route(method: str, path: str) -> bool:
    """A route a model is used through (METERED_ROUTES), by POST: what a provider's key
    may be attached to. ``..`` and ``//`` are never such a route."""
    p = path.rstrip("/")
    return (method == "POST" and p.endswith(METERED_ROUTES) and "//" not in p
            and "/../" not in p + "/" and "%" not in p)


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


def error_kind(status: int | None, text: str = "") -> ErrorKind | None:
    """What a failed request is a sign of. ``status`` None: no answer at all (refused,
    reset, timed out): the endpoint's fault, as a 5xx is. A 400 that says the prompt
    does not fit is the model's context, not the harness's request."""
    if status is None or status >= 500:
        return "endpoint_error"
    if status == 429:
        return "throttled"
    if status >= 400:
        if status in (400, 413, 422) and _CONTEXT.search(text[:4000]):
            return "context_overflow"
        return "request_error"
    return None


@dataclass(frozen=True)
class Usage:
    prompt: int | None = None
    completion: int | None = None
    reasoning: int | None = None
    malformed: bool = False  # a count of the wrong shape (negative, huge, a string)


def _count(v: Any) -> tuple[int | None, bool]:
    if v is None:
        return None, False
    n = count_or_none(v)
    if n is None or n < 0 or isinstance(v, bool):
        return None, True
    return int(n), False


def usage_of(doc: Any) -> Usage | None:
    """The ``usage`` object of a response (or of a stream's final chunk), checked."""
    if not isinstance(doc, dict) or not isinstance(doc.get("usage"), dict):
        return None
    u = doc["usage"]
    # Chat and completions say prompt/completion_tokens; the Responses API input/output.
    responses = "prompt_tokens" not in u and ("input_tokens" in u or "output_tokens" in u)
    prompt, bad_p = _count(u.get("input_tokens" if responses else "prompt_tokens"))
    completion, bad_c = _count(u.get("output_tokens" if responses else "completion_tokens"))
    details = u.get("output_tokens_details" if responses else "completion_tokens_details")
    reasoning, bad_r = _count(details.get("reasoning_tokens")
                              if isinstance(details, dict) else None)
    return Usage(prompt, completion, reasoning, bad_p or bad_c or bad_r)


def finish_of(doc: Any) -> str | None:
    if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
        return None
    for ch in doc["choices"]:
        if isinstance(ch, dict) and isinstance(ch.get("finish_reason"), str):
            return str(ch["finish_reason"])[:40]
    return None


def _has_content(doc: Any) -> bool:
    """A stream chunk that carries generated text (content, reasoning or a tool call)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
        return False
    for ch in doc["choices"]:
        d = ch.get("delta") if isinstance(ch, dict) else None
        if isinstance(d, dict) and any(d.get(k) for k in ("content", "reasoning_content",
                                                           "reasoning", "tool_calls")):
            return True
        if isinstance(ch, dict) and isinstance(ch.get("text"), str) and ch["text"]:
            return True
    return False


_MODEL_NAME = re.compile(r"[\w.:/@+-]{1,200}")


def model_of(doc: Any) -> str | None:
    """The model a response says answered (its ``model``): the server's own word, not
    the harness's, so a check against it is not circular. Shape-checked."""
    name = doc.get("model") if isinstance(doc, dict) else None
    return name if isinstance(name, str) and _MODEL_NAME.fullmatch(name) else None


# Most of a stream is deltas: these find, in C, whether one carries text (a non-empty
# content / reasoning / text string, or a tool call) and whether it can carry a finish
# reason (a non-null one). A key inside a string value is escaped (\") and never matches.
_TEXT = re.compile(rb'"(?:content|reasoning_content|reasoning|text)"\s*:\s*"(?!")'
                   rb'|"tool_calls"\s*:\s*\[\s*\{')
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"')


@dataclass
class StreamScan:
    """Reads a server-sent event stream as it passes: the last usage it carried, the
    finish reason, and how many chunks carried text (the estimate when the endpoint
    sends no usage). Holds at most one partial line, cut at LINE_CAP."""
    usage: Usage | None = None
    finish: str | None = None
    model: str | None = None
    chunks: int = 0
    _partial: bytes = b""
    _skipping: bool = False  # inside an over-long line: drop to its end

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
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        if self.model is not None and b'"usage"' not in payload \
                and not _FINISH.search(payload):
            # A chunk that can carry neither usage nor a finish reason (the model is
            # known): only whether it carries text counts, read without parsing it.
            if _TEXT.search(payload):
                self.chunks += 1
            return
        doc = loads_bounded(payload, STREAM_DEPTH)
        if doc is None:
            return
        if _has_content(doc):
            self.chunks += 1
        self.usage = usage_of(doc) or self.usage
        self.finish = finish_of(doc) or self.finish
        self.model = model_of(doc) or self.model


@dataclass
class Meter:
    """One attempt's requests through the gateway, summed; ``in_flight`` and
    ``progress`` are what the watchdog reads (a request started, a chunk arrived, a
    response ended: each moves ``progress``)."""
    requests: int = 0
    answered: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
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
            self.prompt_tokens += usage.prompt or 0
            self.reasoning_tokens += usage.reasoning or 0

    def error(self, kind: str, why: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.last_error = why[:300]

    def summary(self) -> dict[str, Any]:
        return {"requests": self.requests, "answered": self.answered,
                "errors": dict(self.errors), "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "reasoning_tokens": self.reasoning_tokens, "estimated": self.estimated,
                "malformed_usage": self.malformed_usage, "failovers": self.failovers,
                "first_error": self.first_error or None, "last_error": self.last_error,
                "models": dict(self.models), "unmetered": self.unmetered,
                "unauthorized": self.unauthorized, "refused": self.refused}


def mode_line(preset: Preset) -> str:
    """What --dry-run says of the gateway."""
    g, ep = preset.gateway, preset.endpoint
    if not g.enabled:
        return "gateway: off (gateway = false): harnesses talk to the endpoint directly"
    if not ep.through_gateway:
        return f"gateway: not used for a {ep.engine!r} endpoint: harnesses reach it directly"
    arms = [a.label for a in preset.arms if a.request]
    key, name = "", ep.key_env()
    if name:
        key = f"; ${name} stays here, the harness gets its attempt's key"
    return ("gateway: a 127.0.0.1 listener per attempt; {port}/{host}/{base_url} name it, "
            "{endpoint_port}/{endpoint_base_url} the endpoint; request settings from "
            + (", ".join(arms) if arms else "no arm") + key)


__all__ = ["METERED_ROUTES", "MODEL_ROUTES", "ErrorKind", "Meter", "StreamScan", "Usage",
           "error_kind", "finish_of", "is_model_route", "is_provider_route", "loads_bounded",
           "merge", "mode_line", "model_of", "usage_of"]
