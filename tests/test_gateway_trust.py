"""The gateway trusts no one (issue #33): only its own attempt's harness may use a
listener, a provider key reaches only the routes it is for, a response the gateway
cannot meter is never counted as 0, and every input is bounded. Real HTTP on 127.0.0.1:
the upstream is a FAKE shaped from the OpenAI protocol and from misbehaviour seen in
the wild (tests/gateway_fake.py)."""

from __future__ import annotations

import asyncio
import gc
import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from gateway_fake import FakeUpstream, client, here, records

from autopilot.gateway.dialects import route_of
from autopilot.gateway.evidence import loads_bounded
from autopilot.gateway.proxy import Gateway, GatewayLimits, attempt_key, retry_after

# ---------------------------------------------------------------------- the rules


def test_an_attempt_key_is_fresh_random_and_redacted_by_its_shape() -> None:
    from autopilot.logsetup import Redactor

    a, b = attempt_key(), attempt_key()
    assert a != b and len(a) == len("sk-autopilot-") + 32
    assert a not in Redactor().scrub(f"my key is {a}!")


@pytest.mark.parametrize(("value", "want"), [
    ("2", 2.0), ("0", 0.0), ("1.5", 1.5),
    ("nan", None), ("inf", None), ("-1", None), ("1e308", None), ("61", None),
    ("soon", None), ("", None), (None, None),
    ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # a date in the past: now
])
def test_retry_after_is_finite_non_negative_and_bounded(value: str | None,
                                                        want: float | None) -> None:
    assert retry_after(value) == want


def test_an_http_date_retry_after_is_the_seconds_until_it() -> None:
    import email.utils

    now = 1_800_000_000.0
    date = email.utils.formatdate(now + 5, usegmt=True)
    assert retry_after(date, now=now) == pytest.approx(5.0)
    assert retry_after(email.utils.formatdate(now + 3600, usegmt=True), now=now) is None


def test_json_is_read_with_a_depth_bound_and_never_raises() -> None:
    assert loads_bounded(b"[" * 100_000 + b"]" * 100_000, 64) is None  # RecursionError caught
    assert loads_bounded(b"[" * 65 + b"]" * 65, 64) is None
    assert loads_bounded(b"[" * 64 + b"]" * 64, 64) is not None
    assert loads_bounded(b'{"a": "\xff"}', 64) is None  # invalid UTF-8
    assert loads_bounded(b'{"s": "[[[[[[[[[["}', 2) == {"s": "[[[[[[[[[["}  # in a string


@pytest.mark.parametrize(("method", "path", "ok"), [
    ("POST", "/v1/chat/completions", True), ("POST", "/v1/completions", True),
    ("POST", "/v1/responses", True), ("POST", "/v1/embeddings", True),
    ("GET", "/v1/chat/completions", False), ("GET", "/v1/files", False),
    ("DELETE", "/v1/organization/admin_api_keys/k", False),
    ("POST", "/v1/fine_tuning/jobs", False),
    ("POST", "/v1/files/../chat/completions", False),
    ("POST", "//evil/v1/chat/completions", False),
    ("POST", "/v1/x%2F..%2Fchat/completions", False),
])
def test_a_provider_key_reaches_only_generation_and_embedding_routes(
        method: str, path: str, ok: bool) -> None:
    route = route_of(method, path)
    assert (route is not None and route.keyed) is ok


def test_unmetered_responses_make_a_budget_unprovable_and_require_metering_invalid() -> None:
    from autopilot.cell.validity import Classification, unmetered
    from autopilot.state.budget import Spend, reached

    assert reached(1000, None, Spend(10, 10), None) is None
    why = reached(1000, None, Spend(10, 10), None, unmetered=3)
    assert why is not None and why.startswith("budget unprovable: 3 response(s)")
    assert reached(None, None, Spend(), None, unmetered=3) is None  # no budget to prove
    c = Classification("PASS", word="PASS")
    assert unmetered(c, 4, required=False, unread=2) == c
    got = unmetered(c, 4, required=True, unread=2)
    assert (got.verdict, got.reason) == ("INVALID", "unmetered")
    assert unmetered(c, 4, required=True, unread=0) == c


