"""The model gateway: every request a cell's harness makes to the model passes here.

One listener per attempt, on 127.0.0.1 and a port of its own, so the gateway knows
which cell sent each request without trusting anything the harness says. Each request
is forwarded to the replica the cell runs against (asked at request time: a restarted
endpoint may have a new port), with the arm's ``request`` settings deep-merged into
generation requests (autopilot.gateway.evidence). Responses pass through chunk by chunk
(server-sent events included), while the gateway reads what they say: usage, finish
reason, errors. One JSON line per request goes to the attempt's ``gateway.jsonl``
(bounded), and the attempt's totals (``Meter``) go into the journal with its verdict.

Built on aiohttp (server and client), already in the tree for the dashboard. The
client never decompresses (``Accept-Encoding`` is dropped upstream, so bodies arrive
as the endpoint wrote them) and holds at most ``parse_cap`` bytes of a body to read its
usage; the rest streams through. A body that never ends is the harness's to wait on
and the watchdog's to judge; closing the attempt cancels whatever is still in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from aiohttp import (
    ClientConnectionError,
    ClientError,
    ClientSession,
    ClientTimeout,
    TCPConnector,
    web,
)

from autopilot.gateway.evidence import (
    Meter,
    StreamScan,
    error_kind,
    finish_of,
    is_model_route,
    merge,
    model_of,
    usage_of,
)
from autopilot.state.statedir import open_append

if TYPE_CHECKING:  # the attempt's data path runs this module: it must not load config
    from autopilot.config import Preset

# Hop-by-hop headers (RFC 9110 7.6.1) and the ones the gateway re-makes.
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                  "te", "trailer", "transfer-encoding", "upgrade", "host", "content-length",
                  "accept-encoding"})
ERROR_BODY = 2000  # characters of an error body kept in the record (redacted)


@dataclass(frozen=True)
class Limits:
    max_request: int = 64 << 20  # a request body larger than this is refused (413)
    parse_cap: int = 8 << 20  # bytes of a JSON response held to read its usage
    max_records: int = 5000  # request lines per attempt's gateway.jsonl
    hold_429: float = 0.0  # seconds a throttled request may be held and retried here


@dataclass
class Attempt:
    """One attempt's listener: its address, its meter, its request log."""
    cell: str
    attempt: int
    settings: Mapping[str, Any]
    # Where to send a request, asked per request: (replica, origin) pairs, the cell's own
    # replica first (sticky: its prompt cache), then the live ones that may serve it.
    upstream: Callable[[], list[tuple[str, str]]]
    log_path: Path
    max_records: int = 5000
    port: int = 0
    meter: Meter = field(default_factory=Meter)
    records: int = 0
    dropped: int = 0
    _log: IO[bytes] | None = None

    def write(self, record: dict[str, Any]) -> None:
        if self._log is None:
            return
        if self.records >= self.max_records:
            self.dropped += 1
            return
        self.records += 1
        self._log.write((json.dumps(record, separators=(",", ":")) + "\n").encode())
        self._log.flush()


# What a harness holds instead of a hosted provider's key (the gateway adds the real
# one upstream); shaped like a key, since some SDKs refuse a value that is not.
PLACEHOLDER_PREFIX = "sk-autopilot-gateway-"


def placeholder_key(run_token: str) -> str:
    """The run's placeholder: only its harnesses have it (like the run marker), and the
    gateway adds the provider's key only to a request that carries it — another local
    process cannot spend the key through a gateway port it found."""
    return PLACEHOLDER_PREFIX + hashlib.sha256(f"gateway:{run_token}".encode()).hexdigest()[:32]


