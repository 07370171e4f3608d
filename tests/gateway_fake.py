"""A FAKE OpenAI-compatible upstream for the gateway's tests (aiohttp, 127.0.0.1).

Shaped from the protocol llama-server and vLLM speak: ``/v1/chat/completions`` answers
JSON with ``usage`` or, with ``"stream": true``, server-sent events of
``chat.completion.chunk`` objects, the last with ``finish_reason`` and ``usage``, then
``data: [DONE]``; a prompt that does not fit is a 400 worded as vLLM words it. The
hostile answers are chosen by the request's ``model``: ``big`` (100 MB body),
``forever`` (a body that never ends), ``badjson``, ``hugeusage`` (a 401-digit and a
negative count), ``throttle`` (429 + Retry-After), ``burst`` (two 429s, then an
answer), ``overflow``; and those of issue #33, each a misbehaviour seen in the wild: ``gzip``
(a gzipped body whatever Accept-Encoding said), ``deep`` (JSON nested 5000 deep),
``badutf8``, ``nousage``, ``sse`` (an event stream though no stream was asked for),
``nanretry`` (429 with ``Retry-After: nan``), ``cut`` (a stream dropped after its first
event), ``slow`` (nothing for 30 s). The raw request bodies are kept in ``raw``.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

VLLM_OVERFLOW = ("This model's maximum context length is 65536 tokens. However, you "
                 "requested 180000 tokens (2000 in the messages, 178000 in the completion).")


class FakeUpstream:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.raw: list[bytes] = []
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.burst = 0

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        # like uvicorn (vLLM) and llama-server: a request body is not decompressed
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2,
                                    auto_decompress=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self.runner.addresses[0][1])

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def health(self, req: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(self, req: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def chat(self, req: web.Request) -> web.StreamResponse:
        raw = await req.read()
        self.raw.append(raw)
        if req.headers.get("Content-Encoding") == "gzip":  # inflated within 1 MB, as a
            raw = zlib.decompressobj(wbits=31).decompress(raw, 1 << 20)  # server would
        try:
            body = json.loads(raw)
        except ValueError:
            return web.json_response({"error": {"message": "bad json"}}, status=400)
        self.bodies.append(body)
        self.headers.append(dict(req.headers))
        model = body.get("model")
        n = int(body.get("max_tokens") or 5)
        if model == "big":
            resp = web.StreamResponse()
            resp.content_length = 100 << 20
            await resp.prepare(req)
            chunk = b" " * (1 << 20)
            for _ in range(100):
                await resp.write(chunk)
            return resp
        if model == "forever":
            resp = web.StreamResponse()
            await resp.prepare(req)
            while True:
                await resp.write(b"data: {}\n\n")
                await asyncio.sleep(0.02)
        if model == "gzip":
            doc = {"object": "chat.completion", "model": model, "choices": [],
                   "usage": {"prompt_tokens": 900, "completion_tokens": 900}}
            return web.Response(body=gzip.compress(json.dumps(doc).encode()), headers={
                "Content-Type": "application/json", "Content-Encoding": "gzip"})
        if model == "deep":
            return web.Response(text="[" * 5000 + "]" * 5000, content_type="application/json")
        if model == "badutf8":
            return web.Response(body=b'{"usage": {"prompt_tokens": 5, "completion_tokens": '
                                b'5}, "x": "\xff"}', content_type="application/json")
        if model == "nousage":
            return web.json_response({"object": "chat.completion", "choices": []})
        if model == "sse":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(req)
            await resp.write(_sse({"choices": [{"delta": {"content": "a"}}],
                                   "usage": {"prompt_tokens": 3, "completion_tokens": 1}}))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        if model == "nanretry":
            return web.json_response({"error": {"message": "rate limited"}}, status=429,
                                     headers={"Retry-After": "nan"})
        if model == "cut":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(req)
            await resp.write(_sse({"choices": [{"delta": {"content": "a"}}]}))  # drained
            assert req.transport is not None
            req.transport.abort()
            return resp
        if model == "slow":
            await asyncio.sleep(30)
        if model == "badjson":
            return web.Response(text="{not json", content_type="application/json")
        if model == "hugeusage":
            return web.Response(text='{"choices": [], "usage": {"prompt_tokens": 1' + "0" * 400
                                + ', "completion_tokens": -5}}', content_type="application/json")
        if model == "burst":  # a provider's 429 burst: two refusals, then an answer
            self.burst += 1
            if self.burst <= 2:
                return web.json_response({"error": {"message": "rate limited"}}, status=429,
                                         headers={"Retry-After": "0.05"})
        if model == "throttle":
            return web.json_response({"error": {"message": "rate limited"}}, status=429,
                                     headers={"Retry-After": "2"})
        if model == "overflow":
            return web.json_response({"object": "error", "message": VLLM_OVERFLOW,
                                      "type": "BadRequestError", "code": 400}, status=400)
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(req)
            for i in range(n):
                await resp.write(_sse({"object": "chat.completion.chunk", "choices": [
                    {"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]}))
            await resp.write(_sse({"object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": n}}))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        return web.json_response({
            "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "x " * n}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n,
                      "completion_tokens_details": {"reasoning_tokens": 2}}})


def _sse(doc: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(doc)}\n\n".encode()


# ---------------------------------------------------------------------- test helpers
# (shared by tests/test_gateway.py and tests/test_gateway_trust.py; the ``upstream``
# fixture is in conftest.py)


def here(up: FakeUpstream) -> Any:
    """The upstream list the gateway asks for: replica 0, the fake."""
    return lambda: [("0", up.origin)]


def client(att: Any, **kw: Any) -> httpx.AsyncClient:
    """The attempt's harness: its listener, its key (as the OpenAI clients send it)."""
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{att.port}",
                             headers={"Authorization": f"Bearer {att.key}"}, **kw)


def records(path: Path) -> list[dict[str, Any]]:
    """An attempt's gateway.jsonl, one dict per request."""
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