def test_a_claim_is_never_the_gateways_count_and_never_a_budgets() -> None:
    """A harness's summary may say anything (99,999,999 tokens). With the gateway's count
    beside it the count is the spend, a floor when some responses were unreadable (never
    topped up by the claim); without one it is a claim, and a budget fails closed on it
    rather than count it either way."""
    from autopilot.state.budget import METERED, Spend, cost_basis, reached

    claim, counted = Spend(99_999_999, 1), Spend(120, 30)
    assert cost_basis(counted, claim, 0.1, unmetered=1) == (counted, "metered_partial")
    assert cost_basis(counted, claim, 0.1) == (counted, "self_reported_mismatch")
    assert cost_basis(None, claim, 0.1) == (claim, "self_reported")
    assert "self_reported" not in METERED and "metered_partial" in METERED
    why = reached(10**9, None, Spend(), None, claimed=claim)
    assert why is not None and why.startswith("budget unprovable: 100000000 tokens rest")
    assert reached(10**9, None, counted, None, claimed=Spend()) is None
    assert reached(None, None, counted, None, claimed=claim) is None  # no budget to prove


# ---------------------------------------------------------------------- who may call


async def test_a_request_without_the_key_is_refused_before_its_body_and_counts_nothing(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    """A caller that claims a 60 MB body and sends none of it gets its 401 at once (the
    body is never waited for), its connection closed; nothing of it is a request, a
    record, progress or spend."""
    gw = Gateway()
    log = tmp_path / "g"
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), log) as att:
            before = att.meter.progress
            reader, writer = await asyncio.open_connection("127.0.0.1", att.port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\n"
                         b"Content-Length: 62914560\r\n\r\n{\"model\":")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            rest = await asyncio.wait_for(reader.read(), 30)  # EOF: closed by the gateway
            writer.close()
            meter = att.meter
            assert meter.progress == before
    finally:
        await gw.close()
    assert head.startswith(b"HTTP/1.1 401") and b"attempt" in rest
    assert (meter.requests, meter.unauthorized, meter.answered) == (0, 1, 0)
    assert upstream.bodies == [] and records(log) == []


async def test_a_flood_of_keyless_requests_keeps_memory_flat_and_the_harness_served(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    """1000 unauthenticated requests each claiming 60 MB (and sending 64 KB of it) cost
    the process holding the listener a bounded amount of memory, and the attempt's own
    requests are answered throughout."""
    gw = Gateway()
    me = psutil.Process()
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g") as att, \
                client(att) as c:
            rss0 = me.memory_info().rss
            junk = b"x" * 65536

            async def knock() -> bytes:
                reader, writer = await asyncio.open_connection("127.0.0.1", att.port)
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Length: 62914560\r\n\r\n" + junk)
                with __import__("contextlib").suppress(ConnectionError):
                    await writer.drain()
                line = await reader.readline()
                writer.close()
                return line

            peak = rss0
            for _ in range(20):
                got = await asyncio.gather(*(knock() for _ in range(50)))
                assert all(g.startswith(b"HTTP/1.1 401") for g in got)
                r = await c.post("/v1/chat/completions", json={"model": "m", "messages": []})
                assert r.status_code == 200
                peak = max(peak, me.memory_info().rss)
            meter = att.meter
    finally:
        await gw.close()
    assert meter.unauthorized == 1000 and meter.requests == 20
    assert peak - rss0 < 100 << 20, f"RSS grew {(peak - rss0) >> 20} MB"


def _connect_and_hold(port: int, ready: Path) -> subprocess.Popen[bytes]:
    code = (f"import socket,sys,time;s=socket.create_connection(('127.0.0.1',{port}));"
            "open(sys.argv[1],'w').write(str(s.getsockname()[1]));"
            "sys.stdin.read()")
    return subprocess.Popen([sys.executable, "-c", code, str(ready)], stdin=subprocess.PIPE)


async def test_a_connection_is_known_by_the_process_tree_that_opened_it(
        tmp_path: Path) -> None:
    """The keyless path (a harness that sends no key): the socket on the other end of a
    connection is found and its holder must descend from the data path."""
    from autopilot.datapath.callers import opened_by_tree

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    ready = tmp_path / "port"
    child = _connect_and_hold(port, ready)
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        conn, peer = srv.accept()
        for _ in range(200):
            if ready.exists() and ready.read_text():
                break
            await asyncio.sleep(0.01)
        assert int(ready.read_text()) == peer[1]
        local = ("127.0.0.1", port)
        assert opened_by_tree(peer, local, os.getpid())  # our child opened it
        assert not opened_by_tree(peer, local, other.pid)  # not a descendant of that one
        assert not opened_by_tree(("127.0.0.1", 1), local, os.getpid())  # no such socket
        conn.close()
    finally:
        for p in (child, other):
            p.kill()
            p.wait()
            assert p.stdin is not None
            p.stdin.close()
        srv.close()


async def test_a_keyless_caller_outside_the_tree_is_refused_as_nobody_too(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    """A local user's process (``nobody``, via setpriv) and one of ours outside the
    attempt's tree get 401 on a listener whose caller check is the tree's."""
    from autopilot.datapath.callers import opened_by_tree

    gw = Gateway()
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE)
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g",
                              caller=lambda peer: opened_by_tree(
                                  peer, ("127.0.0.1", att_port[0]), holder.pid)) as att:
            att_port = [att.port]
            code = ("import urllib.request,sys;"
                    f"r=urllib.request.Request('http://127.0.0.1:{att.port}/v1/models');"
                    "\ntry: print(urllib.request.urlopen(r).status)"
                    "\nexcept Exception as e: print(getattr(e,'code',e))")
            ours = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", code],
                                           capture_output=True, text=True, timeout=60)
            argv = [sys.executable, "-c", code]
            if os.geteuid() == 0 and os.path.exists("/usr/bin/setpriv"):
                argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                        *argv]
            nobody = await asyncio.to_thread(subprocess.run, argv, capture_output=True,
                                             text=True, timeout=60)
            meter = att.meter
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdin is not None
        holder.stdin.close()
        await gw.close()
    assert ours.stdout.strip() == "401", ours.stderr
    assert nobody.stdout.strip() == "401", nobody.stderr
    assert meter.unauthorized == 2 and meter.requests == 0


