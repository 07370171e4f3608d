"""What the loop asks of an attempt's data path: the harness to spawn, what to echo
back, and the gateway listener to serve. One type from the cell that builds it
(autopilot.cell.runner) through the fork server to the data path that runs it
(autopilot.datapath.process), so no layer reads it as a bag of keys.

It lives below the cell, the gateway and the data path alike because each of them
builds or reads a part of it. Stdlib only: a data path imports it at start. It travels
as one JSON document (``datapath.wire`` frames it and adds the version) on the data
path's stdin or in one datagram to the fork server: the keys in it never touch a file.
Whatever reads it back (``of``) shape-checks it, since a data path of another version,
or a hostile process of the run's user that got the socket, may have written it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any


def _strs(v: Any) -> tuple[str, ...] | None:
    return tuple(v) if isinstance(v, list) and all(isinstance(x, str) for x in v) else None


def _str_map(v: Any) -> dict[str, str] | None:
    ok = isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str)
                                     for k, x in v.items())
    return dict(v) if ok else None


def _opt_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


@dataclass(frozen=True)
class HarnessSpec:
    """The harness: its argv (its cgroup placement and uid switch already in it), its
    working dir, its whole environment, and the spool its output is appended to."""

    argv: tuple[str, ...]
    env: dict[str, str]
    spool: str
    cwd: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "cwd": self.cwd, "env": self.env,
                "spool": self.spool}

    @classmethod
    def of(cls, doc: Any) -> HarnessSpec | None:
        if not isinstance(doc, dict):
            return None
        argv, env, spool = _strs(doc.get("argv")), _str_map(doc.get("env")), doc.get("spool")
        if not argv or env is None or not isinstance(spool, str):
            return None
        return cls(argv, env, spool, _opt_str(doc.get("cwd")) or None)


@dataclass(frozen=True)
class GatewayLimits:
    """What a gateway holds a request and a response to (autopilot.gateway)."""

    max_request: int = 64 << 20  # a request body larger than this is refused (413)
    parse_cap: int = 8 << 20  # bytes of a JSON response held to read its usage
    max_records: int = 5000  # request lines per attempt's gateway.jsonl
    hold_429: float = 0.0  # seconds a throttled request may be held and retried here
    body_secs: float = 300.0  # a request body not received within this: 408
    upstream_read_secs: float = 1800.0  # the upstream silent this long: the request is cut
    max_depth: int = 64  # JSON nesting read (a request's body, a response's)

    @classmethod
    def of(cls, doc: Any) -> GatewayLimits | None:
        """The limits as the wire carries them: every field, each of its own type (an
        int field an int, never a bool); None for anything else (another version's)."""
        kinds = {f.name: type(f.default) for f in fields(cls)}  # int or float
        if not isinstance(doc, dict) or set(doc) != set(kinds):
            return None
        for name, value in doc.items():
            if type(value) is not int and not (kinds[name] is float and type(value) is float):
                return None
        return cls(**doc)


@dataclass(frozen=True)
class GatewaySpec:
    """The attempt's gateway listener (autopilot.gateway.settings.datapath_spec).
    ``key``: the attempt's own key, the only one the listener admits; ``upstream_key``:
    the key it forwards with (a hosted endpoint's, or an arm's route's); ``fd``: the
    listening socket, handed over with the spec (set where it is handed over)."""

    upstream: tuple[tuple[str, str], ...]
    log_path: str
    limits: GatewayLimits
    settings: dict[str, Any] = field(default_factory=dict)  # the arm's request overrides
    dialect_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    key: str = ""
    model: str | None = None
    upstream_key: str | None = None
    rewrite: bool = False
    dialects: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()
    fd: int | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"upstream": [list(u) for u in self.upstream], "log_path": self.log_path,
                "limits": asdict(self.limits), "settings": self.settings,
                "dialect_settings": self.dialect_settings, "key": self.key,
                "model": self.model, "upstream_key": self.upstream_key,
                "rewrite": self.rewrite, "dialects": list(self.dialects),
                "secrets": list(self.secrets), "fd": self.fd}

    @classmethod
    def of(cls, doc: Any) -> GatewaySpec | None:
        if not isinstance(doc, dict):
            return None
        upstream_doc, limits = doc.get("upstream"), doc.get("limits")
        if not (isinstance(upstream_doc, list) and all(
                isinstance(pair, list) and len(pair) == 2
                and all(isinstance(part, str) for part in pair)
                for pair in upstream_doc)):
            return None
        lim = GatewayLimits.of(limits)
        if lim is None:
            return None
        log_path, settings = doc.get("log_path"), doc.get("settings")
        by_dialect = doc.get("dialect_settings")
        if not isinstance(log_path, str) or not isinstance(settings, dict) \
                or not isinstance(by_dialect, dict) \
                or not all(isinstance(v, dict) for v in by_dialect.values()):
            return None
        dialects, secrets = _strs(doc.get("dialects")), _strs(doc.get("secrets"))
        fd = doc.get("fd")
        return cls(tuple((pair[0], pair[1]) for pair in upstream_doc), log_path, lim,
                   dict(settings), {str(k): dict(v) for k, v in by_dialect.items()},
                   key=_opt_str(doc.get("key")) or "", model=_opt_str(doc.get("model")),
                   upstream_key=_opt_str(doc.get("upstream_key")),
                   rewrite=doc.get("rewrite") is True, dialects=dialects or (),
                   secrets=secrets or (), fd=fd if type(fd) is int and fd >= 0 else None)


@dataclass(frozen=True)
class AttemptSpec:
    """One attempt, as its data path is to run it. ``meta`` is echoed back in its ready
    line and record (the attempt's marker, group, uid, replica, deadline: what a
    successor re-attaches by); ``dir`` and ``secret`` are the data path's own, set where
    it is launched (autopilot.datapath.client.DataPath.launch)."""

    cell: str
    attempt: int
    harness: HarnessSpec
    meta: dict[str, Any] = field(default_factory=dict)
    gateway: GatewaySpec | None = None
    dir: str = ""
    secret: str = ""

    def with_listener(self, fd: int) -> AttemptSpec:
        """The spec with its gateway's listening socket: ``fd`` as the receiver has it."""
        return self if self.gateway is None else replace(
            self, gateway=replace(self.gateway, fd=fd))

    def to_wire(self) -> dict[str, Any]:
        return {"cell": self.cell, "attempt": self.attempt, "dir": self.dir,
                "secret": self.secret, "harness": self.harness.to_wire(),
                "meta": self.meta,
                "gateway": self.gateway.to_wire() if self.gateway is not None else None}

    @classmethod
    def of(cls, doc: Any) -> AttemptSpec | None:
        if not isinstance(doc, dict):
            return None
        cell, attempt, directory, secret = (doc.get("cell"), doc.get("attempt"), doc.get("dir"),
                                            doc.get("secret"))
        harness, meta = HarnessSpec.of(doc.get("harness")), doc.get("meta")
        gateway_doc = doc.get("gateway")
        gateway = GatewaySpec.of(gateway_doc) if gateway_doc is not None else None
        if not (isinstance(cell, str) and type(attempt) is int
                and isinstance(directory, str) and directory
                and isinstance(secret, str) and secret and harness is not None
                and isinstance(meta, dict) and (gateway_doc is None or gateway is not None)):
            return None
        return cls(cell, attempt, harness, dict(meta), gateway, directory, secret)


__all__ = ["AttemptSpec", "GatewaySpec", "HarnessSpec"]
