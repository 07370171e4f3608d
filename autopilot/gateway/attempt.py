"""One attempt's listener as the gateway holds it: its address, key, meter and request
log, and who it admits (before a byte of a body is read: its key, in whichever header or
query parameter a dialect's clients send it, or a connection its own processes opened)."""

from __future__ import annotations

import contextlib
import hmac
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aiohttp import web

from autopilot.attemptspec import GatewayLimits
from autopilot.gateway.evidence import Meter, merge
from autopilot.gateway.policy import KEY_HEADERS, KEY_QUERY
from autopilot.gateway.record import Record


@dataclass
class Attempt:
    """One attempt's listener: its address, its key, its meter, its request log."""
    cell: str
    attempt: int
    settings: Mapping[str, Any]
    # Where to send a request, asked per request: (replica, origin) pairs, the cell's own
    # replica first (sticky: its prompt cache), then the live ones that may serve it.
    upstream: Callable[[], list[tuple[str, str]]]
    log_path: Path
    key: str = ""
    # (peer host, peer port) -> the connection is one a process of the attempt opened
    caller: Callable[[tuple[str, int]], bool] | None = None
    model: str | None = None  # the arm's model: the only one a provider key is used for
    # The gateway sets ``model`` on every keyed request (an arm's route names the model as
    # its provider spells it; an agent CLI asks for its own vendor's ids).
    rewrite: bool = False
    dialects: frozenset[str] = frozenset()  # what the upstream speaks (empty: any)
    # The arm's settings for one dialect only, over ``settings`` (arms.request_by_dialect)
    dialect_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    max_records: int = 5000
    port: int = 0
    meter: Meter = field(default_factory=Meter)
    records: int = 0
    dropped: int = 0
    closing: bool = False  # the attempt is ending: what is still open is cut by us
    _log: IO[bytes] | None = None
    _end: int | None = None  # the log's size after its last whole line
    unwritten: int = 0  # request lines a full disk kept out of the log (never the meter)
    _callers: set[tuple[tuple[str, int], int]] = field(default_factory=set)

    def write(self, record: Record) -> None:
        """One request's line, whole or not at all, and never a reason to fail the
        request: on a full disk the line is counted ``unwritten`` (the meter, which goes
        into exit.json, still holds its spend) and the file is cut back to its last
        whole line, so a torn line can never glue onto the next."""
        if self._log is None:
            return
        if self.records >= self.max_records:
            self.dropped += 1
            return
        self.records += 1
        fd = self._log.fileno()
        if self._end is None:
            self._end = os.fstat(fd).st_size
        line = memoryview((json.dumps(record.as_json(), separators=(",", ":")) + "\n").encode())
        size = len(line)
        try:
            while line:
                line = line[os.write(fd, line):]
        except OSError:
            self.unwritten += 1
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._end)
            return
        self._end += size

    def settings_for(self, dialect: str) -> Mapping[str, Any]:
        extra = self.dialect_settings.get(dialect)
        return merge(dict(self.settings), extra) if extra else self.settings

    def _holds_key(self, req: web.Request) -> bool:
        given = [v[7:] if v[:7].lower() == "bearer " else v
                 for name in KEY_HEADERS for v in req.headers.getall(name, ())]
        given += req.query.getall(KEY_QUERY, ())  # a Google client's ?key=
        for value in given:
            try:
                raw = value.strip().encode()
            except UnicodeEncodeError:  # bytes that are no text: not a key
                continue
            if hmac.compare_digest(raw, self.key.encode()):
                return True
        return False

    def admits(self, req: web.Request) -> bool:
        """The caller is this attempt's harness: it holds the key, or (for a harness
        that sends none) its connection is one the attempt's own processes opened. Only
        headers and the socket are looked at: the body is not read yet."""
        if self.key and self._holds_key(req):
            return True
        if self.caller is None:
            return False
        conn = _connection(req)
        if conn is None:
            return False
        if conn in self._callers:  # a kept-alive connection already checked
            return True
        if not self.caller(conn[0]):
            return False
        if len(self._callers) >= 1024:
            self._callers.clear()
        self._callers.add(conn)
        return True


def _connection(req: web.Request) -> tuple[tuple[str, int], int] | None:
    """A connection as the kernel knows it: the peer's address and the inode of our end
    of it. A source port is re-bound by anyone once its connection closes, and a Python
    object's id is reused once it is freed; the socket's inode is neither (a new
    connection is a new socket), so a connection checked once is that connection only."""
    transport = req.transport
    if transport is None:
        return None
    peer = transport.get_extra_info("peername")
    sock = transport.get_extra_info("socket")
    if not isinstance(peer, tuple) or len(peer) < 2 or sock is None:
        return None
    try:
        inode = os.fstat(sock.fileno()).st_ino
    except (OSError, ValueError):
        return None
    return (str(peer[0]), int(peer[1])), inode


__all__ = ["Attempt", "GatewayLimits"]