def _get_from(port: int, src: int) -> int:
    """One keyless GET /v1/models from source port ``src``; the status. The gateway
    closes first (``Connection: close``), so the port can be bound again at once."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", src))
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head = s.recv(64)
    return int(head.split()[1])


async def test_a_re_bound_source_port_is_a_new_caller_checked_again(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    """A keyless caller is admitted per connection, never per source port or Python
    object: once the harness's connection closes, whoever binds that port next (a local
    user) is checked afresh and refused. Twenty rounds: a freed transport's id comes
    back, a closed connection's port is bound again."""
    gw = Gateway()
    harness = {"port": 0, "alive": True}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        src = probe.getsockname()[1]
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g",
                              caller=lambda peer: harness["alive"] and peer[1] == src) as att:
            got = []
            for _ in range(20):
                harness["alive"] = True  # the harness's own connection
                got.append(await asyncio.to_thread(_get_from, att.port, src))
                for _ in range(3):  # the closed connection's transport freed, its id free
                    await asyncio.sleep(0)
                gc.collect()
                harness["alive"] = False  # gone: the same port is a stranger's now
                got.append(await asyncio.to_thread(_get_from, att.port, src))
            meter = att.meter
    finally:
        await gw.close()
    assert got == [200, 401] * 20
    assert meter.unauthorized == 20


# ---------------------------------------------------------------------- never a silent 0


@pytest.mark.parametrize(("model", "why"), [
    ("gzip", "encoded"), ("deep", "not JSON"), ("badutf8", "not JSON"),
    ("nousage", "without usage"),
])
async def test_a_response_the_gateway_cannot_meter_is_marked_unmetered_never_zero(
        upstream: FakeUpstream, tmp_path: Path, model: str, why: str) -> None:
    gw = Gateway()
    log = tmp_path / "g"
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), log) as att, client(att) as c:
            r = await c.post("/v1/chat/completions", json={"model": model, "messages": []})
            assert r.status_code == 200
            meter = att.meter
    finally:
        await gw.close()
    assert upstream.headers[0]["Accept-Encoding"] == "identity"  # asked for plain bytes
    rec = records(log)[0]
    assert why in rec["unmetered"] and "completion_tokens" not in rec
    assert meter.unmetered == 1 and meter.summary()["unmetered"] == 1


async def test_a_body_over_the_parse_cap_is_unmetered(upstream: FakeUpstream,
                                                      tmp_path: Path) -> None:
    gw = Gateway(limits=GatewayLimits(parse_cap=1 << 20))
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g") as att, \
                client(att, timeout=60) as c:
            async with c.stream("POST", "/v1/chat/completions", json={"model": "big"}) as r:
                async for _ in r.aiter_raw():
                    pass
            meter = att.meter
    finally:
        await gw.close()
    assert meter.unmetered == 1 and "over" in records(tmp_path / "g")[0]["unmetered"]


