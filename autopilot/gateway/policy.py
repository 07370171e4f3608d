"""What a request to the gateway may be and carry (pure): whose key admits it, which
headers go upstream, which routes a provider's key reaches, how long a 429 may be held,
how a request body is read. The proxy (autopilot.gateway.proxy) applies these."""

from __future__ import annotations

import email.utils
import math
import secrets
import time
import zlib
from typing import Any

from autopilot.gateway.dialects import Route

# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the gateway re-makes; a header a
# ``Connection:`` line names is hop-by-hop too. ``Expect`` is answered here (100
# Continue, by the server), once: the body is sent upstream whole, with no expectation.
HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                 "expect",
                  "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length",
                  "accept-encoding"})
# Where a harness may put its key: OpenAI's SDKs (Authorization: Bearer), Anthropic's
# (x-api-key), Azure's (api-key), Google's (x-goog-api-key; or the ``key`` query
# parameter, KEY_QUERY). Never forwarded upstream.
KEY_HEADERS = ("authorization", "x-api-key", "api-key", "x-goog-api-key")
KEY_QUERY = "key"
ERROR_BODY = 2000  # characters of an error body kept in the record (redacted)
ERROR_READ = 64 << 10  # bytes of an error response read before the harness is answered

# What a harness holds as its API key: one per attempt, shaped like a key (some SDKs
# refuse a value that is not), and recognisable, so every log redacts it by its shape
# (autopilot.logsetup).
KEY_PREFIX = "sk-autopilot-"
# The variable the OpenAI clients read their key from: the harness gets its attempt's
# key there (and under a provider's ``api_key_env``, and as ``{api_key}``).
KEY_ENV = "OPENAI_API_KEY"


def attempt_key() -> str:
    """A fresh attempt key: 128 random bits, derived from nothing any process sees."""
    return KEY_PREFIX + secrets.token_hex(16)


MAX_HOLD = 60.0  # seconds one Retry-After may ask for and still be held here


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a 429 asks to wait: delta-seconds (a finite, non-negative number) or an
    HTTP date, within MAX_HOLD; None for anything else (NaN, infinity, a negative, a
    date an hour off, garbage, no header): such a 429 is not held, the harness sees it."""
    if not value:
        return None
    v = value.strip()[:64]
    try:
        secs = float(v)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(v)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            return None
        secs = max(when.timestamp() - (time.time() if now is None else now), 0.0)
    if not math.isfinite(secs) or secs < 0 or secs > MAX_HOLD:
        return None
    return secs


def named_in_connection(headers: Any) -> frozenset[str]:
    """Header names a ``Connection:`` line lists: hop-by-hop, never forwarded."""
    names: set[str] = set()
    for line in headers.getall("Connection", ()):
        names.update(t.strip().lower() for t in line.split(",") if t.strip())
    return frozenset(names)


def forwardable(headers: Any) -> dict[str, str]:
    """A request's headers as they go upstream: no hop-by-hop one, no key of ours."""
    drop = HOP | named_in_connection(headers) | frozenset(KEY_HEADERS)
    return {k: v for k, v in headers.items() if k.lower() not in drop}


def provider_refusal(method: str, path: str, route: Route | None, doc: Any,
                     model: str | None, dialects: frozenset[str] = frozenset(),
                     rewrite: bool = False) -> str | None:
    """Why a request may not go upstream with a provider's key, or None: only a model
    route (or a free one its clients need, such as counting tokens) of the dialects the
    upstream speaks (``dialects``; empty: any), only for the arm's model. ``rewrite``:
    the gateway sets the model itself (an arm's route names it as its provider spells
    it), so the request's own word on it does not matter."""
    if route is None or not route.keyed:
        return (f"{method} {path[:80]} is not a route this run's key is used for "
                "(POST to a model route: chat/completions, completions, embeddings, "
                "responses, messages, generateContent)")
    if dialects and route.dialect.name not in dialects:
        return (f"{method} {path[:80]} is a {route.dialect.name} route; this upstream "
                f"speaks {', '.join(sorted(dialects))}")
    if not isinstance(doc, dict):
        return "a request body the gateway cannot read: its model is not known"
    asked = route.dialect.asked(doc, route)
    if model and not rewrite and asked != model:
        return f"model {str(asked)[:80]!r} is not the arm's model {model!r}"
    return None


def without_key(query: str) -> str:
    """A query string without the key a Google client may put in it (``key=``)."""
    from urllib.parse import parse_qsl, urlencode

    if KEY_QUERY + "=" not in query:
        return query
    kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != KEY_QUERY]
    return urlencode(kept)


def inflate(body: bytes, encoding: str, cap: int) -> bytes | None:
    """A request body as JSON bytes for reading (gzip or deflate inflated within
    ``cap``: a bomb is not inflated past it); None when it cannot be read."""
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate", "x-gzip"):
        return None
    decompressor = zlib.decompressobj(wbits=47)  # gzip or zlib, told by its header
    try:
        out = decompressor.decompress(body, cap + 1)
    except zlib.error:
        return None
    return None if len(out) > cap or decompressor.unconsumed_tail else out



__all__ = ["ERROR_BODY", "ERROR_READ", "HOP", "KEY_ENV", "KEY_HEADERS", "KEY_PREFIX",
           "KEY_QUERY", "MAX_HOLD", "attempt_key", "forwardable", "inflate",
           "named_in_connection", "provider_refusal", "retry_after", "without_key"]
