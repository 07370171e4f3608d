"""What every dialect answers, and the pieces they share (pure).

A dialect is one vendor's wire protocol for using a model: OpenAI's chat/completions,
OpenAI's Responses, Anthropic's Messages, Google's generateContent. The gateway tells
them apart by route alone (a request's method and path), never by what the harness says
it is, and asks the request's dialect everything the bytes mean: whether a route uses a
model (and so carries the arm's settings, is metered, may carry the upstream's key), in
which header the vendor takes its key, who was asked and who answered, what the usage
says by bucket, what one stream event carries, and which refusals are the vendor asking
us to slow down.

Adding a dialect is one module beside this one and one line in the table of
``autopilot.gateway.dialects``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from autopilot.state.tokens import Tokens, count_of

_MODEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                         "_.:/@+-")


@dataclass(frozen=True)
class Usage:
    """What one response says it used, by bucket; ``malformed``: a count of the wrong
    shape was there (a negative, a string, a 401-digit integer): it is not counted, and
    the response is unmetered."""

    tokens: Tokens = field(default_factory=Tokens)
    malformed: bool = False

    @property
    def prompt(self) -> int | None:
        return self.tokens.prompt

    @property
    def completion(self) -> int | None:
        return self.tokens.output

    @property
    def reasoning(self) -> int | None:
        return self.tokens.reasoning

    def over(self, older: Usage | None) -> Usage:
        """This usage on top of an earlier event's of the same response."""
        if older is None:
            return self
        return Usage(self.tokens.over(older.tokens), self.malformed or older.malformed)


class Counts:
    """Reads counts out of an untrusted usage object, remembering any of bad shape."""

    def __init__(self, doc: Any) -> None:
        self.doc = doc if isinstance(doc, dict) else {}
        self.malformed = False

    def get(self, *path: str) -> int | None:
        v: Any = self.doc
        for key in path:
            if not isinstance(v, dict):
                return None
            v = v.get(key)
        if v is None:
            return None
        count = count_of(v)
        if count is None:
            self.malformed = True
        return count

    def usage(self, tokens: Tokens) -> Usage:
        return Usage(tokens, self.malformed)


def minus(total: int | None, part: int | None) -> int | None:
    """``total`` less the part of it counted in another bucket (never below 0)."""
    if total is None:
        return None
    return max(total - (part or 0), 0)


def model_name(value: Any) -> str | None:
    """A model name as an endpoint or a request writes it, shape-checked."""
    if isinstance(value, str) and 0 < len(value) <= 200 and _MODEL_CHARS.issuperset(value):
        return value
    return None


@dataclass(frozen=True)
class Route:
    """What a request's route is to its dialect."""

    dialect: Dialect
    generates: bool = False
    """It asks the model to generate: the arm's settings go into its body."""
    metered: bool = False
    """It uses (and pays for) the model: its response's usage is read, and a response
    whose usage cannot be read is unmetered, never 0 tokens."""
    keyed: bool = False
    """The upstream's key may be attached (a model route, or a free one a client needs,
    such as counting tokens)."""
    model: str | None = None
    """The model the route names in its path (Google's ``models/{model}:...``)."""


@dataclass
class StreamState:
    """What a stream said so far (autopilot.gateway.evidence.StreamScan holds one)."""

    usage: Usage | None = None
    finish: str | None = None
    model: str | None = None
    chunks: int = 0  # events that carried generated text (the estimate without usage)
    error: str | None = None  # an error the stream itself carried, in its words
    # The dialect's last event arrived (its usage with it): a client that hangs up after
    # it (Codex does, at response.completed) hung up on a finished response.
    done: bool = False


class Dialect:
    """One vendor's protocol. Subclasses answer for their routes only."""

    name: ClassVar[str]
    # Where this vendor's own clients and servers put the key.
    key_header: ClassVar[str] = "Authorization"
    key_scheme: ClassVar[str] = "Bearer "
    # The path, under the route's base URL, that lists the models a key may use.
    models_path: ClassVar[str] = "/models"

    def route(self, method: str, path: str) -> Route | None:
        raise NotImplementedError

    def auth(self, key: str) -> dict[str, str]:
        """The headers that carry ``key`` upstream, as this vendor takes it."""
        return {self.key_header: self.key_scheme + key}

    def probe_headers(self, key: str) -> dict[str, str]:
        """Headers for the preflight's models-list probe."""
        return self.auth(key)

    def model_ids(self, doc: Any) -> list[str]:
        """The ids a models-list answer names (OpenAI's shape: ``data[].id``)."""
        data = doc.get("data") if isinstance(doc, dict) else None
        return [m["id"] for m in data or () if isinstance(m, dict) and isinstance(m.get("id"), str)]

    # ---------------------------------------------------------------- requests

    def asked(self, doc: Any, route: Route) -> str | None:
        """The model a request asks for."""
        return model_name(doc.get("model")) if isinstance(doc, dict) else None

    def with_model(self, doc: Any, path: str, route: Route, model: str) -> tuple[Any, str]:
        """The request asking for ``model`` instead (the route's spelling of it)."""
        if isinstance(doc, dict):
            doc = {**doc, "model": model}
        return doc, path

    def streams(self, doc: Any, route: Route, path: str) -> bool:
        return isinstance(doc, dict) and doc.get("stream") is True

    # ---------------------------------------------------------------- responses

    def usage(self, doc: Any) -> Usage | None:
        raise NotImplementedError

    def finish(self, doc: Any) -> str | None:
        return None

    def model(self, doc: Any) -> str | None:
        """The model a response says answered: the server's own word."""
        return model_name(doc.get("model")) if isinstance(doc, dict) else None

    def event(self, state: StreamState, name: str | None, payload: bytes) -> None:
        """One event of a response stream (``name``: its ``event:`` line, if any)."""
        raise NotImplementedError

    def refusal(self, status: int, doc: Any) -> str | None:
        """An error kind the vendor's own words decide (e.g. ``overloaded_error``), or
        None to decide by status alone."""
        return None


__all__ = ["Counts", "Dialect", "Route", "StreamState", "Usage", "minus", "model_name"]
