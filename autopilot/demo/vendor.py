"""FAKE vendor APIs, on 127.0.0.1 (aiohttp): ``python -m autopilot.demo.vendor --dialect
messages --key K [--port P] [--models a,b]``. For trying an agent preset without a
vendor's account (docs/agents.md) and for the gateway's dialect tests.

Each speaks one vendor's protocol as its public documentation shapes it, with a key
checked in that vendor's header; nothing here is any vendor's code:

- ``messages`` (Anthropic): ``POST /v1/messages`` (JSON, or named SSE events:
  message_start with the input usage, content_block_start, ping, content_block_delta,
  content_block_stop, message_delta with the cumulative output usage, message_stop),
  ``POST /v1/messages/count_tokens``, ``GET /v1/models``; key in ``x-api-key``;
  errors ``{"type": "error", "error": {"type": ..., "message": ...}}`` (401
  authentication_error, 429 rate_limit_error, 529 overloaded_error).
- ``responses`` (OpenAI Responses): ``POST /v1/responses`` (JSON, or named events from
  response.created to response.completed with the usage), ``GET /v1/models``; Bearer.
- ``chat`` (an aggregator, OpenAI chat/completions as OpenRouter serves it): usage with
  ``prompt_tokens_details.cached_tokens``, a stream's last chunk carrying usage; Bearer.
- ``gemini`` (Google): ``POST /v1beta/models/{m}:generateContent`` and
  ``:streamGenerateContent?alt=sse`` (``data:`` lines, each a whole response, the last
  with finishReason and the full usageMetadata), ``:countTokens``, ``GET
  /v1beta/models``; key in ``x-goog-api-key`` or ``?key=``; errors ``{"error": {"code",
  "message", "status"}}`` (429 RESOURCE_EXHAUSTED).

What each request was billed (by bucket) is written, one JSON line per request, to
``--record`` (when given), with the body it got and whether the key was the real one;
the answer is always ``--answer``. ``--refuse N``: the first N model requests are refused with the
vendor's capacity error (``--refuse-status``: 429 or 529); ``--refuse -1``: all of them.
Prints ``ready PORT`` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from aiohttp import web


class Vendor:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.n = 0  # model requests answered or refused
        self.models = a.models.split(",")
        # lives as long as we do
        self.record = open(a.record or os.devnull, "a", buffering=1)  # noqa: SIM115

    # ------------------------------------------------------------ shared

    def key_of(self, req: web.Request) -> str | None:
        dialect = self.a.dialect
        if dialect == "messages":
            return req.headers.get("x-api-key")
        if dialect == "gemini":
            return req.headers.get("x-goog-api-key") or req.query.get("key")
        auth = req.headers.get("Authorization", "")
        return auth[7:] if auth.startswith("Bearer ") else None

    def bill(self, i: int) -> dict[str, int]:
        """What request i (1-based) is billed, by bucket: a cache written on the first
        (Anthropic bills the write; OpenAI and Google caches have no write bucket), read
        on the later ones, as a long agent conversation is."""
        write = 40 if i == 1 and self.a.dialect == "messages" else 0
        return {"input": 100 + i, "cache_write": write,
                "cache_read": 0 if i == 1 else 300 * (i - 1), "output": 7 + i,
                "reasoning": 3}

    def note(self, req: web.Request, body: Any, billed: dict[str, int] | None,
             status: int) -> None:
        self.record.write(json.dumps({
            "path": req.path, "query": dict(req.query), "status": status,
            "key_ok": self.key_of(req) == self.a.key, "body": body, "billed": billed,
            "headers": sorted(k.lower() for k in req.headers)}) + "\n")

    def unauthorized(self) -> web.Response:
        dialect = self.a.dialect
        if dialect == "messages":
            doc: Any = {"type": "error", "error": {"type": "authentication_error",
                                                   "message": "invalid x-api-key"}}
        elif dialect == "gemini":
            doc = {"error": {"code": 400, "message": "API key not valid. Please pass a valid "
                             "API key.", "status": "INVALID_ARGUMENT"}}
            return web.json_response(doc, status=400)
        else:
            doc = {"error": {"message": "Incorrect API key provided", "type":
                             "invalid_request_error", "code": "invalid_api_key"}}
        return web.json_response(doc, status=401)

    def refusal(self) -> web.Response:
        dialect, status = self.a.dialect, self.a.refuse_status
        if dialect == "messages":
            kind = "overloaded_error" if status == 529 else "rate_limit_error"
            doc: Any = {"type": "error", "error": {"type": kind, "message": "Overloaded"}}
        elif dialect == "gemini":
            doc = {"error": {"code": 429, "message": "Resource has been exhausted (e.g. "
                             "check quota).", "status": "RESOURCE_EXHAUSTED"}}
            status = 429
        else:
            doc = {"error": {"message": "Rate limit reached", "type": "requests",
                             "code": "rate_limit_exceeded"}}
        return web.json_response(doc, status=status, headers={"retry-after": "0"})

    async def model_request(self, req: web.Request, model: str | None) -> web.StreamResponse:
        raw = await req.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if self.key_of(req) != self.a.key:
            self.note(req, body, None, 401)
            return self.unauthorized()
        self.n += 1
        if self.a.refuse < 0 or self.n <= self.a.refuse:
            self.note(req, body, None, self.a.refuse_status)
            return self.refusal()
        billed = self.bill(self.n)
        self.note(req, body, billed, 200)
        answer: web.StreamResponse = await getattr(self, self.a.dialect)(req, body, billed,
                                                                         model)
        return answer

    async def sse(self, req: web.Request, events: list[tuple[str | None, Any]]
                  ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(req)
        for name, doc in events:
            head = f"event: {name}\n" if name else ""
            await resp.write(f"{head}data: {json.dumps(doc)}\n\n".encode())
        await resp.write_eof()
        return resp

    def words(self) -> list[str]:
        text = self.a.answer
        return [text[i:i + 3] for i in range(0, len(text), 3)] or [""]

    # ------------------------------------------------------------ Anthropic Messages

    async def messages(self, req: web.Request, body: Any, b: dict[str, int],
                       model: str | None) -> web.StreamResponse:
        name = self.models[0]
        usage_in = {"input_tokens": b["input"], "cache_creation_input_tokens": b["cache_write"],
                    "cache_read_input_tokens": b["cache_read"]}
        if not (isinstance(body, dict) and body.get("stream")):
            return web.json_response({
                "id": f"msg_{self.n}", "type": "message", "role": "assistant", "model": name,
                "content": [{"type": "text", "text": self.a.answer}],
                "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {**usage_in, "output_tokens": b["output"]}})
        events: list[tuple[str | None, Any]] = [
            ("message_start", {"type": "message_start", "message": {
                "id": f"msg_{self.n}", "type": "message", "role": "assistant", "model": name,
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {**usage_in, "output_tokens": 1}}}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            ("ping", {"type": "ping"})]
        events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": w}})
                   for w in self.words()]
        events += [("content_block_stop", {"type": "content_block_stop", "index": 0}),
                   ("message_delta", {"type": "message_delta", "delta": {
                       "stop_reason": "end_turn", "stop_sequence": None},
                       "usage": {"output_tokens": b["output"]}}),
                   ("message_stop", {"type": "message_stop"})]
        return await self.sse(req, events)

    # ------------------------------------------------------------ OpenAI Responses

    def _response(self, b: dict[str, int], status: str = "completed") -> dict[str, Any]:
        return {"id": f"resp_{self.n}", "object": "response", "created_at": 1,
                "status": status, "model": self.models[0], "output": [
                    {"type": "message", "id": f"msg_{self.n}", "status": "completed",
                     "role": "assistant", "content": [{"type": "output_text",
                                                       "text": self.a.answer,
                                                       "annotations": []}]}],
                "usage": {"input_tokens": b["input"] + b["cache_read"],
                          "input_tokens_details": {"cached_tokens": b["cache_read"]},
                          "output_tokens": b["output"],
                          "output_tokens_details": {"reasoning_tokens": b["reasoning"]},
                          "total_tokens": b["input"] + b["cache_read"] + b["output"]}}

    async def responses(self, req: web.Request, body: Any, b: dict[str, int],
                        model: str | None) -> web.StreamResponse:
        done = self._response(b)
        if not (isinstance(body, dict) and body.get("stream")):
            return web.json_response(done)
        started = {**done, "status": "in_progress", "output": [], "usage": None}
        item = {"type": "message", "id": f"msg_{self.n}", "status": "in_progress",
                "role": "assistant", "content": []}
        events: list[tuple[str | None, Any]] = [
            ("response.created", {"type": "response.created", "response": started}),
            ("response.in_progress", {"type": "response.in_progress", "response": started}),
            ("response.output_item.added", {"type": "response.output_item.added",
                                            "output_index": 0, "item": item}),
            ("response.content_part.added", {"type": "response.content_part.added",
                                             "item_id": item["id"], "output_index": 0,
                                             "content_index": 0, "part": {
                                                 "type": "output_text", "text": ""}})]
        events += [("response.output_text.delta", {"type": "response.output_text.delta",
                                                   "item_id": item["id"], "output_index": 0,
                                                   "content_index": 0, "delta": w})
                   for w in self.words()]
        events += [("response.output_text.done", {"type": "response.output_text.done",
                                                  "item_id": item["id"], "output_index": 0,
                                                  "content_index": 0, "text": self.a.answer}),
                   ("response.output_item.done", {"type": "response.output_item.done",
                                                  "output_index": 0,
                                                  "item": done["output"][0]}),
                   ("response.completed", {"type": "response.completed", "response": done})]
        return await self.sse(req, events)

    # ------------------------------------------------------------ chat (an aggregator)

    async def chat(self, req: web.Request, body: Any, b: dict[str, int],
                   model: str | None) -> web.StreamResponse:
        usage = {"prompt_tokens": b["input"] + b["cache_read"],
                 "prompt_tokens_details": {"cached_tokens": b["cache_read"]},
                 "completion_tokens": b["output"],
                 "completion_tokens_details": {"reasoning_tokens": b["reasoning"]},
                 "total_tokens": b["input"] + b["cache_read"] + b["output"]}
        name = self.models[0]
        if not (isinstance(body, dict) and body.get("stream")):
            return web.json_response({
                "id": f"gen-{self.n}", "object": "chat.completion", "model": name,
                "choices": [{"index": 0, "finish_reason": "stop", "message": {
                    "role": "assistant", "content": self.a.answer}}], "usage": usage})
        chunks: list[tuple[str | None, Any]] = [
            (None, {"id": f"gen-{self.n}", "object": "chat.completion.chunk", "model": name,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": w},
                                 "finish_reason": None}]}) for w in self.words()]
        chunks.append((None, {"id": f"gen-{self.n}", "object": "chat.completion.chunk",
                              "model": name, "choices": [{"index": 0, "delta": {},
                                                          "finish_reason": "stop"}],
                              "usage": usage}))
        return await self.sse(req, chunks)

    # ------------------------------------------------------------ Google generateContent

    def _gemini_chunk(self, text: str, b: dict[str, int], last: bool) -> dict[str, Any]:
        cand: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"},
                                "index": 0}
        usage: dict[str, Any] = {"promptTokenCount": b["input"] + b["cache_read"]}
        if last:
            cand["finishReason"] = "STOP"
            usage.update(candidatesTokenCount=b["output"] - b["reasoning"],
                         thoughtsTokenCount=b["reasoning"],
                         totalTokenCount=b["input"] + b["cache_read"] + b["output"])
            if b["cache_read"]:
                usage["cachedContentTokenCount"] = b["cache_read"]
        return {"candidates": [cand], "usageMetadata": usage,
                "modelVersion": self.models[0], "responseId": f"r{self.n}"}

    async def gemini(self, req: web.Request, body: Any, b: dict[str, int],
                     model: str | None) -> web.StreamResponse:
        if not req.path.endswith(":streamGenerateContent"):
            return web.json_response(self._gemini_chunk(self.a.answer, b, True))
        words = self.words()
        return await self.sse(req, [(None, self._gemini_chunk(w, b, i == len(words) - 1))
                                    for i, w in enumerate(words)])

    # ------------------------------------------------------------ routes

    async def models_list(self, req: web.Request) -> web.Response:
        if self.key_of(req) != self.a.key:
            return self.unauthorized()
        if self.a.dialect == "gemini":
            return web.json_response({"models": [{"name": f"models/{m}"} for m in self.models]})
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "type": "model"} for m in self.models],
            "has_more": False})

    async def count_tokens(self, req: web.Request) -> web.Response:
        await req.read()
        if self.key_of(req) != self.a.key:
            return self.unauthorized()
        if self.a.dialect == "gemini":
            return web.json_response({"totalTokens": 42})
        return web.json_response({"input_tokens": 42})

    async def gemini_route(self, req: web.Request) -> web.StreamResponse:
        model, _, method = req.match_info["tail"].partition(":")
        if method == "countTokens":
            return await self.count_tokens(req)
        if method not in ("generateContent", "streamGenerateContent"):
            return web.json_response({"error": {"code": 404, "message": "not found",
                                                "status": "NOT_FOUND"}}, status=404)
        return await self.model_request(req, model)

    def app(self) -> web.Application:
        app = web.Application()
        dialect = self.a.dialect
        if dialect == "gemini":
            app.router.add_get("/v1beta/models", self.models_list)
            app.router.add_post("/v1beta/models/{tail}", self.gemini_route)
            return app
        app.router.add_get("/v1/models", self.models_list)
        if dialect == "messages":
            app.router.add_post("/v1/messages", lambda r: self.model_request(r, None))
            app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        elif dialect == "responses":
            app.router.add_post("/v1/responses", lambda r: self.model_request(r, None))
        else:
            app.router.add_post("/v1/chat/completions", lambda r: self.model_request(r, None))
        return app


async def main() -> None:
    parser = argparse.ArgumentParser(description="FAKE vendor API (tests only)")
    parser.add_argument("--dialect", choices=["messages", "responses", "chat", "gemini"],
                        required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--models", default="fake-model")
    parser.add_argument("--record", default="")
    parser.add_argument("--answer", default="banana")
    parser.add_argument("--refuse", type=int, default=0)
    parser.add_argument("--refuse-status", type=int, default=529)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    runner = web.AppRunner(Vendor(args).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    print("ready", runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
