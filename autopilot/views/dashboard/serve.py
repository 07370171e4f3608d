"""``dashboard --serve``: the live run, read-only, over HTTP (aiohttp, already installed
with aiodocker).

Routes: ``/`` the grid, updated in place by server-sent events (``/events``) as the
run's files change; ``/cell/<id>`` one cell's verdict, attempts with their evidence,
grade details and the tails of its transcript, launcher log and grader log;
``/status.json``; ``/metrics`` (Prometheus); ``/static/app.{css,js}``. It never writes
into the state dir and never takes the lock, so it survives the supervisor restarting
and a state dir that appears after it starts.

Everything shown comes from files a harness, grader or endpoint wrote: it is escaped by
jinja2's autoescaping, control characters are removed, tails are bounded, a cell id
must be a plain name of the plan before any path is built from it, and a strict
Content-Security-Policy allows no inline script and no request to anywhere else (on
every response, errors included). Bound to anything but loopback it requires a token
(``--token-file``): a Bearer header, a ``?token=`` once (then an HttpOnly,
SameSite=Strict cookie), or that cookie. A request whose ``Host`` is not the bound
address, ``localhost``, a loopback address or a name given with ``--allow-host`` is
refused (421): a page the operator opens elsewhere cannot read the run through DNS
rebinding. A client holds at most ``SSE_PER_CLIENT`` event streams at once. Known secret
values (the preset's secret env vars, notification URLs) are redacted from every body.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import os
import time
from importlib.resources import files
from pathlib import Path
from typing import Any

from aiohttp import web

from autopilot.config import NAME_RE
from autopilot.escape import block, clean, sane
from autopilot.state.fsutil import read_json
from autopilot.state.journal import state_events
from autopilot.state.liveness import look, shown
from autopilot.state.untrusted import owner_of, read_tail, state_json
from autopilot.views.dashboard import model
from autopilot.views.dashboard.analysis import kind as cell_kind
from autopilot.views.dashboard.html import live_context, render_template

TAIL_BYTES = 8192
GRADE_BYTES = 65536
POLL_SECS = 0.5
RESEND_SECS = 5.0  # re-render at least this often: a heartbeat going stale changes no file
COOKIE = "autopilot_token"
WATCHED = ("journal.jsonl", "status.json", "heartbeat.json", "plan.json")
STATIC = {"app.css": "text/css", "app.js": "text/javascript"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SSE_PER_CLIENT = 4
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(path: Path) -> str:
    token = path.read_text(encoding="utf-8").strip()
    if len(token) < 16:
        raise ValueError(f"{path}: the token must be at least 16 characters")
    return token


def host_of(header: str) -> str:
    """The name in a Host header (``name``, ``name:port``, ``[v6]:port``), lowercased."""
    host = header.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class Server:
    def __init__(self, state_dir: Path, token: str | None = None, *, bound: str = "127.0.0.1",
                 allow_hosts: tuple[str, ...] = ()) -> None:
        self.state_dir = state_dir
        self.token = token
        self.hosts = {bound.lower(), "localhost", *(host.lower() for host in allow_hosts)}
        self.streams: dict[str, int] = {}
        self._redactor: Any = None

    def redact(self, text: str) -> str:
        """Known secret values out of what is served: the recorded preset's secret env
        vars and the notification URLs, as far as this process knows them."""
        if self._redactor is None:
            from autopilot.cell.childenv import secret_values, urls_from_env
            from autopilot.logsetup import Redactor

            try:
                from autopilot.state.readers import load_recorded

                values = secret_values(load_recorded(self.state_dir)[0])
            except Exception:  # no run (yet), or its preset cannot load: env URLs only
                values = urls_from_env()
            self._redactor = Redactor(values)
        scrubbed: str = self._redactor.scrub(text)
        return scrubbed

    def host_allowed(self, header: str) -> bool:
        name = host_of(header)
        return name in self.hosts or (name != "" and is_loopback(name))

    # ------------------------------------------------------------------ plumbing

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/", self.index)
        app.router.add_get("/events", self.events)
        app.router.add_get("/status.json", self.status)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/cell/{cid}", self.cell)
        app.router.add_get("/static/{name}", self.static)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not self.host_allowed(request.headers.get("Host", "")):
            return web.Response(status=421, text="421: not this server's name\n",
                                headers=HEADERS)
        set_cookie = False
        if self.token is not None:
            given = _bearer(request) or request.query.get("token") \
                or request.cookies.get(COOKIE) or ""
            try:
                ok = hmac.compare_digest(given.encode(), self.token.encode())
            except UnicodeEncodeError:  # bytes that are no text (a header's): no token
                ok = False
            if not ok:
                return web.Response(status=401, text="401: a token is required\n",
                                    headers={"WWW-Authenticate": "Bearer", **HEADERS})
            set_cookie = request.query.get("token") is not None
        try:
            resp: web.StreamResponse = await handler(request)
        except web.HTTPException as e:  # a 404 carries the same headers as a page
            resp = web.Response(status=e.status, text=e.text, headers=HEADERS)
        if isinstance(resp, web.Response) and resp.text is not None and not resp.prepared:
            resp.text = self.redact(resp.text)
        for k, v in HEADERS.items():
            if not resp.prepared:
                resp.headers[k] = v
        if set_cookie and self.token is not None and not resp.prepared:
            resp.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict")
        return resp

    def _version(self) -> tuple[Any, ...]:
        out: list[tuple[int, int] | None] = []
        for name in WATCHED:
            try:
                info = os.stat(self.state_dir / name)
                out.append((info.st_mtime_ns, info.st_size))
            except OSError:
                out.append(None)
        return tuple(out)

    def _fragment(self) -> str:
        data = model.load(self.state_dir)
        if data is None:
            return render_template("_empty.html.j2", state_dir=str(self.state_dir))
        return render_template("_live.html.j2", **live_context(data, links=True))

    # ------------------------------------------------------------------ pages

    async def index(self, request: web.Request) -> web.Response:
        data = await asyncio.to_thread(model.load, self.state_dir)
        status = data.status if data is not None else {}
        fragment = await asyncio.to_thread(self._fragment)
        html = render_template("serve.html.j2", status=status, base="",
                               state_dir=str(self.state_dir), live=fragment)
        return web.Response(text=html, content_type="text/html")

    async def events(self, request: web.Request) -> web.StreamResponse:
        client = request.remote or "?"
        if self.streams.get(client, 0) >= SSE_PER_CLIENT:
            return web.Response(status=429, text=f"429: at most {SSE_PER_CLIENT} event "
                                "streams per client\n", headers={"Retry-After": "5"})
        self.streams[client] = self.streams.get(client, 0) + 1
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **HEADERS})
            await resp.prepare(request)
            try:
                await self._stream(resp)
            except ConnectionError:
                pass  # the client went away
            return resp
        finally:
            self.streams[client] -= 1
            if not self.streams[client]:
                del self.streams[client]

    async def _stream(self, resp: web.StreamResponse) -> None:
        """Send the grid fragment whenever the run's files change (and at least every
        RESEND_SECS, since a heartbeat going stale changes no file), unless identical."""
        last_version: tuple[Any, ...] | None = None
        last_sent, last_text, k = 0.0, "", 0
        while True:
            version = self._version()
            now = time.monotonic()
            if version != last_version or now - last_sent >= RESEND_SECS:
                last_version, last_sent = version, now
                text = self.redact(await asyncio.to_thread(self._fragment))
                if text != last_text:
                    last_text, k = text, k + 1
                    payload = "".join(f"data: {line}\n" for line in text.splitlines())
                    await resp.write(f"id: {k}\n{payload}\n".encode())
            await asyncio.sleep(POLL_SECS)

    async def status(self, request: web.Request) -> web.Response:
        raw = state_json(self.state_dir, "status.json")
        if not isinstance(raw, dict):
            return web.json_response({"error": "no run yet"}, status=404)
        doc = shown(self.state_dir, sane(raw))
        return web.Response(text=json.dumps(doc), content_type="application/json")

    async def metrics(self, request: web.Request) -> web.Response:

        body = await asyncio.to_thread(self._metrics)
        if body is None:
            return web.Response(status=404, text="no run yet\n")
        return web.Response(body=body, headers={
            "Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def _metrics(self) -> bytes | None:
        from autopilot.views.metrics import exposition

        data = model.load(self.state_dir)
        if data is None or data.ledger is None:
            return None
        raw = state_json(self.state_dir, "status.json")
        return exposition(data.ledger, data.status, look(
            self.state_dir, raw.get("phase") if isinstance(raw, dict) else None))

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            raise web.HTTPNotFound()
        text = files("autopilot.views.dashboard").joinpath("static", name).read_text()
        return web.Response(text=text, content_type=STATIC[name])

    async def cell(self, request: web.Request) -> web.Response:
        cid = request.match_info["cid"]
        page = await asyncio.to_thread(self._cell_page, cid)
        if page is None:
            raise web.HTTPNotFound(text=f"no cell {clean(cid, 80)} in this run\n")
        return web.Response(text=page, content_type="text/html")

    def _cell_page(self, cid: str) -> str | None:
        data = model.load(self.state_dir)
        # A plain name of this plan, or nothing: the id becomes part of file paths.
        if data is None or cid not in data.cells or not NAME_RE.fullmatch(cid) or ".." in cid:
            return None
        cell = data.cells[cid]
        verdict = {"PASS": "PASS", "FAIL": "FAIL"}.get(cell.status) or (
            f"INVALID({cell.reason})" if cell.status == "invalid" else cell.status.upper())
        evs = []
        for event in state_events(self.state_dir):
            if event.get("cell") != cid:
                continue
            event = sane(event)
            evidence = {k: v for k, v in event.items()
                        if k not in ("ts", "event", "cell", "attempt", "token")}
            evs.append({"ts": clean(event.get("ts"), 40), "attempt": clean(event.get("attempt"), 8),
                        "event": clean(event.get("event"), 40),
                        "evidence": clean(json.dumps(evidence, default=str), 600)})
        logs, owner = self.state_dir / "logs", owner_of(self.state_dir)
        found = [
            _tail_file("launcher log", "launcher", logs / f"{cid}.launcher.log", owner=owner),
            _tail_file("grader log", "grader", logs / f"{cid}.grade.log", owner=owner),
            *self._artifacts(cid),
        ]
        return render_template("cell.html.j2", cell=cid, verdict=verdict,
                               kind=cell_kind(cell).split()[0], detail=clean(cell.detail, 600),
                               events=evs[-200:], files=found)

    def _artifacts(self, cid: str) -> list[dict[str, Any]]:
        """The transcript's tail and the grade, where the run's preset says they are:
        only for a state dir that passes the ownership checks (a planted plan.json must
        not turn this page into a reader of arbitrary files)."""
        from autopilot.errors import AutopilotError
        from autopilot.plan import cell_context
        from autopilot.state.readers import load_recorded
        from autopilot.state.statedir import check_trusted

        try:
            check_trusted(self.state_dir)
            preset, plan = load_recorded(self.state_dir)
        except (AutopilotError, OSError) as e:
            note = f"not shown: {clean(e, 300)}"
            return [{"title": "transcript", "key": "transcript", "note": note, "text": None}]
        cell = plan.by_id.get(cid)
        if cell is None:
            return []
        ctx = cell_context(preset, cell, 1, self.state_dir)
        grade = _tail_file("grade", "grade", Path(ctx["grade_file"]), GRADE_BYTES)
        parsed = read_json(Path(ctx["grade_file"]))
        if isinstance(parsed, dict):
            grade["text"] = block(json.dumps(sane(parsed), indent=1))[:GRADE_BYTES]
        out = [_tail_file("transcript (tail)", "transcript", Path(ctx["transcript"])), grade]
        # The gateway's record of the latest attempt's requests (a plan cell id names the
        # folder, inside the state dir; the file is read like any other a run left).
        logs = self.state_dir / "gateway" / cid
        try:
            attempts = sorted((int(f.name[8:-6]), f) for f in logs.iterdir()
                              if f.name.startswith("attempt-") and f.name.endswith(".jsonl")
                              and f.name[8:-6].isdigit())
        except OSError:
            attempts = []
        if attempts:
            k, latest = attempts[-1]
            out.append(_tail_file(f"model requests, attempt {k} (gateway)", "gateway",
                                  latest))
        return out


def _bearer(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    return auth[7:] if auth.startswith("Bearer ") else None


def _tail_file(title: str, key: str, path: Path, limit: int = TAIL_BYTES,
               owner: int | None = None) -> dict[str, Any]:
    """The end of a file a cell left (autopilot.state.untrusted: never a FIFO, a device or
    a symlink, which would hang the server's threads or read another file)."""
    try:
        data, size = read_tail(path, limit, owner)
    except FileNotFoundError:
        return {"title": title, "key": key, "note": "not there", "text": None}
    except OSError as e:
        return {"title": title, "key": key, "note": f"not shown: {clean(e.strerror, 200)}",
                "text": None}
    note = f"last {len(data)} of {size} bytes" if size > limit else ""
    return {"title": title, "key": key, "note": note,
            "text": block(data.decode("utf-8", "replace"))}


async def run(state_dir: Path, host: str, port: int, token: str | None,
              ready: Any = None, allow_hosts: tuple[str, ...] = ()) -> None:
    server = Server(state_dir, token, bound=host, allow_hosts=allow_hosts)
    runner = web.AppRunner(server.app(), access_log=None,
                           shutdown_timeout=1.0)  # an open event stream must not hold Ctrl-C
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    print(f"serving {state_dir} on http://{host}:{bound}/ (read-only; Ctrl-C stops)",
          flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
