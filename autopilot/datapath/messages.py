"""What the loop and an attempt's data path say to each other: each message a type.

The framing (one JSON object a line, bounded; one datagram to the fork server) is
``wire``'s; the meaning is here. Everything read from the other side is untrusted (a
data path of another version, a hostile process of the run's user that got the socket):
each ``of`` shape-checks a decoded document and returns the message, or None (or the
field's neutral value) for what does not fit. Stdlib only: the data path imports this
at start.

  loop -> data path   ``Hello`` (first line: the attempt's secret and our version),
                      then ``Poll`` (status now, or wait for the harness's end)
  data path -> loop   ``Refusal`` (another version: the loop drains it), ``Attempt``
                      (the answer to a hello; also its ready line on stdout and
                      ``datapath.json``), ``Status`` (the answer to a poll; also, with
                      ``exited``, ``exit.json``)
  fork server -> loop ``Forked`` (the data path's pid, or why not)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autopilot.datapath.wire import LEGACY_RECORD, RECORD, VERSION, read_private_json

WAIT_CAP_SECS = 60.0  # the longest a poll may hold the channel
FAILOVERS_CAP = 1000  # per status answer


def _count(v: Any) -> int | None:
    """A positive int (a pid, ticks, a port), or None."""
    return v if type(v) is int and v > 0 else None


def _text(v: Any, cap: int = 300) -> str | None:
    return v[:cap] if isinstance(v, str) else None


@dataclass(frozen=True)
class Hello:
    """The loop's first line on the channel: who it is (the attempt's secret)."""

    secret: str
    version: int = VERSION

    def to_wire(self) -> dict[str, Any]:
        return {"op": "hello", "secret": self.secret, "version": self.version}

    @classmethod
    def of(cls, doc: dict[str, Any] | None) -> Hello | None:
        if doc is None or doc.get("op") != "hello" or not isinstance(doc.get("secret"), str):
            return None
        version = doc.get("version")
        return cls(doc["secret"], version if type(version) is int else -1)


@dataclass(frozen=True)
class Poll:
    """The loop's question: the attempt's status now (``wait`` None), or once the
    harness ends, within ``wait`` seconds; ``upstream``, when given, replaces the
    replicas the attempt's gateway forwards to."""

    wait: float | None = None
    upstream: tuple[tuple[str, str], ...] | None = None

    def to_wire(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"op": "status" if self.wait is None else "wait"}
        if self.wait is not None:
            msg["timeout"] = self.wait
        if self.upstream is not None:
            msg["upstream"] = [list(u) for u in self.upstream]
        return msg

    @classmethod
    def of(cls, doc: dict[str, Any] | None) -> Poll | None:
        if doc is None:
            return None
        wait = None
        if doc.get("op") == "wait":
            timeout = doc.get("timeout")
            wait = 0.0
            if isinstance(timeout, int | float) and not isinstance(timeout, bool) \
                    and not math.isnan(timeout):
                wait = min(max(float(timeout), 0.0), WAIT_CAP_SECS)
        upstream_doc = doc.get("upstream")
        upstream = None
        if isinstance(upstream_doc, list) and all(isinstance(pair, list) and len(pair) == 2
                                                  for pair in upstream_doc):
            upstream = tuple((str(replica), str(origin)) for replica, origin in upstream_doc)
        return cls(wait, upstream)


@dataclass(frozen=True)
class Refusal:
    """A data path of another version: the loop drains it (by its files)."""

    version: int

    def to_wire(self) -> dict[str, Any]:
        return {"ok": False, "version": self.version}

    @classmethod
    def of(cls, doc: dict[str, Any] | None) -> Refusal | None:
        if doc is None or doc.get("ok") is True:
            return None
        v = doc.get("version")
        return cls(v if type(v) is int else -1)


