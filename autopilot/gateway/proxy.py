"""The model gateway: every request a cell's harness makes to the model passes here.

One listener per attempt, on 127.0.0.1 and a port of its own, run in the attempt's data
path (autopilot.datapath.process). Only that attempt's harness may use it: a request must
carry the attempt's key (a fresh 128-bit secret the harness gets as its API key), or
come over a connection a process of the attempt's own tree opened (``caller``: for a
harness that sends no key, as the origin benchmark's does). Anything else is answered
401 before a byte of its body is read, and counts for nothing: not a request, not
progress, not spend.

Each admitted request is forwarded to the replica the cell runs against (asked at
request time: a restarted endpoint may have a new port), with the arm's ``request``
settings deep-merged into generation requests (autopilot.gateway.evidence). Where a
provider's key is attached upstream, only the routes a model is used through, for the
arm's model, reach it (403 otherwise). Responses pass through chunk by chunk
(server-sent events included), while the gateway reads what they say: usage, finish
reason, errors. A response it cannot read (encoded, too large, undecodable, of another
shape) is marked ``unmetered`` on its record and counted as such, never as 0 tokens. One
JSON line per request goes to the attempt's ``gateway.jsonl`` (bounded), saying which
side ended it, and the attempt's totals (``Meter``) go into the journal with its verdict.

Built on aiohttp (server and client); what a request may be and carry (keys, headers,
routes, Retry-After, body reading) is autopilot.gateway.policy. A body that never ends
is the watchdog's to judge; closing the attempt cuts what is still in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import (
    ClientConnectionError,
    ClientError,
    ClientSession,
    ClientTimeout,
    TCPConnector,
    web,
)

from autopilot.attemptspec import GatewayLimits
from autopilot.gateway.accounting import account
from autopilot.gateway.attempt import Attempt
from autopilot.gateway.dialects import CHAT, Dialect, route_of
from autopilot.gateway.evidence import (
    StreamScan,
    loads_bounded,
    merge,
)
from autopilot.gateway.policy import (
    ERROR_READ,
    HOP,
    KEY_ENV,
    attempt_key,
    forwardable,
    inflate,
    named_in_connection,
    provider_refusal,
    retry_after,
    without_key,
)
from autopilot.gateway.record import Failover, Record
from autopilot.gateway.settings import GatewaySettings, gateway_for
from autopilot.state.statedir import open_append

if TYPE_CHECKING:  # the attempt's data path runs this module: it must not load config
    pass


@dataclass(frozen=True)
class Outgoing:
    """A request as the gateway sends it upstream (Gateway._outgoing)."""

    dialect: Dialect
    metered: bool
    stream: bool
    body: bytes
    headers: dict[str, str]
    target: str  # path and query, the harness's key taken off


@dataclass(eq=False)
class Exchange:
    """One request's way through the gateway: what the stages share. ``rec`` is the
    record written to the gateway log."""

    att: Attempt
    req: web.Request
    rec: Record
    t0: float
    dialect: Dialect = CHAT  # (the request's own, once read: Gateway._outgoing)
    metered: bool = False
    stream: bool = False
    resp: web.StreamResponse | None = None
    status: int = 0
    encoding: str = "identity"
    scan: StreamScan | None = None
    held: list[bytes] = field(default_factory=list)
    first_byte: bool = False
    accounted: bool = False  # counted already (an error, at its head)

    def answer(self) -> web.StreamResponse:
        assert self.resp is not None  # made at the upstream's head
        return self.resp


class Gateway(GatewaySettings):
    """The run's gateway serving (one per data path, or the loop's for a grader; its
    attempts share one client)."""

    def __init__(self, redact: Callable[[str], str] = lambda s: s,
                 limits: GatewayLimits | None = None,
                 on_throttled: Callable[[], None] = lambda: None,
                 on_failover: Callable[[str, int, str, str, str], Any] | None = None) -> None:
        super().__init__(redact, limits, on_throttled, on_failover)
        self._session: ClientSession | None = None

    @classmethod
    def like(cls, settings: GatewaySettings) -> Gateway:
        """A serving gateway with ``settings``' limits, keys and listeners."""
        gateway = cls(settings.redact, settings.limits, settings.on_throttled, settings.on_failover)
        gateway.key, gateway.dialects = settings.key, settings.dialects
        gateway.secrets = settings.secrets
        return gateway

    def _client(self) -> ClientSession:
        if self._session is None or self._session.closed:
            # No total timeout: a long generation is the watchdog's to judge. An upstream
            # silent for upstream_read_secs is cut (a socket nobody will ever write to).
            self._session = ClientSession(
                timeout=ClientTimeout(total=None, sock_connect=10,
                                      sock_read=self.limits.upstream_read_secs or None),
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
                      log_path: Path, sock: socket.socket | None = None, *,
                      key: str | None = None,
                      caller: Callable[[tuple[str, int]], bool] | None = None,
                      model: str | None = None, rewrite: bool = False,
                      dialects: frozenset[str] = frozenset(),
                      dialect_settings: Mapping[str, Mapping[str, Any]] | None = None
                      ) -> AsyncIterator[Attempt]:
        """Listen for one attempt's requests until the block ends (on ``sock``, a
        listening socket the loop bound and handed over, else on a fresh port). ``key``:
        the attempt's key (a fresh one when None: ``Attempt.key``)."""
        att = Attempt(cell, attempt, settings, upstream, log_path,
                      key=key or attempt_key(), caller=caller, model=model,
                      rewrite=rewrite, dialects=dialects,
                      dialect_settings=dialect_settings or {},
                      max_records=self.limits.max_records)

        async def handle(req: web.Request) -> web.StreamResponse:
            return await self._handle(att, req)

        app = web.Application(client_max_size=self.limits.max_request)
        app.router.add_route("*", "/{tail:.*}", handle)
        # A harness that hangs up cancels its request (and so the upstream's work); an
        # unread body is never drained (lingering), it is dropped with its connection;
        # a request body is forwarded as it came (no decompression here).
        runner = web.AppRunner(app, handle_signals=False, access_log=None,
                               shutdown_timeout=0.5, handler_cancellation=True,
                               lingering_time=0, auto_decompress=False)
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
                    att.closing = True
                    await runner.cleanup()  # what is still open is cut, and written
                    att._log = None
                    if att.dropped:
                        with contextlib.suppress(OSError):
                            f.write((json.dumps({"dropped": att.dropped}) + "\n").encode())
        finally:
            att.closing = True
            await runner.cleanup()

    @contextlib.asynccontextmanager
    async def grading(self, cell: str, attempt: int,
                      upstream: Callable[[], list[tuple[str, str]]], log_path: Path,
                      model: str | None = None) -> AsyncIterator[Attempt]:
        """A grader's own listener (model-graded scoring), run here in the loop for the
        grading's length: a key of its own, no arm settings (grading is not the
        experiment), the same checks and bounds, its meter the grading's."""
        async with self.attempt(cell, attempt, {}, upstream, log_path, model=model) as att:
            yield att

    async def _handle(self, att: Attempt, req: web.Request) -> web.StreamResponse:
        meter = att.meter
        if not att.admits(req):
            # Before a byte of the body: not this attempt's harness. Nothing of it counts
            # (not progress, not spend, not a record); its connection is closed.
            meter.unauthorized += 1
            resp = web.json_response({"error": {
                "message": "the autopilot gateway serves one attempt's harness: send its "
                           f"key ({KEY_ENV}) as the API key", "type": "unauthorized"}},
                status=401)
            resp.force_close()
            return resp
        meter.requests += 1
        first = meter.requests == 1
        meter.in_flight += 1
        meter.progress += 1
        t0 = time.perf_counter()
        rec = Record(round(time.time(), 3), req.method, req.path[:200])
        exchange = Exchange(att, req, rec, t0)
        try:
            return await self._forward(exchange)
        except asyncio.CancelledError:
            accounted = exchange.accounted  # an endpoint's error, already counted
            if att.closing:
                # The attempt ended (its harness gone, its data path closing) with this
                # request still open: written as cut, never lost.
                rec.cut, rec.ended_by = "attempt ended", "attempt"
            elif accounted:
                rec.client_closed, rec.ended_by = True, "harness"
            else:  # the harness hung up: its request (and the upstream's work) ends
                meter.error("client_closed", "the harness closed its connection")
                rec.error, rec.ended_by = "client_closed", "harness"
                route = route_of(req.method, req.path)
                # Unmetered only if it reached an upstream (which may have spent on it): a
                # body that never came was never sent anywhere.
                if rec.reached_upstream() and route is not None and route.metered:
                    rec.unmetered = "the harness hung up before the response ended"
            raise
        finally:
            meter.in_flight -= 1
            meter.progress += 1
            if first:
                meter.first_error = rec.error or ""
            if rec.unmetered:
                meter.unmetered += 1
            rec.latency_ms = round((time.perf_counter() - t0) * 1000, 2)
            with contextlib.suppress(OSError):
                att.write(rec)

    def _refuse(self, att: Attempt, rec: Record, status: int, kind: str,
                why: str) -> web.Response:
        att.meter.error(kind, why)
        rec.status, rec.error, rec.refused, rec.ended_by = status, kind, why[:200], "gateway"
        if status == 403:
            att.meter.refused += 1
        return web.json_response({"error": {"message": f"autopilot gateway: {why}"}},
                                 status=status)

    async def _forward(self, exchange: Exchange) -> web.StreamResponse:
        """One request through, in stages: its body read, the request as it goes
        upstream, the upstream's head (an error's words counted before the harness hears
        them), the body relayed, what the response counts for."""
        att, req, rec, lim = exchange.att, exchange.req, exchange.rec, self.limits
        try:
            async with asyncio.timeout(lim.body_secs or None):  # no task of its own
                body = await req.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(att, rec, 413, "request_error",
                                "request body over the gateway's limit")
        except TimeoutError:
            return self._refuse(att, rec, 408, "request_error",
                                f"request body not received within {lim.body_secs:g}s")
        out = self._outgoing(att, req, body, rec)
        if isinstance(out, web.Response):
            return out
        out.headers["Accept-Encoding"] = "identity"
        exchange.dialect, exchange.metered, exchange.stream = out.dialect, out.metered, out.stream
        try:
            upstream = await self._send_held(att, req.method, out.target, out.body, out.headers,
                                             rec)
            async with upstream:
                await self._head(exchange, upstream)
                if not await self._answer_head(exchange):
                    return exchange.answer()
                try:
                    gone = await self._relay(exchange, upstream)
                except asyncio.CancelledError:
                    if exchange.scan is not None and exchange.scan.state.done:
                        # hung up after the dialect's last event: counted in full
                        att.meter.answered += 1
                        self._account(exchange, 0)
                    raise
                if not gone:
                    await exchange.answer().write_eof()
                self._settle(exchange, gone)
                return exchange.answer()
        except (ClientError, TimeoutError, OSError) as e:
            return self._endpoint_failed(exchange, f"{type(e).__name__}: {e}"[:300])

    async def _head(self, exchange: Exchange, up: Any) -> None:
        """The upstream's status and headers; an error's body read and counted now: a
        client that hangs up on a 4xx (urllib raises on the status) must not take the
        endpoint's evidence with it."""
        exchange.resp = _response_head(up, exchange.rec)
        exchange.status = up.status
        sse = "text/event-stream" in up.headers.get("Content-Type", "").lower()
        exchange.encoding = up.headers.get("Content-Encoding", "identity").strip().lower()
        exchange.scan = (StreamScan(exchange.dialect)
                         if (exchange.stream or sse) and up.status < 400 else None)
        if up.status >= 400:
            held_n = await _read_error(up, exchange.held)
            exchange.rec.ttfb_ms = round((time.perf_counter() - exchange.t0) * 1000, 2)
            exchange.first_byte = True
            exchange.att.meter.bytes_in += held_n
            exchange.att.meter.answered += 1
            self._account(exchange, held_n)

    async def _answer_head(self, exchange: Exchange) -> bool:
        """The head (and a held error) to the harness; False when it hung up already."""
        resp = exchange.answer()
        try:
            await resp.prepare(exchange.req)
            for chunk in exchange.held if exchange.status >= 400 else ():
                await resp.write(chunk)
        except (ConnectionError, RuntimeError):
            if not exchange.accounted:
                exchange.att.meter.error("client_closed", "the harness closed its connection")
                exchange.rec.error = "client_closed"
            exchange.rec.client_closed, exchange.rec.ended_by = True, "harness"
            return False
        return True

    def _settle(self, exchange: Exchange, gone: bool) -> None:
        """What the whole response counts for (an error was counted at its head)."""
        exchange.rec.ended_by = "harness" if gone else "complete"
        if gone:
            exchange.rec.client_closed = True
        if exchange.accounted:
            return
        exchange.att.meter.answered += 1
        if gone and exchange.status < 400:
            # The harness stopped reading mid-response: what it got is not the whole.
            exchange.att.meter.error("client_closed", "the harness closed its connection "
                                     "mid-response")
            exchange.rec.error = "client_closed"
            if exchange.metered:
                exchange.rec.unmetered = "the harness hung up before the response ended"
            return
        # (a harness that stopped reading an error's body: what the endpoint said counts)
        self._account(exchange, sum(map(len, exchange.held)))

    def _account(self, exchange: Exchange, held_n: int) -> None:
        account(exchange.att, exchange.rec, exchange.status, exchange.dialect, exchange.scan,
                exchange.held, held_n, exchange.metered, exchange.encoding, self.limits,
                self.redact)
        exchange.accounted = True

    def _endpoint_failed(self, exchange: Exchange, why: str) -> web.StreamResponse:
        """The endpoint refused the connection, went silent or cut the body."""
        exchange.att.meter.error("endpoint_error", why)
        if exchange.resp is not None and exchange.resp.prepared:
            # Cut mid-body: the harness must see a cut, not a clean end, so its
            # connection is dropped, not finished.
            exchange.rec.error, exchange.rec.detail = "endpoint_error", self.redact(why)
            exchange.rec.cut, exchange.rec.ended_by = "endpoint", "endpoint"
            if exchange.metered:
                exchange.rec.unmetered = "the response was cut before it ended"
            if exchange.req.transport is not None:
                exchange.req.transport.abort()
            return exchange.resp
        exchange.rec.error, exchange.rec.detail = "endpoint_error", self.redact(why)
        exchange.rec.ended_by = "endpoint"
        return web.json_response({"error": {"message": "the model endpoint did not "
                                            "answer (autopilot gateway): " + why}},
                                 status=502)

    def _outgoing(self, att: Attempt, req: web.Request, body: bytes,
                  rec: Record) -> Outgoing | web.Response:
        """The request as it goes upstream: its dialect (by route alone), the upstream's
        key in that vendor's header (only on its own model routes, for the arm's
        model), the route's model asked for, the arm's settings merged in; or the
        refusal the harness gets instead."""
        lim = self.limits
        route = route_of(req.method, req.path)
        dialect = route.dialect if route is not None else CHAT
        metered = route is not None and route.metered
        generation = route is not None and route.generates
        encoding = req.headers.get("Content-Encoding", "identity").strip().lower()
        stream = False
        doc: Any = None
        parsed = False
        path = req.path
        if route is not None:
            rec.dialect = dialect.name
            if body:
                raw = inflate(body, encoding, lim.max_request)
                if raw is not None:
                    doc = loads_bounded(raw, lim.max_depth)
                    parsed = isinstance(doc, dict)
            stream = dialect.streams(doc if parsed else None, route, req.path)
            rec.stream = stream
            asked = dialect.asked(doc if parsed else None, route)
            if asked is not None:
                rec.model = asked[:120]
        out_headers = forwardable(req.headers)
        if self.key is not None:
            # A provider's key: only a model route of its dialect, only the arm's model.
            why = provider_refusal(req.method, req.path, route, doc if parsed else None,
                                   att.model, att.dialects, att.rewrite)
            if why is not None:
                return self._refuse(att, rec, 403, "request_error", why)
            upstream_key = self.key()
            if upstream_key:
                out_headers.update(dialect.auth(upstream_key))
        changed = False
        if route is not None and route.keyed and att.rewrite and att.model and parsed:
            # The route names the model as its provider spells it; the agent's own id is
            # kept in the record (an agent CLI refuses ids it does not know).
            doc, path = dialect.with_model(doc, path, route, att.model)
            rec.sent_model = att.model
            changed = True
        settings = att.settings_for(dialect.name) if generation else {}
        if settings:
            if not parsed:
                # The arm's settings are the experiment: a body they cannot go into is not
                # sent without them.
                return self._refuse(att, rec, 400, "request_error",
                                    "a generation request whose body is not a JSON object "
                                    "the gateway can read (the arm's settings go into it)")
            doc = merge(doc, settings)
            rec.applied = dict(settings)
            changed = True
        if changed:
            body = json.dumps(doc).encode()
            out_headers = {k: v for k, v in out_headers.items()
                           if k.lower() != "content-encoding"}
        query = without_key(req.query_string)
        target = path + ("?" + query if query else "")
        return Outgoing(dialect, metered, stream, body, out_headers, target)

    async def _send_held(self, att: Attempt, method: str, target: str, body: bytes,
                         headers: dict[str, str], rec: Record) -> Any:
        """Send; a 429 tells the loop to launch fewer cells at once, and within the
        preset's bound (hold_429) the request is held and retried here, unseen by the
        harness, as its Retry-After asks."""
        lim = self.limits
        held_until = time.monotonic() + lim.hold_429
        while True:
            upstream = await self._send(att, method, target, body, headers, rec)
            if upstream.status != 429:
                return upstream
            self.on_throttled()
            wait = retry_after(upstream.headers.get("Retry-After"))
            if lim.hold_429 <= 0 or wait is None or time.monotonic() + wait > held_until:
                return upstream
            att.meter.error("throttled", "HTTP 429 (held and retried by the gateway)")
            rec.held_429 += 1
            upstream.release()
            await asyncio.sleep(wait)

    async def _relay(self, exchange: Exchange, up: Any) -> bool:
        """The response body, chunk by chunk, to the harness first and read by us after
        (our reading is never in its time to first byte): into the stream scan, or held
        (up to the parse cap) for reading whole. True when the harness stopped reading."""
        meter, cap = exchange.att.meter, self.limits.parse_cap
        resp, held = exchange.answer(), exchange.held
        held_n = sum(map(len, held))
        async for chunk in up.content.iter_any():
            if not exchange.first_byte:
                exchange.rec.ttfb_ms = round((time.perf_counter() - exchange.t0) * 1000, 2)
                exchange.first_byte = True
            meter.bytes_in += len(chunk)
            meter.progress += 1
            try:
                await resp.write(chunk)
            except (ConnectionError, RuntimeError):
                return True
            finally:
                if exchange.scan is not None:
                    exchange.scan.feed(chunk)
                elif held_n <= cap and not exchange.accounted:
                    held.append(chunk)
                    held_n += len(chunk)
        return False

    async def _send(self, att: Attempt, method: str, target: str, body: bytes,
                    headers: dict[str, str], rec: Record) -> Any:
        """Send to the first replica that takes the connection, the cell's own first (an
        empty origin: known to be down): a replica that died costs this request a try
        elsewhere, not the cell its conversation. Never once the response has begun."""
        candidates = att.upstream()
        home = candidates[0][0] if candidates else "?"
        live = [(name, address) for name, address in candidates if address]
        if not live:
            raise ClientConnectionError("no replica of this cell's model is up")
        for i, (replica, origin) in enumerate(live):
            try:
                upstream = await self._client().request(
                    method, origin.rstrip("/") + target, data=body, headers=headers,
                    allow_redirects=False, skip_auto_headers=("User-Agent",))
            except (ClientConnectionError, OSError) as e:
                if i == len(live) - 1:
                    raise
                self._failover(att, rec, replica, live[i + 1][0], f"{type(e).__name__}: {e}")
                continue
            if i == 0 and replica != home:  # its own replica was known to be down
                self._failover(att, rec, home, replica, "replica down")
            rec.replica = replica
            return upstream
        raise AssertionError("unreachable")

    def _failover(self, att: Attempt, rec: Record, source: str, dest: str,
                  why: str) -> None:
        why = self.redact(why[:200])
        rec.failover.append(Failover(source, dest, why))
        att.meter.failovers += 1
        if self.on_failover is not None:
            self.on_failover(att.cell, att.attempt, source, dest, why)

def _response_head(up: Any, rec: Record) -> web.StreamResponse:
    """The harness's response as the upstream began it: its status and end-to-end
    headers (hop-by-hop ones, and those its Connection line names, stay here)."""
    rec.status = up.status
    if up.status == 429 and up.headers.get("Retry-After"):
        rec.retry_after = up.headers["Retry-After"][:40]
    resp = web.StreamResponse(status=up.status, reason=up.reason)
    hop = HOP | named_in_connection(up.headers)
    for k, v in up.headers.items():
        if k.lower() not in hop:
            resp.headers.add(k, v)
    if up.content_length is not None:
        resp.content_length = up.content_length
    return resp


async def _read_error(up: Any, held: list[bytes]) -> int:
    """Up to ERROR_READ bytes of an error response into ``held``; how many."""
    held_n = 0
    while held_n < ERROR_READ:
        chunk = await up.content.read(ERROR_READ - held_n)
        if not chunk:
            break
        held.append(chunk)
        held_n += len(chunk)
    return held_n


__all__ = ["KEY_ENV", "Attempt", "Gateway", "GatewayLimits", "attempt_key", "gateway_for",
           "retry_after"]
