"""One request's record in its attempt's ``gateway.jsonl``: what the gateway saw of it,
typed as it is built (the stages set its fields; nothing is decided by a written key)
and written as one JSON line, a field only where it was seen: a record says what
happened, never a default. Reported usage keeps its nulls: ``"prompt_tokens": null`` is
an endpoint that reported usage without that count, which is not the same as none."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autopilot.gateway.dialects import Usage


@dataclass(slots=True)
class Failover:
    """The request went to another replica before its response began."""
    frm: str
    to: str
    why: str


@dataclass(slots=True)
class Record:
    ts: float
    method: str
    route: str
    dialect: str | None = None  # a model route's, by route alone
    stream: bool | None = None  # (None: not a model route, never read)
    model: str | None = None  # the model asked for; once answered, the one that answered
    sent_model: str | None = None  # as the provider spells it (rewritten)
    applied: dict[str, Any] | None = None  # the arm's settings merged into the body
    failover: list[Failover] = field(default_factory=list)
    held_429: int = 0  # 429s held and retried here, unseen by the harness
    replica: str | None = None  # the replica that took the connection: it was sent
    status: int | None = None  # the upstream's, or the gateway's own refusal
    retry_after: str | None = None
    refused: str | None = None
    ttfb_ms: float | None = None
    chunks: int | None = None  # a stream's events that carried text
    unparsed: str | None = None
    usage: Usage | None = None
    estimate: int = 0  # completion tokens counted from a stream's events (no usage)
    finish_reason: str | None = None
    error: str | None = None
    body: str | None = None  # an error's words, redacted and cut
    detail: str | None = None
    cut: str | None = None
    client_closed: bool = False
    unmetered: str | None = None  # why its spend could not be read: never 0 tokens
    ended_by: str | None = None
    latency_ms: float | None = None

    def reached_upstream(self) -> bool:
        """An upstream took it and did not refuse it (it may have spent on it)."""
        return self.replica is not None and (self.status is None or self.status < 400)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ts": self.ts, "method": self.method, "route": self.route}
        for name in ("dialect", "stream", "model", "sent_model", "applied"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.failover:
            out["failover"] = [{"from": f.frm, "to": f.to, "why": f.why}
                               for f in self.failover]
        if self.held_429:
            out["held_429"] = self.held_429
        for name in ("replica", "status", "retry_after", "refused", "ttfb_ms", "chunks",
                     "unparsed"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        usage = self.usage
        if usage is not None:
            out.update(prompt_tokens=usage.prompt, completion_tokens=usage.completion,
                       reasoning_tokens=usage.reasoning, tokens=usage.tokens.as_dict())
            if usage.malformed:
                out["malformed_usage"] = True
        elif self.estimate:
            out.update(completion_tokens=self.estimate, estimated=True)
        for name in ("finish_reason", "error", "body", "detail", "cut"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.client_closed:
            out["client_closed"] = True
        for name in ("unmetered", "ended_by", "latency_ms"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


__all__ = ["Failover", "Record"]