@dataclass(frozen=True)
class Attempt:
    """What a data path says of its attempt: itself, its harness, its gateway's port."""

    pid: int | None
    harness_pid: int | None
    harness_ticks: int | None
    port: int | None
    meta: dict[str, Any] = field(default_factory=dict)
    ticks: int | None = None  # the data path's own start ticks (datapath.json)
    spawn_error: str | None = None  # the harness could not be spawned (the ready line)
    started: float | None = None

    def hello(self) -> dict[str, Any]:
        """The answer to a hello."""
        return {"ok": True, "version": VERSION, "pid": self.pid,
                "harness_pid": self.harness_pid, "harness_ticks": self.harness_ticks,
                "port": self.port, "meta": self.meta}

    def ready(self) -> dict[str, Any]:
        """The ready line on stdout, once the harness is spawned."""
        return {"ready": True, **self.hello(), "spawn_error": self.spawn_error}

    def record(self) -> dict[str, Any]:
        """``datapath.json``: what a successor re-attaches by."""
        return {"version": VERSION, "pid": self.pid, "ticks": self.ticks,
                "harness_pid": self.harness_pid, "harness_ticks": self.harness_ticks,
                "port": self.port, "started": self.started, "meta": self.meta}

    @classmethod
    def of(cls, doc: dict[str, Any] | None) -> Attempt | None:
        if doc is None:
            return None
        meta = doc.get("meta")
        started = doc.get("started")
        return cls(_count(doc.get("pid")), _count(doc.get("harness_pid")),
                   _count(doc.get("harness_ticks")), _count(doc.get("port")),
                   meta if isinstance(meta, dict) else {}, _count(doc.get("ticks")),
                   _text(doc.get("spawn_error")),
                   float(started) if isinstance(started, int | float)
                   and not isinstance(started, bool) else None)

    @staticmethod
    def is_ready(doc: dict[str, Any] | None) -> bool:
        return doc is not None and doc.get("ready") is True


@dataclass(frozen=True)
class Status:
    """Where the attempt stands: the harness's end once ``exited``, the gateway's meter
    (as written: ``client.meter_from`` checks it), 429s seen, failovers not yet told."""

    exited: bool = False
    code: int | None = None
    ended: float | None = None
    spawn_error: str | None = None
    throttled: int | None = None
    meter: dict[str, Any] | None = None
    failovers: tuple[dict[str, Any], ...] = ()

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": True, "exited": self.exited, "code": self.code,
                               "ended": self.ended, "spawn_error": self.spawn_error,
                               "throttled": self.throttled}
        if self.meter is not None:
            out["meter"] = self.meter
            out["failovers"] = list(self.failovers)
        return out

    @classmethod
    def of(cls, doc: dict[str, Any] | None, *, exited: bool | None = None) -> Status | None:
        """A status answer, or (``exited=True``) ``exit.json``."""
        if doc is None:
            return None
        done = doc.get("exited") is True if exited is None else exited
        code, ended, throttled = doc.get("code"), doc.get("ended"), doc.get("throttled")
        failover_docs = doc.get("failovers")
        meter = doc.get("meter")
        return cls(
            exited=done, code=code if type(code) is int else None,
            ended=float(ended) if isinstance(ended, int | float)
            and not isinstance(ended, bool) else None,
            spawn_error=_text(doc.get("spawn_error")),
            throttled=throttled if type(throttled) is int and throttled >= 0 else None,
            meter=meter if isinstance(meter, dict) else None,
            failovers=tuple(failover for failover in failover_docs[:FAILOVERS_CAP]
                            if isinstance(failover, dict))
            if isinstance(failover_docs, list) else ())


@dataclass(frozen=True)
class Forked:
    """The fork server's answer to a spec: the data path's pid, or why there is none."""

    pid: int | None
    why: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {"ok": True, "pid": self.pid} if self.pid else {"ok": False, "why": self.why}

    @classmethod
    def of(cls, doc: Any) -> Forked | None:
        if not isinstance(doc, dict):
            return None
        if doc.get("ok") is True and _count(doc.get("pid")) is not None:
            return cls(doc["pid"])
        return cls(None, _text(doc.get("why")) or "refused")


def read_record(directory: Path) -> Attempt | None:
    """The data path's record in its attempt dir (``datapath.json``, or the name a data
    path of an earlier version wrote it under)."""
    return Attempt.of(read_private_json(directory / RECORD)
                      or read_private_json(directory / LEGACY_RECORD))
