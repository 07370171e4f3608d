"""The gateway's dialects (issue #43): OpenAI chat and Responses, Anthropic Messages and
Google generateContent, each as its vendor documents it. Real HTTP on 127.0.0.1: the
gateway in this process, each vendor a FAKE in a child of its own shaped from its public
protocol (autopilot/demo/vendor.py). For each dialect, streamed and not: the meter by
bucket equals what the vendor billed, request by request; the attempt's key admits the
harness in the header that dialect's clients send and never goes upstream, the real key
goes in the vendor's own header; the arm's settings arrive in the dialect's own field; a
429/529 storm is throttling, never the model's answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_fake import records
from vendors import Vendor

from autopilot.config import Rate
from autopilot.gateway.dialects import GEMINI, MESSAGES, RESPONSES, route_of
from autopilot.gateway.evidence import StreamScan, error_kind
from autopilot.gateway.proxy import Gateway
from autopilot.state.pricing import price
from autopilot.state.tokens import Tokens

REAL = "sk-real-provider-key-0123456789"

# Where each dialect's clients put their key (the harness side).
CLIENT_KEY = {"chat": lambda k: {"Authorization": f"Bearer {k}"},
              "responses": lambda k: {"Authorization": f"Bearer {k}"},
              "messages": lambda k: {"x-api-key": k, "anthropic-version": "2023-06-01"},
              "gemini": lambda k: {"x-goog-api-key": k}}
# The arm's setting for each dialect, in that dialect's own field.
SETTINGS = {"chat": {"reasoning_effort": "low"},
            "responses": {"reasoning": {"effort": "low"}},
            "messages": {"thinking": {"type": "enabled", "budget_tokens": 1024}},
            "gemini": {"generationConfig": {"thinkingConfig": {"thinkingBudget": 512}}}}


def request(dialect: str, stream: bool) -> tuple[str, dict[str, Any]]:
    """(path, body) of one generation request as the dialect's clients send it."""
    if dialect == "gemini":
        verb = "streamGenerateContent?alt=sse" if stream else "generateContent"
        return (f"/v1beta/models/gemini-x:{verb}",
                {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    if dialect == "messages":
        return "/v1/messages", {"model": "fake-model", "max_tokens": 64, "stream": stream,
                                "messages": [{"role": "user", "content": "hi"}]}
    if dialect == "responses":
        return "/v1/responses", {"model": "fake-model", "input": "hi", "stream": stream}
    return "/v1/chat/completions", {"model": "fake-model", "stream": stream,
                                    "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def vendors(tmp_path: Path) -> Iterator[dict[str, Vendor]]:
    started: dict[str, Vendor] = {}
    try:
        for d in ("chat", "responses", "messages", "gemini"):
            started[d] = Vendor(tmp_path, d, REAL, "fake-model,gemini-x")
        yield started
    finally:
        for v in started.values():
            v.close()


async def drive(v: Vendor, tmp_path: Path, n: int, *, refuse: bool = False,
                query_key: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                  list[httpx.Response]]:
    """n requests (alternately streamed and not) through one attempt's listener."""
    gw = Gateway()
    gw.key = lambda: REAL
    log = tmp_path / f"gw-{v.dialect}.jsonl"
    answers = []
    try:
        async with gw.attempt("c1", 1, {}, lambda: [("0", v.origin)], log,
                              dialect_settings={v.dialect: SETTINGS[v.dialect]},
                              model=None) as att:
            headers = {} if query_key else CLIENT_KEY[v.dialect](att.key)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{att.port}",
                                         headers=headers, timeout=30) as c:
                for i in range(n):
                    path, body = request(v.dialect, stream=i % 2 == 1)
                    if query_key:
                        path += ("&" if "?" in path else "?") + f"key={att.key}"
                    answers.append(await c.post(path, json=body))
            summary = att.meter.summary()
    finally:
        await gw.close()
    return summary, records(log), answers


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages", "gemini"])
async def test_each_dialect_is_metered_by_bucket_as_the_vendor_billed(
        dialect: str, vendors: dict[str, Vendor], tmp_path: Path) -> None:
    v = vendors[dialect]
    summary, recs, answers = await drive(v, tmp_path, 4)
    assert [a.status_code for a in answers] == [200] * 4, [a.text[:200] for a in answers]
    assert all("banana" in a.text or "ban" in a.text for a in answers)
    billed = [r["billed"] for r in v.requests()]
    assert len(billed) == 4
    for rec, b in zip(recs, billed, strict=True):  # request by request
        t = rec["tokens"]
        assert rec["dialect"] == dialect and rec["stream"] == (recs.index(rec) % 2 == 1)
        assert t["input"] == b["input"] and t["output"] == b["output"]
        assert t["input"] + t.get("cache_write", 0) + t.get("cache_read", 0) == (
            b["input"] + b["cache_write"] + b["cache_read"])
        if dialect == "messages":  # Anthropic says every cache bucket, and no reasoning
            assert (t["cache_write"], t["cache_read"]) == (b["cache_write"], b["cache_read"])
            assert "reasoning" not in t
        else:  # the others report cache reads (none writes) and reasoning
            assert t.get("cache_read", 0) == b["cache_read"] and "cache_write" not in t
            assert t["reasoning"] == b["reasoning"]
    total = Tokens()
    for b in billed:
        total = total + Tokens(input=b["input"], cache_read=b["cache_read"], output=b["output"])
    assert summary["tokens"]["input"] == total.input
    assert summary["tokens"]["cache_read"] == total.cache_read
    assert summary["tokens"]["output"] == summary["completion_tokens"] == total.output
    assert summary["unmetered"] == 0 and summary["requests"] == 4
    if dialect == "messages":
        assert summary["tokens"]["cache_write"] == sum(b["cache_write"] for b in billed)
    else:
        assert "cache_write" not in summary["tokens"]  # absent, not 0


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages", "gemini"])
async def test_keys_and_settings_go_where_each_vendor_takes_them(
        dialect: str, vendors: dict[str, Vendor], tmp_path: Path) -> None:
    v = vendors[dialect]
    await drive(v, tmp_path, 2)
    got = v.requests()
    assert all(r["key_ok"] for r in got)  # the real key, in the vendor's own header
    want_header = {"chat": "authorization", "responses": "authorization",
                   "messages": "x-api-key", "gemini": "x-goog-api-key"}[dialect]
    for r in got:
        assert want_header in r["headers"]
        others = {"authorization", "x-api-key", "x-goog-api-key", "api-key"} - {want_header}
        assert not others & set(r["headers"])  # the attempt's key never goes upstream
        body = r["body"]
        field, value = next(iter(SETTINGS[dialect].items()))
        assert body[field] == value  # the arm's setting, in the dialect's own field
    log = (tmp_path / f"gw-{dialect}.jsonl").read_text()
    assert REAL not in log


async def test_a_google_clients_query_key_admits_and_never_goes_upstream(
        vendors: dict[str, Vendor], tmp_path: Path) -> None:
    v = vendors["gemini"]
    summary, _, answers = await drive(v, tmp_path, 2, query_key=True)
    assert [a.status_code for a in answers] == [200, 200] and summary["unauthorized"] == 0
    for r in v.requests():
        assert "key" not in r["query"] and r["key_ok"]  # header upstream, not ?key=
    assert [r["query"] for r in v.requests()][1] == {"alt": "sse"}


@pytest.mark.parametrize(("dialect", "status"), [("messages", 529), ("messages", 429),
                                                 ("chat", 429), ("gemini", 429),
                                                 ("responses", 429)])
async def test_a_refusal_storm_is_throttling_never_an_answer(
        dialect: str, status: int, tmp_path: Path) -> None:
    v = Vendor(tmp_path, dialect, REAL, "fake-model,gemini-x", "--refuse", "-1",
               "--refuse-status", str(status))
    try:
        summary, recs, answers = await drive(v, tmp_path, 3)
    finally:
        v.close()
    assert {a.status_code for a in answers} == {status if dialect == "messages" else 429}
    assert summary["errors"] == {"throttled": 3} and summary["throttled_tail"] == 3
    assert all(r["error"] == "throttled" for r in recs)
    assert summary["tokens"] == {"input": 0, "output": 0} or summary["completion_tokens"] == 0


def test_an_overloaded_error_inside_a_stream_is_throttling() -> None:
    scan = StreamScan(MESSAGES)
    scan.feed(b'event: message_start\ndata: {"type":"message_start","message":{"model":"m",'
              b'"usage":{"input_tokens":5,"output_tokens":1}}}\n\n'
              b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
              b'"message":"Overloaded"}}\n\n')
    assert scan.state.error == "overloaded_error"
    assert error_kind(529) == "throttled" and error_kind(429) == "throttled"
    assert error_kind(400, vendor=MESSAGES.refusal(400, {"error": {
        "type": "overloaded_error"}})) == "throttled"
    assert error_kind(503) == "endpoint_error" and error_kind(401) == "request_error"


def test_streams_split_anywhere_read_the_same_usage_in_every_dialect() -> None:
    messages = (b'event: message_start\ndata: {"type":"message_start","message":{"model":'
                b'"claude-x","usage":{"input_tokens":10,"cache_creation_input_tokens":4,'
                b'"cache_read_input_tokens":30,"output_tokens":1}}}\n\n'
                b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                b'"delta":{"type":"text_delta","text":"hi"}}\n\n'
                b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
                b'"end_turn"},"usage":{"output_tokens":12}}\n\n')
    want = Tokens(input=10, cache_write=4, cache_read=30, output=12)
    for size in (1, 5, 17, len(messages)):
        scan = StreamScan(MESSAGES)
        for i in range(0, len(messages), size):
            scan.feed(messages[i:i + size])
        assert scan.usage is not None and scan.usage.tokens == want
        assert (scan.finish, scan.model, scan.chunks) == ("end_turn", "claude-x", 1)
    gemini = (b'data: {"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":'
              b'{"promptTokenCount":50}}\r\n\r\n'
              b'data: {"candidates":[{"content":{"parts":[{"text":"b"}]},"finishReason":'
              b'"STOP"}],"usageMetadata":{"promptTokenCount":50,"cachedContentTokenCount":20,'
              b'"candidatesTokenCount":6,"thoughtsTokenCount":4},"modelVersion":"g-1"}\r\n\r\n')
    scan = StreamScan(GEMINI)
    scan.feed(gemini)
    assert scan.usage is not None
    assert scan.usage.tokens == Tokens(input=30, cache_read=20, output=10, reasoning=4)
    assert (scan.finish, scan.model, scan.chunks) == ("STOP", "g-1", 2)
    responses = (b'event: response.output_text.delta\ndata: {"type":"response.output_text.'
                 b'delta","delta":"x"}\n\nevent: response.completed\ndata: {"type":"response.'
                 b'completed","response":{"model":"gpt-x","status":"completed","usage":{'
                 b'"input_tokens":9,"input_tokens_details":{"cached_tokens":4},"output_tokens":'
                 b'3,"output_tokens_details":{"reasoning_tokens":1}}}}\n\n')
    scan = StreamScan(RESPONSES)
    scan.feed(responses)
    assert scan.usage is not None
    assert scan.usage.tokens == Tokens(input=5, cache_read=4, output=3, reasoning=1)
    assert (scan.finish, scan.model, scan.chunks) == ("completed", "gpt-x", 1)


@pytest.mark.parametrize(("doc", "want"), [
    ({"usage": {"input_tokens": 3, "output_tokens": 2}}, Tokens(input=3, output=2)),
    ({"usage": {"input_tokens": 3.0, "output_tokens": 2}}, Tokens(input=3, output=2)),
    ({"usage": {"input_tokens": 3.5, "output_tokens": 2}}, None),  # no count: malformed
    ({"usage": {"input_tokens": -3, "output_tokens": 2}}, None),  # malformed: not counted
    ({"usage": {"input_tokens": "3", "cache_read_input_tokens": 10**401}}, None),
])
def test_a_dialects_usage_is_shape_checked(doc: dict[str, Any], want: Tokens | None) -> None:
    got = MESSAGES.usage(doc)
    assert got is not None
    assert (got.tokens if not got.malformed else None) == want


@pytest.mark.parametrize(("method", "path", "dialect", "generates"), [
    ("POST", "/v1/messages", "messages", True),
    ("POST", "/v1/messages/count_tokens", "messages", False),
    ("POST", "/v1/responses", "responses", True),
    ("POST", "/v1beta/models/gemini-2.5-pro:streamGenerateContent", "gemini", True),
    ("POST", "/v1beta/models/gemini-2.5-pro:countTokens", "gemini", False),
    ("POST", "/api/v1/chat/completions", "chat", True),
    ("GET", "/v1/messages", None, False),
    ("POST", "/v1beta/models/../x:generateContent", None, False),
    ("POST", "/v1/messages%2F..", None, False),
])
def test_a_request_finds_its_dialect_by_route_alone(
        method: str, path: str, dialect: str | None, generates: bool) -> None:
    r = route_of(method, path)
    assert (r.dialect.name if r else None) == dialect
    assert (r.generates if r else False) is generates


def test_prices_by_bucket_a_cache_read_at_a_tenth_floors_and_unpriced() -> None:
    t = Tokens(input=1_000_000, cache_read=4_000_000, output=100_000)
    rate = Rate(input=3.0, cache_read=0.3, output=15.0)
    p = price(t, rate)
    assert p.basis == "buckets" and p.usd == pytest.approx(3.0 + 1.2 + 1.5)
    floor = price(Tokens(input=1_000_000, cache_write=10, output=0), rate)
    assert floor.basis == "floor" and floor.unpriced == ("cache_write",)
    assert floor.usd == pytest.approx(3.0) and "cache_write" in floor.label()
    none = price(t, None)
    assert none.basis == "unpriced" and none.usd is None
    pair = Rate.model_validate([1.0, 2.0])  # a bare [in, out] prices every input at in
    assert price(t, pair).usd == pytest.approx(5.0 + 0.2) and price(t, pair).basis == "buckets"
    assert json.loads(Rate.model_validate([1.0, 2.0]).model_dump_json())["cache_read"] == 1.0


async def test_an_upstreams_key_goes_to_its_own_dialects_routes_only(
        vendors: dict[str, Vendor], tmp_path: Path) -> None:
    """A hosted OpenAI-compatible endpoint's key (dialects chat and responses) is never
    put on an Anthropic or Google route, whatever the harness asks."""
    gw = Gateway()
    gw.key = lambda: REAL
    v = vendors["messages"]
    try:
        async with gw.attempt("c1", 1, {}, lambda: [("0", v.origin)], tmp_path / "g.jsonl",
                              dialects=frozenset({"chat", "responses"})) as att:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{att.port}",
                                         headers=CLIENT_KEY["messages"](att.key)) as c:
                path, body = request("messages", stream=False)
                r = await c.post(path, json=body)
            meter = att.meter
    finally:
        await gw.close()
    assert r.status_code == 403 and "speaks chat, responses" in r.text
    assert meter.refused == 1 and v.requests() == []


def test_a_key_pasted_as_a_routes_variable_name_is_refused_without_echoing_it(
        tmp_path: Path) -> None:
    from conftest import run_cli

    bad = tmp_path / "bad.toml"
    bad.write_text('[[arms]]\nlabel = "x-native"\nmode = "native"\n[arms.route]\n'
                   'base_url = "file:///etc/passwd"\ndialect = "messages"\n'
                   'api_key_env = "sk-ant-api03-SECRETSECRET"\nmodel = "m"\n')
    r = run_cli("--preset", "frontier", "--config", str(bad), "--dry-run")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "SECRETSECRET" not in r.stderr + r.stdout
    assert "api_key_env: not a variable name" in r.stderr
    assert "not an http(s) base URL" in r.stderr