async def test_an_event_stream_nobody_asked_for_is_still_read(upstream: FakeUpstream,
                                                              tmp_path: Path) -> None:
    """``"stream": 1`` (not true) answered as a stream: read as the stream it is."""
    gw = Gateway()
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g") as att, \
                client(att) as c:
            r = await c.post("/v1/chat/completions",
                             json={"model": "sse", "stream": 1, "messages": []})
            assert r.status_code == 200
            meter = att.meter
    finally:
        await gw.close()
    assert (meter.prompt_tokens, meter.completion_tokens, meter.unmetered) == (3, 1, 0)


# ---------------------------------------------------------------------- bounded


async def test_retry_after_nan_is_not_held_and_never_wedges(upstream: FakeUpstream,
                                                            tmp_path: Path) -> None:
    for hold in (0.0, 10.0):
        gw = Gateway(limits=GatewayLimits(hold_429=hold))
        try:
            async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / f"g{hold}") as att, \
                    client(att) as c:
                r = await asyncio.wait_for(c.post("/v1/chat/completions",
                                                  json={"model": "nanretry"}), 30)
                assert r.status_code == 429  # the harness sees it, at once
                assert "held_429" not in records(tmp_path / f"g{hold}")[0]
        finally:
            await gw.close()


async def test_a_deep_request_body_is_refused_not_a_traceback(upstream: FakeUpstream,
                                                              tmp_path: Path) -> None:
    gw = Gateway()
    deep = b'{"model": "m", "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    try:
        async with gw.attempt("c1", 1, {"max_tokens": 4}, here(upstream), tmp_path / "g") \
                as att, client(att) as c:
            r = await c.post("/v1/chat/completions", content=deep,
                             headers={"Content-Type": "application/json"})
            ok = await c.post("/v1/chat/completions", json={"model": "m", "messages": []})
    finally:
        await gw.close()
    assert r.status_code == 400 and "arm's settings" in r.text
    assert ok.status_code == 200 and upstream.bodies[-1]["max_tokens"] == 4


async def test_a_request_body_that_never_arrives_is_timed_out(upstream: FakeUpstream,
                                                              tmp_path: Path) -> None:
    gw = Gateway(limits=GatewayLimits(body_secs=0.5))
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g") as att:
            reader, writer = await asyncio.open_connection("127.0.0.1", att.port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Authorization: Bearer " + att.key.encode() +
                         b"\r\nContent-Length: 1000\r\n\r\n{")
            await writer.drain()
            head = await asyncio.wait_for(reader.readline(), 30)
            writer.close()
    finally:
        await gw.close()
    assert head.startswith(b"HTTP/1.1 408")
    assert records(tmp_path / "g")[0]["ended_by"] == "gateway"


async def test_headers_a_connection_line_names_are_not_forwarded(upstream: FakeUpstream,
                                                                 tmp_path: Path) -> None:
    gw = Gateway()
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g") as att, \
                client(att) as c:
            await c.post("/v1/chat/completions", json={"model": "m", "messages": []},
                         headers={"Connection": "keep-alive, X-Hop-Secret",
                                  "X-Hop-Secret": "1", "X-Kept": "2"})
    finally:
        await gw.close()
    sent = {k.lower() for k in upstream.headers[0]}
    assert "x-hop-secret" not in sent and "x-kept" in sent and "authorization" not in sent