class Gateway:
    """The run's gateway (one per backend context; its attempts share one client)."""

    def __init__(self, redact: Callable[[str], str] = lambda s: s,
                 limits: Limits = Limits(),
                 on_throttled: Callable[[], None] = lambda: None,
                 on_failover: Callable[[str, int, str, str, str], Any] | None = None) -> None:
        self.redact = redact
        self.limits = limits
        # a 429 from upstream: the loop launches fewer cells at once (run.throttle)
        self.on_throttled = on_throttled
        # a request sent to another replica than the cell's own: (cell, attempt, from, to,
        # why), journaled by the loop as request_failover
        self.on_failover = on_failover
        # the upstream's own credentials (a provider's Authorization), put on every
        # request in place of whatever the harness sent
        self.auth: Callable[[], dict[str, str]] | None = None
        self.expect_key = ""  # with ``auth``: the bearer a request must carry
        self.secrets: tuple[str, ...] = ()  # what a data path's records redact
        self._session: ClientSession | None = None

    def datapath_spec(self, settings: Mapping[str, Any], upstream: list[tuple[str, str]],
                      log_path: Path) -> dict[str, Any]:
        """What an attempt's data path needs to run its listener with this gateway's
        settings (autopilot.datapath.shim). It travels on the data path's stdin only:
        the provider's headers are never written to a file."""
        return {"settings": dict(settings), "upstream": [list(u) for u in upstream],
                "log_path": str(log_path), "limits": asdict(self.limits),
                "auth": self.auth() if self.auth is not None else None,
                "expect_key": self.expect_key, "secrets": list(self.secrets)}

    def _client(self) -> ClientSession:
        if self._session is None or self._session.closed:
            # No total timeout: a long generation is the watchdog's to judge, not ours.
            self._session = ClientSession(
                timeout=ClientTimeout(total=None, sock_connect=10),
                connector=TCPConnector(limit=0, force_close=False),
                auto_decompress=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @contextlib.asynccontextmanager
    async def attempt(self, cell: str, attempt: int, settings: Mapping[str, Any],
                      upstream: Callable[[], list[tuple[str, str]]],
                      log_path: Path, sock: socket.socket | None = None
                      ) -> AsyncIterator[Attempt]:
        """Listen for one attempt's requests until the block ends (on ``sock``, a
        listening socket the loop bound and handed over, else on a fresh port)."""
        att = Attempt(cell, attempt, settings, upstream, log_path,
                      max_records=self.limits.max_records)

        async def handle(req: web.Request) -> web.StreamResponse:
            return await self._handle(att, req)

        app = web.Application(client_max_size=self.limits.max_request)
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, handle_signals=False, access_log=None,
                               shutdown_timeout=0.5)
        await runner.setup()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            site: web.BaseSite = (web.SockSite(runner, sock) if sock is not None
                                  else web.TCPSite(runner, "127.0.0.1", 0))
            await site.start()
            att.port = int(runner.addresses[0][1])
            with open_append(log_path) as f:
                att._log = f
                try:
                    yield att
                finally:
                    att._log = None
                    if att.dropped:
                        with contextlib.suppress(OSError):
                            f.write((json.dumps({"dropped": att.dropped}) + "\n").encode())
        finally:
            await runner.cleanup()

    async def _handle(self, att: Attempt, req: web.Request) -> web.StreamResponse:
        m = att.meter
        m.requests += 1
        first = m.requests == 1
        m.in_flight += 1
        m.progress += 1
        t0 = time.perf_counter()
        rec: dict[str, Any] = {"ts": round(time.time(), 3), "method": req.method,
                               "route": req.path[:200]}
        try:
            return await self._forward(att, req, rec, t0)
        except asyncio.CancelledError:
            # The attempt ended (its harness gone, its data path closing) with this
            # request still open: written as cut, never lost.
            rec["cut"] = "attempt ended"
            raise
        finally:
            m.in_flight -= 1
            m.progress += 1
            if first:
                m.first_error = str(rec.get("error") or "")
            rec["latency_ms"] = round((time.perf_counter() - t0) * 1000, 2)
            with contextlib.suppress(OSError):
                att.write(rec)

    async def _forward(self, att: Attempt, req: web.Request, rec: dict[str, Any],
                       t0: float) -> web.StreamResponse:
        m = att.meter
        try:
            body = await req.read()
        except web.HTTPRequestEntityTooLarge:
            m.error("request_error", "request body over the gateway's limit")
            rec.update(status=413, error="request_error")
            return web.json_response({"error": {"message": "request body too large for "
                                                "the autopilot gateway"}}, status=413)
        stream = False
        if is_model_route(req.method, req.path):
            try:
                doc = json.loads(body) if body else None
            except ValueError:
                doc = None
            if isinstance(doc, dict):
                if att.settings:
                    doc = merge(doc, att.settings)
                    body = json.dumps(doc).encode()
                    rec["applied"] = att.settings
                stream = doc.get("stream") is True
                rec["stream"] = stream
                if isinstance(doc.get("model"), str):
                    rec["model"] = doc["model"][:120]
        headers = {k: v for k, v in req.headers.items() if k.lower() not in _HOP}
        if self.auth is not None:
            if req.headers.get("Authorization", "") != f"Bearer {self.expect_key}":
                m.error("request_error", "a request without this run's placeholder key")
                rec.update(status=401, error="request_error")
                return web.json_response({"error": {"message": "the autopilot gateway "
                                                    "needs this run's placeholder key"}},
                                         status=401)
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            headers.update(self.auth())
        resp: web.StreamResponse | None = None
        held_until = time.monotonic() + self.limits.hold_429
        try:
            while True:
                up = await self._send(att, req, body, headers, rec)
                if up.status != 429:
                    break
                # Throttled: the loop launches fewer cells at once; within the preset's
                # bound the request is held and retried here, unseen by the harness.
                self.on_throttled()
                wait = _retry_after(up.headers.get("Retry-After"))
                if time.monotonic() + wait > held_until:
                    break
                m.error("throttled", "HTTP 429 (held and retried by the gateway)")
                rec["held_429"] = rec.get("held_429", 0) + 1
                up.release()
                await asyncio.sleep(wait)
            async with up:
                rec["status"] = up.status
                if up.status == 429 and up.headers.get("Retry-After"):
                    rec["retry_after"] = up.headers["Retry-After"][:40]
                resp = web.StreamResponse(status=up.status, reason=up.reason)
                for k, v in up.headers.items():
                    if k.lower() not in _HOP:
                        resp.headers.add(k, v)
                if up.content_length is not None:
                    resp.content_length = up.content_length
                await resp.prepare(req)
                scan = StreamScan() if stream and up.status < 400 else None
                held: list[bytes] = []
                held_n = 0
                first = True
                async for chunk in up.content.iter_any():
                    if first:
                        rec["ttfb_ms"] = round((time.perf_counter() - t0) * 1000, 2)
                        first = False
                    m.bytes_in += len(chunk)
                    m.progress += 1
                    if scan is not None:
                        scan.feed(chunk)
                    elif held_n <= self.limits.parse_cap:
                        held.append(chunk)
                        held_n += len(chunk)
                    try:
                        await resp.write(chunk)
                    except (ConnectionError, RuntimeError):
                        gone = True
                        break
                else:
                    gone = False
                    await resp.write_eof()
                m.answered += 1
                if gone:
                    # The harness stopped reading (an HTTP client that raises on a 4xx
                    # may close before the body): what the endpoint said still counts.
                    rec["client_gone"] = True
                    if up.status < 400:
                        m.error("client_gone", "the harness closed its connection "
                                "mid-response")
                        rec["error"] = "client_gone"
                        return resp
                self._account(att, rec, up.status, scan, held, held_n)
                return resp
        except (ClientError, TimeoutError, OSError) as e:
            why = f"{type(e).__name__}: {e}"[:300]
            m.error("endpoint_error", why)
            rec.update(error="endpoint_error", detail=self.redact(why))
            if resp is not None and resp.prepared:
                return resp  # cut mid-body: the harness sees the stream end
            return web.json_response({"error": {"message": "the model endpoint did not "
                                                "answer (autopilot gateway): " + why}},
                                     status=502)

    async def _send(self, att: Attempt, req: web.Request, body: bytes,
                    headers: dict[str, str], rec: dict[str, Any]) -> Any:
        """Send to the first replica that takes the connection, the cell's own first (an
        empty origin: known to be down): a replica that died costs this request a try
        elsewhere, not the cell its conversation."""
        candidates = att.upstream()
        home = candidates[0][0] if candidates else "?"
        live = [(r, o) for r, o in candidates if o]
        if not live:
            raise ClientConnectionError("no replica of this cell's model is up")
        for i, (replica, origin) in enumerate(live):
            try:
                up = await self._client().request(
                    req.method, origin.rstrip("/") + req.path_qs, data=body, headers=headers,
                    allow_redirects=False)
            except (ClientConnectionError, OSError) as e:
                if i == len(live) - 1:
                    raise
                self._failover(att, rec, replica, live[i + 1][0], f"{type(e).__name__}: {e}")
                continue
            if i == 0 and replica != home:  # its own replica was known to be down
                self._failover(att, rec, home, replica, "replica down")
            rec["replica"] = replica
            return up
        raise AssertionError("unreachable")

    def _failover(self, att: Attempt, rec: dict[str, Any], frm: str, to: str,
                  why: str) -> None:
        why = self.redact(why[:200])
        rec.setdefault("failover", []).append({"from": frm, "to": to, "why": why})
        att.meter.failovers += 1
        if self.on_failover is not None:
            self.on_failover(att.cell, att.attempt, frm, to, why)

    def _account(self, att: Attempt, rec: dict[str, Any], status: int,
                 scan: StreamScan | None, held: list[bytes], held_n: int) -> None:
        m = att.meter
        if scan is not None:
            rec["chunks"] = scan.chunks
            usage, finish, estimate = scan.usage, scan.finish, scan.chunks
            model = scan.model
            doc = None
        else:
            doc = None
            if held_n <= self.limits.parse_cap:
                with contextlib.suppress(ValueError, UnicodeDecodeError):
                    doc = json.loads(b"".join(held))
            elif status < 400:
                rec["unparsed"] = f"body over {self.limits.parse_cap} bytes"
            usage, finish, estimate = usage_of(doc), finish_of(doc), 0
            model = model_of(doc)
        kind = error_kind(status, _text(doc, held) if status >= 400 else "")
        if kind is not None:
            m.error(kind, f"HTTP {status}")
            rec["error"] = kind
            rec["body"] = self.redact(_text(doc, held))[:ERROR_BODY]
            return
        m.count(usage, estimate)
        m.answered_as(model)
        if model is not None:
            rec["model"] = model
        if usage is not None:
            rec.update(prompt_tokens=usage.prompt, completion_tokens=usage.completion,
                       reasoning_tokens=usage.reasoning)
            if usage.malformed:
                rec["malformed_usage"] = True
        elif estimate:
            rec.update(completion_tokens=estimate, estimated=True)
        if finish:
            rec["finish_reason"] = finish


