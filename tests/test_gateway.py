"""The model gateway (issue #26): requests pass through with the arm's settings merged
in, streams arrive as the same chunks, every request leaves evidence, and a hostile
upstream costs bounded memory and never blocks. Real HTTP on 127.0.0.1 throughout: the
upstream is a FAKE shaped from the OpenAI protocol (tests/gateway_fake.py); the end-to-end
tests below drive the demo's simulator and the real llama-server."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_fake import FakeUpstream, client, here, records

from autopilot.gateway.dialects import CHAT
from autopilot.gateway.evidence import StreamScan, Usage, error_kind, merge
from autopilot.gateway.proxy import Gateway, GatewayLimits
from autopilot.state.tokens import Tokens

# ---------------------------------------------------------------------- the rules


def test_merge_is_deep_and_the_arm_wins() -> None:
    body = {"model": "m", "max_tokens": 100,
            "chat_template_kwargs": {"enable_thinking": True, "keep": 1}}
    arm = {"max_tokens": 4, "chat_template_kwargs": {"enable_thinking": False},
           "reasoning_effort": "low"}
    got = merge(body, arm)
    assert got == {"model": "m", "max_tokens": 4, "reasoning_effort": "low",
                   "chat_template_kwargs": {"enable_thinking": False, "keep": 1}}
    assert body["chat_template_kwargs"]["enable_thinking"] is True  # not mutated
    assert merge(["not", "an", "object"], arm) == ["not", "an", "object"]


@pytest.mark.parametrize(("status", "text", "kind"), [
    (200, "", None),
    (None, "", "endpoint_error"),  # refused, reset, timed out
    (503, "Loading model", "endpoint_error"),
    (429, "", "throttled"),
    (400, "This model's maximum context length is 65536 tokens. However, you requested",
     "context_overflow"),
    (400, "the request exceeds the available context size, try increasing it",
     "context_overflow"),  # llama-server's words (older builds)
    (400, '{"error":{"code":400,"message":"request (624 tokens) exceeds the available '
     'context size (256 tokens), try increasing it","type":"exceed_context_size_error",'
     '"n_prompt_tokens":624,"n_ctx":256}}', "context_overflow"),  # b11434, as measured
    (400, "missing field messages", "request_error"),
    (404, "not found", "request_error"),
])
def test_error_kinds(status: int | None, text: str, kind: str | None) -> None:
    assert error_kind(status, text) == kind


@pytest.mark.parametrize(("usage", "want"), [
    ({"prompt_tokens": 3, "completion_tokens": 5}, Usage(Tokens(input=3, output=5))),
    ({"prompt_tokens": 10**401, "completion_tokens": -5}, Usage(Tokens(), True)),
    ({"prompt_tokens": "3", "completion_tokens": True}, Usage(Tokens(), True)),
    ({"completion_tokens": 2, "completion_tokens_details": {"reasoning_tokens": 1}},
     Usage(Tokens(output=2, reasoning=1))),
    ({"prompt_tokens": 10, "completion_tokens": 2,
      "prompt_tokens_details": {"cached_tokens": 6}},
     Usage(Tokens(input=4, cache_read=6, output=2))),
])
def test_usage_is_shape_checked(usage: dict[str, Any], want: Usage) -> None:
    assert CHAT.usage({"usage": usage}) == want
    assert CHAT.usage({"usage": "lots"}) is None and CHAT.usage([1]) is None


def test_the_stream_scan_reads_lines_split_anywhere_and_drops_an_endless_one() -> None:
    stream = (b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
              b'data: {"choices":[{"delta":{"content":"b"},"finish_reason":"stop"}],'
              b'"usage":{"prompt_tokens":2,"completion_tokens":2}}\n\ndata: [DONE]\n\n')
    for size in (1, 3, 7, len(stream)):
        scan = StreamScan()
        for i in range(0, len(stream), size):
            scan.feed(stream[i:i + size])
        assert (scan.chunks, scan.finish, scan.usage) == (
            2, "stop", Usage(Tokens(input=2, output=2)))
    scan = StreamScan()
    for _ in range(40):
        scan.feed(b"x" * 65536)  # 2.5 MB without a newline: not held
    assert len(scan._partial) <= 1 << 20
    scan.feed(b'\ndata: {"choices":[{"delta":{"content":"c"}}]}\n')
    assert scan.chunks == 1  # the long line was skipped, the next one read


# ---------------------------------------------------------------------- the proxy


async def test_requests_carry_the_arm_settings_and_leave_evidence(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    gw = Gateway()
    log = tmp_path / "gw.jsonl"
    arm = {"max_tokens": 4, "chat_template_kwargs": {"enable_thinking": False}}
    try:
        async with gw.attempt("c1", 1, arm, here(upstream), log) as att, \
                client(att) as c:
            r = await c.post("/v1/chat/completions",
                             json={"model": "fake", "max_tokens": 100,
                                   "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
            health = await c.get("/health")
            assert health.status_code == 200 and health.text == "ok"  # passed unchanged
            models = await c.get("/v1/models")
            assert models.json()["data"][0]["id"] == "fake"
            assert att.meter.in_flight == 0
            summary = att.meter.summary()
    finally:
        await gw.close()
    sent = upstream.bodies[0]
    assert sent["max_tokens"] == 4 and sent["chat_template_kwargs"] == {"enable_thinking": False}
    assert "Authorization" not in upstream.headers[0]  # the attempt's key stays here
    assert summary["requests"] == 3 and summary["completion_tokens"] == 4
    assert summary["prompt_tokens"] == 7 and summary["reasoning_tokens"] == 2
    recs = records(log)
    assert [r["route"] for r in recs] == ["/v1/chat/completions", "/health", "/v1/models"]
    assert recs[0]["applied"] == arm and recs[0]["status"] == 200
    assert recs[0]["completion_tokens"] == 4 and recs[0]["finish_reason"] == "stop"
    assert recs[0]["latency_ms"] >= recs[0]["ttfb_ms"] > 0


async def test_a_stream_arrives_as_the_same_chunks_as_direct(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    req = {"model": "fake", "stream": True, "max_tokens": 6, "messages": []}

    async def events(base: str, key: str = "") -> list[str]:
        async with httpx.AsyncClient(base_url=base, headers={
                "Authorization": f"Bearer {key}"} if key else {}) as c, \
                c.stream("POST", "/v1/chat/completions", json=req) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            return [line async for line in r.aiter_lines() if line]

    direct = await events(upstream.origin)
    gw = Gateway()
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g") as att:
            through = await events(f"http://127.0.0.1:{att.port}", att.key)
            meter = att.meter
    finally:
        await gw.close()
    assert through == direct and len(direct) == 8  # 6 deltas, the usage chunk, [DONE]
    assert meter.completion_tokens == 6 and meter.estimated == 0
    assert records(tmp_path / "g")[0]["chunks"] == 6


async def test_a_hostile_upstream_costs_bounded_memory_and_an_error_record(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    gw = Gateway(limits=GatewayLimits(parse_cap=1 << 20))
    log = tmp_path / "g"
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), log) as att, \
                client(att, timeout=60) as c:
            tracemalloc.start()
            got = 0
            async with c.stream("POST", "/v1/chat/completions", json={"model": "big"}) as r:
                async for chunk in r.aiter_raw():
                    got += len(chunk)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert got == 100 << 20  # passed through whole
            assert peak < 40 << 20, f"peak {peak >> 20} MB for a 100 MB body"
            for model in ("badjson", "hugeusage", "throttle", "overflow"):
                await c.post("/v1/chat/completions", json={"model": model})
            meter = att.meter
    finally:
        await gw.close()
    recs = {r.get("model"): r for r in records(log)}
    assert "body over" in recs["big"]["unparsed"]
    assert recs["badjson"]["status"] == 200 and "completion_tokens" not in recs["badjson"]
    assert recs["hugeusage"]["malformed_usage"] is True
    assert recs["hugeusage"]["prompt_tokens"] is None
    assert recs["throttle"]["error"] == "throttled" and recs["throttle"]["retry_after"] == "2"
    assert recs["overflow"]["error"] == "context_overflow"
    assert "maximum context length" in recs["overflow"]["body"]
    assert meter.errors == {"throttled": 1, "context_overflow": 1}
    assert meter.malformed_usage == 1 and meter.completion_tokens == 0


async def test_a_body_that_never_ends_is_cut_when_the_attempt_ends(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    gw = Gateway()
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g") as att, \
                client(att) as c:
            async with c.stream("POST", "/v1/chat/completions",
                                json={"model": "forever"}) as r:
                seen = 0
                async for chunk in r.aiter_raw():
                    seen += len(chunk)
                    if seen > 2000:
                        break
            meter = att.meter
            progress = meter.progress
            assert progress > 10  # each chunk moved the cell's progress counter
    finally:
        await gw.close()
    assert meter.in_flight == 0  # the handler ended with the attempt, nothing hangs


async def test_an_endpoint_that_is_down_is_an_endpoint_error(tmp_path: Path) -> None:
    gw = Gateway()
    dead = FakeUpstream()
    await dead.start()
    origin = dead.origin
    await dead.close()  # the port is closed now: connection refused
    try:
        async with gw.attempt("c1", 1, {}, lambda: [("0", origin)], tmp_path / "g") as att, \
                client(att) as c:
            r = await c.post("/v1/chat/completions", json={"model": "fake"})
            meter = att.meter
    finally:
        await gw.close()
    assert r.status_code == 502 and "did not answer" in r.json()["error"]["message"]
    assert meter.errors == {"endpoint_error": 1}
    assert records(tmp_path / "g")[0]["error"] == "endpoint_error"


async def test_a_429_burst_is_absorbed_as_throttling(upstream: FakeUpstream,
                                                     tmp_path: Path) -> None:
    throttled: list[int] = []
    gw = Gateway(limits=GatewayLimits(hold_429=5), on_throttled=lambda: throttled.append(1))
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), tmp_path / "g") as att, \
                client(att) as c:
            r = await c.post("/v1/chat/completions", json={"model": "burst"})
            meter = att.meter
    finally:
        await gw.close()
    assert r.status_code == 200  # the harness never saw the 429s
    assert len(throttled) == 2 and upstream.burst == 3  # the launch throttle heard both
    assert meter.errors == {"throttled": 2} and meter.completion_tokens == 5
    assert records(tmp_path / "g")[0]["held_429"] == 2
    # without a hold the harness gets the 429 itself (and the throttle still hears it)
    gw = Gateway(on_throttled=lambda: throttled.append(1))
    upstream.burst = 0
    try:
        async with gw.attempt("c1", 2, {}, here(upstream), tmp_path / "h") as att, \
                client(att) as c:
            r = await c.post("/v1/chat/completions", json={"model": "burst"})
    finally:
        await gw.close()
    assert r.status_code == 429 and r.headers["Retry-After"] == "0.05"
    assert len(throttled) == 3


# ---------------------------------------------------------------------- in a run


def test_the_run_counts_the_gateways_tokens_and_flags_a_harness_that_under_reports(
        tmp_path: Path) -> None:
    from conftest import ROOT, events, run_cli, write_overlay

    adv = str(ROOT / "tests" / "adversaries" / "work_or_freeze.py")
    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix", "vars": {"behave": "underreport"}},
                  {"id": "p2_extract", "vars": {"behave": "work"}},
                  {"id": "p3_doc", "vars": {"behave": "bypass"}}],
        "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "harness": {"argv": ["{python}", adv, "{behave}", "{host}", "{port}", "{output_dir}",
                             "{transcript}", "{endpoint_port}"]},
        "gateway": {"require_metering": True}, "trust": {"infra_retries": 0},
        "run": {"concurrency": 3}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state), "--quiet")
    assert r.returncode == 1, r.stderr[-2000:]  # the unmetered cell is quarantined
    evs = events(state)
    v = {e["cell"].split("_demo")[0]: e for e in evs if e["event"] == "cell_verdict"}
    metered = {e["cell"].split("_demo")[0]: e for e in evs if e["event"] == "cell_metered"}
    # the under-reporter: its verdict stands, its tokens are the gateway's, and flagged
    under = v["p1_bugfix"]
    assert under["verdict"] in ("PASS", "FAIL")
    assert under["cost_basis"] == "self_reported_mismatch"
    assert under["spend"][1] == metered["p1_bugfix"]["completion_tokens"]
    assert under["self_reported"][1] == metered["p1_bugfix"]["completion_tokens"] // 2
    assert v["p2_extract"]["cost_basis"] == "metered"
    assert v["p2_extract"]["gateway"] == {"requests": 4, "errors": {}}
    # the harness that went around the gateway: outputs, but no evidence we saw
    assert (v["p3_doc"]["verdict"], v["p3_doc"]["reason"]) == ("INVALID", "unmetered")
    assert metered["p3_doc"]["requests"] == 0
    status = json.loads((state / "status.json").read_text())
    assert status["trust"]["cost_mismatch_cells"] == 1
    assert status["trust"]["metered_cells"] == 2
    rep = run_cli("report", "--state-dir", str(state))
    assert "tokens metered by the gateway: 2 of 2 valid cells; the harness's own count " \
        "disagrees on 1" in rep.stdout
    import re

    # per task, the gateway's tokens and the journal's wall time (summarize.sh's columns)
    assert re.search(r"\| p2_extract \| demo-nothink \| [01]/1 \| \d+ \| \d+\.\d \|", rep.stdout)
    assert "the gateway's metered counts (2 of 3 cells" in " ".join(rep.stdout.split())
    assert "model requests that failed, by kind (the gateway's record, every attempt): none" \
        in rep.stdout
    grid = run_cli("--state-dir", str(state), "--no-color", "--no-events", prog="dashboard")
    assert "tokens: harness disagrees with the gateway on 1" in " ".join(grid.stdout.split())
    # spend: the gateway's count where it saw the work, the harness's word where not
    assert v["p3_doc"]["cost_basis"] == "self_reported"
    assert status["spend"]["completion_tokens"] == (
        metered["p1_bugfix"]["completion_tokens"] + metered["p2_extract"]["completion_tokens"]
        + v["p3_doc"]["spend"][1])


async def test_a_dead_replica_costs_a_request_a_second_try_not_the_cell(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    dead = FakeUpstream()
    await dead.start()
    gone = dead.origin
    await dead.close()  # replica 0 died: its port refuses
    seen: list[tuple[Any, ...]] = []
    gw = Gateway(on_failover=lambda *a: seen.append(a))
    order = [("0", gone), ("1", upstream.origin)]
    try:
        async with gw.attempt("c1", 1, {}, lambda: order, tmp_path / "g") as att, \
                client(att) as c:
            first = await c.post("/v1/chat/completions", json={"model": "fake"})
            order[0] = ("0", "")  # now its keeper knows: it is skipped at once
            second = await c.post("/v1/chat/completions", json={"model": "fake"})
            meter = att.meter
    finally:
        await gw.close()
    assert first.status_code == second.status_code == 200
    assert [(a[0], a[1], a[2], a[3]) for a in seen] == [("c1", 1, "0", "1")] * 2
    assert "Connect" in seen[0][4] and seen[1][4] == "replica down"
    recs = records(tmp_path / "g")
    assert [r["replica"] for r in recs] == ["1", "1"]
    assert recs[0]["failover"][0]["from"] == "0" and meter.failovers == 2
    assert meter.errors == {}  # served: not an error of the cell's


def test_a_providers_key_stays_in_the_supervisor_and_429s_are_absorbed(
        tmp_path: Path) -> None:
    import re

    from conftest import ROOT, cli_env, events, run_cli
    from provider_fake import FakeProvider

    secret = "sk-REAL-provider-key-5e1f"
    # The fake provider demands the real key and throttles every 3rd request for 0.3 s.
    fake = FakeProvider(secret, args=("--throttle-every", "3", "--throttle-secs", "0.3"))
    state = tmp_path / "state"
    dump = ("mkdir -p \"$1\"; env > \"$1/env.txt\"; shift; exec \"$@\"")
    try:
        import tomllib

        preset = tomllib.loads((ROOT / "tests" / "presets" / "fake-provider.toml").read_text())
        over = fake.overlay(tmp_path / "o.json",
                            harness={"argv": ["/bin/sh", "-c", dump, "sh", "{output_dir}",
                                              *preset["harness"]["argv"]]},
                            gateway={"hold_429_secs": 10})
        r = run_cli("--preset", str(ROOT / "tests" / "presets" / "fake-provider.toml"),
                    "--config", str(over), "--state-dir", str(state), "--quiet",
                    env=cli_env(FAKE_PROVIDER_KEY=secret))
    finally:
        fake.close()
    assert r.returncode == 0, r.stderr[-2000:]
    evs = events(state)
    cells = [d for d in (state / "cells").iterdir() if d.is_dir()]
    assert len(cells) == 2
    keys = set()
    for d in cells:
        env = (d / "env.txt").read_text()
        assert secret not in env and "AUTOPILOT_RUN_TOKEN" in env
        got = re.findall(r"^FAKE_PROVIDER_KEY=(sk-autopilot-[0-9a-f]{32})$", env, re.M)
        assert got and f"OPENAI_API_KEY={got[0]}" in env  # one key, both variables
        keys.add(got[0])
    assert len(keys) == 2  # one per attempt, not one per run
    assert not any(k in (state / "autopilot.log").read_text() for k in keys)
    starts = [e for e in evs if e["event"] == "cell_spawning"]
    assert starts and all(secret not in json.dumps(e) for e in evs)
    metered = [e for e in evs if e["event"] == "cell_metered"]
    assert sum(m["errors"].get("throttled", 0) for m in metered) >= 1  # absorbed here
    assert all(m["requests"] > 0 for m in metered)
    verdicts = [e for e in evs if e["event"] == "cell_verdict"]
    assert all(v["verdict"] in ("PASS", "FAIL") for v in verdicts)  # none rate_limited
    assert any(e["event"] == "launch_throttled" for e in evs)


def test_a_model_that_runs_out_of_time_is_its_fail_in_every_view(tmp_path: Path) -> None:
    """Killed at its deadline while the endpoint answered every request: FAIL (timed
    out), counted against the model — by the run, by validate and in the report."""
    from conftest import events, run_cli, write_overlay

    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "vars": {"think_secs": "30"}, "trust": {"infra_retries": 0},
        "harness": {"wall_budget_secs": 1},
        "watchdog": {"deadline_overhead_secs": 1, "stuck_secs": 60, "warn_secs": 50,
                     "probe_secs": 55, "kill_secs": 58}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    v = next(e for e in events(state) if e["event"] == "cell_verdict")
    assert (v["verdict"], v["caveat"]) == ("FAIL", "timed out")
    assert any(e["event"] == "cell_killed" and e["kind"] == "deadline" for e in events(state))
    val = run_cli("validate", "--state-dir", str(state))
    assert val.returncode == 0 and "FAIL=1" in val.stdout, val.stdout
    rep = run_cli("report", "--state-dir", str(state)).stdout
    assert "timed out (1 cells)" in rep


def test_a_first_answer_longer_than_the_deadline_is_the_models_fail(tmp_path: Path) -> None:
    """The endpoint takes longer over the first answer than the cell's deadline: nothing
    came back, yet the endpoint had the request all along (the gateway's in-flight
    count at the kill): FAIL (timed out), not INVALID(deadline) retried to quarantine."""
    from conftest import events, run_cli, write_overlay

    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "vars": {"think_secs": "0"}, "trust": {"infra_retries": 0},
        "endpoint": {"latency_secs": 30}, "harness": {"wall_budget_secs": 1},
        "watchdog": {"deadline_overhead_secs": 1, "stuck_secs": 60, "warn_secs": 50,
                     "probe_secs": 55, "kill_secs": 58}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state), "--quiet")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    evs = events(state)
    metered = next(e for e in evs if e["event"] == "cell_metered")
    assert metered["requests"] >= 1 and metered["answered"] == 0  # no answer ever came
    exited = next(e for e in evs if e["event"] == "cell_exited")
    assert exited["outcome"]["killed"] == "deadline" and exited["outcome"]["working"] is True
    v = next(e for e in evs if e["event"] == "cell_verdict")
    assert (v["verdict"], v["caveat"]) == ("FAIL", "timed out")
    val = run_cli("validate", "--state-dir", str(state))
    assert val.returncode == 0 and "FAIL=1" in val.stdout, val.stdout
    assert "timed out (1 cells)" in run_cli("report", "--state-dir", str(state)).stdout


async def test_the_provider_key_is_added_only_to_the_attempts_own_allowed_requests(
        upstream: FakeUpstream, tmp_path: Path) -> None:
    gw = Gateway()
    gw.key = lambda: "REAL"
    log = tmp_path / "g"
    try:
        async with gw.attempt("c1", 1, {}, here(upstream), log, model="fake") as att, \
                gw.attempt("c2", 1, {}, here(upstream), tmp_path / "h", model="fake") as sib, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{att.port}") as c:
            chat = {"model": "fake", "messages": []}
            stranger = await c.post("/v1/chat/completions", json=chat,
                                    headers={"Authorization": "Bearer guess"})
            bare = await c.post("/v1/chat/completions", json=chat)
            sibling = await c.post("/v1/chat/completions", json=chat,
                                   headers={"Authorization": f"Bearer {sib.key}"})
            mine = {"Authorization": f"Bearer {att.key}"}
            ours = await c.post("/v1/chat/completions", json=chat, headers=mine)
            as_x_api_key = await c.post("/v1/chat/completions", json=chat,
                                        headers={"x-api-key": att.key})
            files = await c.get("/v1/files", headers=mine)
            admin = await c.delete("/v1/organization/admin_api_keys/k1", headers=mine)
            tune = await c.post("/v1/fine_tuning/jobs", json={"model": "fake"}, headers=mine)
            other = await c.post("/v1/chat/completions", headers=mine,
                                 json={"model": "gpt-big", "messages": []})
            meter = att.meter
    finally:
        await gw.close()
    assert stranger.status_code == bare.status_code == sibling.status_code == 401
    assert ours.status_code == as_x_api_key.status_code == 200
    assert files.status_code == admin.status_code == tune.status_code == 403
    assert other.status_code == 403 and "not the arm's model" in other.text
    assert len(upstream.headers) == 2  # only the two allowed ones went upstream
    assert all(h["Authorization"] == "Bearer REAL" for h in upstream.headers)
    assert all("x-api-key" not in {k.lower() for k in h} for h in upstream.headers)
    # the refused strangers count for nothing; the harness's own refusals are evidence
    assert meter.unauthorized == 3 and meter.requests == 2 + 4 and meter.refused == 4
    recs = records(log)
    assert len(recs) == 6 and sum(1 for r in recs if r.get("status") == 403) == 4
    assert all(r.get("ended_by") == "gateway" for r in recs if r.get("status") == 403)


@pytest.mark.parametrize(("doc", "want"), [
    ({"model": "qwen3.6-27b"}, "qwen3.6-27b"),
    ({"model": "org/Model-7B:q4_k_m"}, "org/Model-7B:q4_k_m"),
    ({"model": "x" * 201}, None),
    ({"model": "a\x1b[2Jb"}, None),  # a terminal escape is not a model name
    ({"model": 7}, None),
    ([], None),
])
def test_the_model_a_response_names_is_shape_checked(doc: Any, want: str | None) -> None:
    model_of = CHAT.model

    assert model_of(doc) == want


@pytest.mark.parametrize(("models", "verdict", "reason"), [
    ({"m": 3}, "PASS", None),
    ({}, "PASS", None),  # a server that names no model proves nothing
    ({"m": 2, "other-7b": 1}, "INVALID", "arm_mismatch"),
])
def test_a_response_from_another_model_is_not_this_models_verdict(
        models: dict[str, int], verdict: str, reason: str | None) -> None:
    from autopilot.cell.validity import Classification, served_as

    c = served_as(Classification("PASS", word="PASS"), models, "m")
    assert (c.verdict, c.reason) == (verdict, reason)


def test_the_endpoints_own_word_on_the_model_is_checked_not_the_receipt(
        tmp_path: Path) -> None:
    """The harness's receipt says the model it was told to use; the responses say who
    answered. An endpoint that lists the served name but answers as another model
    (a router gone wrong) makes every verdict INVALID(arm_mismatch), through the gateway."""
    from conftest import events, run_cli, write_overlay

    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}], "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "vars": {"think_secs": "0"}, "trust": {"infra_retries": 0},
        "endpoint": {"replica_env": [{"AUTOPILOT_DEMO_ANSWER_AS": "someone-else-7b"}]}})
    r = run_cli("--preset", "demo", "--target-n", "1", "--config", str(over),
                "--state-dir", str(state), "--quiet")
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    evs = events(state)
    v = next(e for e in evs if e["event"] == "cell_verdict")
    assert (v["verdict"], v["reason"]) == ("INVALID", "arm_mismatch")
    assert "'someone-else-7b' (the endpoint's own word" in v["detail"]
    m = next(e for e in evs if e["event"] == "cell_metered")
    assert m["models"] == {"someone-else-7b": m["answered"]}
    receipt = json.loads((state / "cells" / v["cell"] / "receipt.json").read_text())
    assert "someone-else-7b" not in json.dumps(receipt)  # the receipt could not tell


def test_a_request_record_writes_what_was_seen_and_keeps_reported_nulls() -> None:
    """The record is typed as the stages build it, and written field by field as seen:
    reported usage keeps a count it lacked as null (reported without it, not 0), a
    response without usage writes no counts, and a false stream is still written."""
    from autopilot.gateway.record import Failover, Record

    rec = Record(1.5, "POST", "/v1/chat/completions", dialect="chat", stream=False)
    rec.usage = Usage(Tokens(output=7))
    rec.failover.append(Failover("a", "b", "refused"))
    out = rec.as_json()
    assert out["stream"] is False and out["completion_tokens"] == 7
    assert "prompt_tokens" in out and out["prompt_tokens"] is None
    assert out["failover"] == [{"from": "a", "to": "b", "why": "refused"}]
    assert "held_429" not in out and "client_closed" not in out and "error" not in out

    bare = Record(2.0, "GET", "/v1/models")
    assert bare.as_json() == {"ts": 2.0, "method": "GET", "route": "/v1/models"}
    bare.estimate = 3
    assert bare.as_json()["completion_tokens"] == 3 and bare.as_json()["estimated"] is True
    assert not bare.reached_upstream()
    bare.replica, bare.status = "r0", 200
    assert bare.reached_upstream()
    bare.status = 503
    assert not bare.reached_upstream()