async def test_a_gzip_request_body_is_forwarded_as_received_or_merged_as_identity(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    body = gzip.compress(json.dumps({"model": "m", "messages": [], "max_tokens": 9}).encode())
    hdrs = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    gw = Gateway()
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g") as att, \
                client(att) as c:
            plain = await c.post("/v1/chat/completions", content=body, headers=hdrs)
        async with gw.attempt("c1", 2, {"max_tokens": 4}, here(upstream), tmp_path / "h") \
                as att, client(att) as c:
            merged = await c.post("/v1/chat/completions", content=body, headers=hdrs)
    finally:
        await gw.close()
    assert plain.status_code == merged.status_code == 200
    assert upstream.raw[0] == body and upstream.headers[0]["Content-Encoding"] == "gzip"
    assert "Content-Encoding" not in upstream.headers[1]
    assert json.loads(upstream.raw[1])["max_tokens"] == 4


# ---------------------------------------------------------------------- complete evidence


async def test_a_harness_hang_up_is_client_closed_and_ends_the_upstream_wait(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    gw = Gateway()
    log = tmp_path / "g"
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), log) as att:
            async with client(att) as c:
                task = asyncio.ensure_future(c.post("/v1/chat/completions",
                                                    json={"model": "slow"}))
                for _ in range(500):
                    if upstream.bodies:
                        break
                    await asyncio.sleep(0.01)
                task.cancel()  # the harness gives up and closes its connection
                with __import__("contextlib").suppress(asyncio.CancelledError):
                    await task
            for _ in range(500):
                if records(log) if log.exists() else []:
                    break
                await asyncio.sleep(0.01)
            meter = att.meter
    finally:
        await gw.close()
    rec = records(log)[0]
    assert (rec["error"], rec["ended_by"]) == ("client_closed", "harness")
    assert meter.errors == {"client_closed": 1} and meter.in_flight == 0


async def test_a_stream_cut_after_its_headers_is_a_cut_the_harness_sees(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    gw = Gateway()
    log = tmp_path / "g"
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), log) as att, client(att) as c:
            with pytest.raises(httpx.HTTPError):  # not a clean end of the stream
                async with c.stream("POST", "/v1/chat/completions",
                                    json={"model": "cut", "stream": True}) as r:
                    async for _ in r.aiter_raw():
                        pass
            meter = att.meter
    finally:
        await gw.close()
    rec = records(log)[0]
    assert (rec["cut"], rec["ended_by"], rec["error"]) == ("endpoint", "endpoint",
                                                           "endpoint_error")
    assert "cut" in rec["unmetered"] and meter.unmetered == 1


async def test_a_request_open_when_the_attempt_ends_is_written_as_cut_by_the_attempt(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    gw = Gateway()
    log = tmp_path / "g"
    c = None
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), log) as att:
            c = client(att)
            task = asyncio.ensure_future(c.post("/v1/chat/completions", json={"model": "slow"}))
            for _ in range(500):
                if upstream.bodies:
                    break
                await asyncio.sleep(0.01)
    finally:
        await gw.close()
        if c is not None:
            task.cancel()
            with __import__("contextlib").suppress(BaseException):
                await task
            await c.aclose()
    rec = records(log)[0]
    assert (rec["cut"], rec["ended_by"]) == ("attempt ended", "attempt")


# ---------------------------------------------------------------------- whole runs


def test_gzipped_spend_is_never_zero_a_budgeted_run_stops_unprovable(tmp_path: Path) -> None:
    """The issue's run: an endpoint that gzips every answer (the harness's client
    decodes it, so the cells pass). Metered as 0 this ran 24 cells past a 300-token
    budget; now the first verdict's unmetered responses stop the launching."""
    from conftest import events, run_cli, write_overlay

    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"think_secs": "0"}, "run": {"concurrency": 1}, "budget": {"tokens": 300},
        "endpoint": {"replica_env": [{"AUTOPILOT_DEMO_GZIP": "1"}]}})
    r = run_cli("--preset", "demo", "--target-n", "2", "--config", str(over),
                "--state-dir", str(state), "--quiet")
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    assert "budget unprovable" in r.stdout.strip().splitlines()[-1]
    evs = events(state)
    verdicts = [e for e in evs if e["event"] == "cell_verdict"]
    assert verdicts and all(v["unmetered"] >= 1 for v in verdicts)
    assert len(verdicts) < 24  # it stopped launching
    assert any(e["event"] == "launching_paused" and "unprovable" in e["why"] for e in evs)
    cell = verdicts[0]["cell"]
    recs = records(next((state / "gateway" / cell).glob("attempt-*.jsonl")))
    assert any("encoded as 'gzip'" in str(x.get("unmetered")) for x in recs)