def gateway_for(preset: Preset, redact: Callable[[str], str], on_throttled: Callable[[], None],
                emit: Callable[..., Any], auth: Callable[[], dict[str, str]] | None = None,
                run_token: str = "", secrets: tuple[str, ...] = ()) -> Gateway | None:
    """The gateway a preset asks for (None: harnesses talk to the endpoint directly)."""
    from autopilot.config import GATEWAY_ENGINES

    g = preset.gateway
    if not g.enabled or preset.endpoint.engine not in GATEWAY_ENGINES:
        return None
    gw = Gateway(redact, Limits(max_request=int(g.max_request_mb * 2**20),
                                max_records=g.max_records, hold_429=g.hold_429_secs),
                 on_throttled=on_throttled,
                 on_failover=lambda cell, attempt, frm, to, why: emit(
                     "request_failover", cell=cell, attempt=attempt, replica=frm, to=to,
                     why=why))
    if preset.endpoint.engine == "provider":
        gw.auth, gw.expect_key = auth, placeholder_key(run_token)
    gw.secrets = secrets
    return gw


def _retry_after(value: str | None) -> float:
    """Seconds a 429 asks to wait (delta-seconds; a date or garbage: one second),
    bounded to a minute."""
    try:
        return min(max(float(value or 1), 0.0), 60.0)
    except ValueError:
        return 1.0


def _text(doc: Any, held: list[bytes]) -> str:
    if doc is not None:
        return json.dumps(doc)[:ERROR_BODY * 2]
    return b"".join(held)[:ERROR_BODY * 2].decode("utf-8", "replace")


__all__ = ["PLACEHOLDER_PREFIX", "Attempt", "Gateway", "Limits", "gateway_for",
           "placeholder_key"]