def test_the_harness_gets_its_key_and_the_grader_neither_key_nor_run_token(
        tmp_path: Path) -> None:
    from conftest import ROOT, events, run_cli, write_overlay

    from autopilot.cell.procs import existing_run_token

    state = tmp_path / "state"
    import tomllib

    demo = tomllib.loads((ROOT / "presets" / "demo.toml").read_text())
    dump = 'env > "$1/$2-env.txt"; shift 2; exec "$@"'
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "vars": {"think_secs": "0"},
        "harness": {"argv": ["/bin/sh", "-c", dump, "sh", "{output_dir}", "harness",
                             *demo["harness"]["argv"]], "env": {"MY_KEY": "{api_key}"}},
        "grader": {"argv": ["/bin/sh", "-c", dump, "sh", "{output_dir}", "grader",
                            *demo["grader"]["argv"]]}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    v = next(e for e in events(state) if e["event"] == "cell_verdict")
    assert v["verdict"] in ("PASS", "FAIL")
    out = state / "cells" / v["cell"]
    harness = dict(line.split("=", 1) for line in (out / "harness-env.txt").read_text()
                   .splitlines() if "=" in line)
    grader = (out / "grader-env.txt").read_text()
    token = existing_run_token(state)
    assert token and harness["AUTOPILOT_RUN_TOKEN"] == token
    assert harness["OPENAI_API_KEY"].startswith("sk-autopilot-")
    assert harness["MY_KEY"] == harness["OPENAI_API_KEY"]
    assert token not in grader and "sk-autopilot-" not in grader
    assert "AUTOPILOT_RUN_TOKEN=g" in grader  # a marker a sweep knows, not the token
    m = next(e for e in events(state) if e["event"] == "cell_metered")
    assert m["requests"] >= 1 and m["unauthorized"] == 0  # the demo harness sent its key
    assert harness["OPENAI_API_KEY"] not in (state / "autopilot.log").read_text()


def test_the_attempt_key_in_an_argv_is_a_config_error(tmp_path: Path) -> None:
    from conftest import run_cli, write_overlay

    over = write_overlay(tmp_path / "o.json", {
        "harness": {"argv": ["{python}", "-c", "pass", "--key", "{api_key}"]}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(tmp_path / "s"), "--dry-run")
    assert r.returncode == 2
    assert "harness.argv" in r.stderr and "{api_key}" in r.stderr
    assert not (tmp_path / "s").exists()


def test_a_model_graded_grader_gets_its_own_metered_credential(tmp_path: Path) -> None:
    """``[grader] model_access``: the grader reaches the model through a listener of the
    grading's own, with a key of its own (the harness's key is dead by then), and what
    it spends is journaled as grading, on its own line."""
    import tomllib

    from conftest import ROOT, events, run_cli, write_overlay

    demo = tomllib.loads((ROOT / "presets" / "demo.toml").read_text())
    judge = ("import json, os, sys, urllib.request\n"
             "req = urllib.request.Request(sys.argv[1] + '/chat/completions', data=json.dumps("
             "{'model': sys.argv[2], 'messages': [{'role': 'user', 'content': 'grade'}]})"
             ".encode(), headers={'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'],"
             " 'Content-Type': 'application/json'})\n"
             # read to its end, as a grader does (one that hangs up early is metered
             # as spend of unknown size: unmetered, not a count of zero)
             "with urllib.request.urlopen(req, timeout=30) as resp:\n"
             "    assert resp.status == 200 and json.loads(resp.read())['usage']\n"
             "os.execv(sys.executable, [sys.executable, *sys.argv[3:]])\n")
    state = tmp_path / "state"
    (tmp_path / "judge.py").write_text(judge)
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "vars": {"think_secs": "0"}, "trust": {"infra_retries": 0},
        "grader": {"model_access": True,
                   "argv": ["{python}", str(tmp_path / "judge.py"), "{base_url}", "{model}",
                            *demo["grader"]["argv"][1:]]}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    evs = events(state)
    v = next(e for e in evs if e["event"] == "cell_verdict")
    assert v["verdict"] in ("PASS", "FAIL"), v
    graded = [e for e in evs if e["event"] == "cell_grade_metered"]
    assert len(graded) == 1 and graded[0]["requests"] == 1 and graded[0]["unauthorized"] == 0
    assert graded[0]["completion_tokens"] > 0
    cell = next(e for e in evs if e["event"] == "cell_metered")
    assert cell["requests"] >= 1  # the harness's, apart from the grading's
    assert (state / "gateway" / v["cell"] / "grade-1.jsonl").exists()
    spend = json.loads((state / "status.json").read_text())["spend"]
    assert spend["grading"]["completion_tokens"] == graded[0]["completion_tokens"]


# ---------------------------------------------------------------------- what held


async def _raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(4096), 30)
    finally:
        writer.close()


async def test_no_request_line_or_header_reaches_another_host(upstream: FakeUpstream,
                                                              tmp_path: Path) -> None:
    evil = FakeUpstream()
    await evil.start()
    gw = Gateway()
    e = f"127.0.0.1:{evil.port}"
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g") as att:
            auth = f"Authorization: Bearer {att.key}\r\n".encode()
            chat = b'{"model": "m", "messages": []}'
            for line in (f"POST http://{e}/v1/chat/completions HTTP/1.1",
                         f"POST //{e}/v1/chat/completions HTTP/1.1",
                         f"POST /%40{e}/v1/chat/completions HTTP/1.1",
                         f"POST /v1/../../{e}/v1/chat/completions HTTP/1.1",
                         f"CONNECT {e} HTTP/1.1"):
                await _raw(att.port, line.encode() + f"\r\nHost: {e}\r\n".encode() + auth
                           + f"Content-Length: {len(chat)}\r\n\r\n".encode() + chat)
    finally:
        await gw.close()
        await evil.close()
    assert evil.bodies == [] and evil.headers == []


@pytest.mark.parametrize("bad", [
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nX-B: a\rb\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n{}",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Content-Length: 3\r\n\r\n{}",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n",
])
async def test_malformed_http_is_400_and_forwards_nothing(upstream: FakeUpstream,
                                                          tmp_path: Path, bad: bytes) -> None:
    gw = Gateway()
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g") as att:
            got = await _raw(att.port, bad)
    finally:
        await gw.close()
    assert got.startswith(b"HTTP/1.") and got.split(b" ", 2)[1] in (b"400", b"431"), got[:80]
    assert upstream.bodies == []


async def test_an_oversized_body_is_413_and_a_gzip_bomb_passes_uninflated(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    import zlib

    gw = Gateway(limits=GatewayLimits(max_request=8 << 20))
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = comp.compress(b"\0" * (256 << 20)) + comp.flush()  # 256 MB inflated, ~250 KB
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g") as att, \
                client(att, timeout=60) as c:
            big = await c.post("/v1/chat/completions", content=b" " * (9 << 20))
            through = await c.post("/v1/chat/completions", content=bomb, headers={
                "Content-Type": "application/json", "Content-Encoding": "gzip"})
    finally:
        await gw.close()
    assert big.status_code == 413
    assert upstream.raw == [bomb]  # forwarded as received, never inflated here
    assert through.status_code == 400  # the fake's own refusal of what it inflated


@pytest.mark.parametrize("header", [b"Authorization: Bearer \xff\xfe\x80", b"x-api-key: \xc3\x28",
                                    b"x-goog-api-key: \xed\xa0\x80"])
async def test_a_key_that_is_no_text_is_a_401_counted_never_a_500(
        upstream: FakeUpstream, tmp_path: Path, header: bytes) -> None:
    gw = Gateway()
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g") as att:
            got = await _raw(att.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                             + header + b"\r\nContent-Length: 2\r\n\r\n{}")
            meter = att.meter
    finally:
        await gw.close()
    assert got.split(b" ", 2)[1] == b"401", got[:120]
    assert meter.unauthorized == 1 and meter.requests == 0 and upstream.bodies == []


async def test_an_expectation_never_met_is_not_unmetered_and_expect_stays_here(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    """``Expect: 100-continue`` then no body: the request never reached the endpoint, so
    nothing was spent on it (not unmetered); with a body, the endpoint gets no Expect."""
    gw = Gateway()
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g") as att:
            reader, writer = await asyncio.open_connection("127.0.0.1", att.port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: "
                         b"Bearer " + att.key.encode() + b"\r\nExpect: 100-continue\r\n"
                         b"Content-Length: 40\r\nContent-Type: application/json\r\n\r\n")
            await writer.drain()
            assert (await asyncio.wait_for(reader.readline(), 30)).startswith(
                b"HTTP/1.1 100")
            writer.close()
            for _ in range(600):  # the server sees the hang-up (observable state, bounded)
                if att.meter.requests == 1 and att.meter.in_flight == 0:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the abandoned request never ended")
            async with client(att) as c:
                r = await c.post("/v1/chat/completions", headers={"Expect": "100-continue"},
                                 json={"model": "fake", "messages": []})
            meter = att.meter
    finally:
        await gw.close()
    assert r.status_code == 200
    assert meter.unmetered == 0 and len(upstream.bodies) == 1
    assert "Expect" not in upstream.headers[0] and "expect" not in {
        k.lower() for k in upstream.headers[0]}
