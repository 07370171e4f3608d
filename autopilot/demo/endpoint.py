"""SIMULATED OpenAI-compatible endpoint (a fake, for the demo and the tests).

Serves ``/health``, ``/v1/models`` and ``/v1/chat/completions`` on loopback with the
shape of llama.cpp's / vLLM's answers, including ``usage`` token counts. The answer is
``FINAL: correct`` or ``FINAL: wrong``, decided deterministically from the seed and the
``task= arm= n=`` marker the demo harness puts in its system prompt.

``--require-key-env NAME`` makes it an honest fake *hosted provider*: every ``/v1``
request needs ``Authorization: Bearer $NAME`` (401 otherwise), as a hosted API would.

Fault knobs: ``--crash-after K`` exits hard after K chat requests (as a crashed server
would); ``--startup-delay S`` answers 503 on /health for S seconds (llama.cpp's loading
phase); ``--never-ready`` never leaves that phase.

Like llama-server it answers ``/slots`` (one entry per ``--parallel`` slot, with
``is_processing`` and ``next_token[0].n_decoded`` growing while a request is being
"generated"), and takes ``--chat-template-kwargs '{"enable_thinking": true}'``: a think
arm's answers then carry their reasoning in-band (``<think>...</think>``), as with
``--reasoning-format none``; a request's own ``chat_template_kwargs`` override it, as
the real servers' do. ``--ctx-size C`` splits C over the slots as llama-server does
and refuses a prompt over one slot's share with its HTTP 400 ``exceed_context_size_error``
(``max_tokens`` over it is not refused: generation stops at the slot's end, as there).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from autopilot.demo import PASS_RATE, unit

MARKER = re.compile(r"task=(\S+) arm=(\S+) n=(\d+)")


def answer_for(seed: str, task: str, arm: str, n: str) -> str:
    rate = PASS_RATE.get(task, 0.5)
    if "nothink" not in arm and "think" in arm:
        rate = min(1.0, rate + 0.1)
    return "correct" if unit(seed, task, arm, n) < rate else "wrong"


class Sim:
    """The simulated server's state, shared by its handler threads."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.count = 0
        self.busy: dict[int, float] = {}  # slot id -> when its current request began
        self.decoded = [0] * args.parallel  # tokens "decoded" by each slot's finished requests
        self.thinking = bool(json.loads(args.chat_template_kwargs or "{}").get("enable_thinking"))
        self.rate = 50.0  # simulated tokens per second while a slot is busy
        self.throttled_until = 0.0  # a hosted provider's rate limit, as a burst of 429s
        self.slot_ctx = args.ctx_size // max(1, args.parallel)  # llama-server: -c / --parallel

    def loading(self) -> bool:
        return bool(self.args.never_ready
                    or time.monotonic() - self.started < self.args.startup_delay)

    def slots(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        with self.lock:
            return [{"id": i, "n_ctx": self.slot_ctx or 4096, "is_processing": i in self.busy,
                     "next_token": [{"n_decoded": self.decoded[i] + (
                         int((now - self.busy[i]) * self.rate) if i in self.busy else 0)}]}
                    for i in range(self.args.parallel)]

    def refusal(self, req: dict[str, Any]) -> dict[str, Any] | None:
        """The real servers' HTTP 400 for a request over the context, word for word."""
        args = self.args
        text = " ".join(str(m.get("content", "")) for m in req.get("messages") or []
                        if isinstance(m, dict))
        prompt = max(1, len(text) // 4)
        if args.max_model_len:
            # vLLM's refusal: prompt + max_tokens over --max-model-len.
            asked: int = req["max_tokens"] if type(req.get("max_tokens")) is int else 0
            if prompt + asked > args.max_model_len:
                return {"object": "error", "type": "BadRequestError", "param": None,
                        "code": 400, "message": (
                            f"This model's maximum context length is {args.max_model_len} "
                            f"tokens. However, you requested {prompt + asked} tokens "
                            f"({prompt} in the messages, {asked} in the completion). Please "
                            "reduce the length of the messages or completion.")}
        if self.slot_ctx and prompt >= self.slot_ctx:
            # llama-server's refusal, as measured (b11434, -c 512 --parallel 2).
            return {"error": {
                "code": 400, "message": f"request ({prompt} tokens) exceeds the "
                f"available context size ({self.slot_ctx} tokens), try increasing it",
                "type": "exceed_context_size_error", "n_prompt_tokens": prompt,
                "n_ctx": self.slot_ctx}}
        return None

    def generate(self) -> int:
        """Hold a slot for the simulated latency; the request's number."""
        args = self.args
        with self.lock:
            self.count += 1
            n_req = self.count
            if args.throttle_every and n_req % args.throttle_every == 0:
                self.throttled_until = time.monotonic() + args.throttle_secs
            slot = next((i for i in range(args.parallel) if i not in self.busy), -1)
            if slot >= 0:
                self.busy[slot] = time.monotonic()
        if args.crash_after and n_req > args.crash_after:
            os._exit(70)  # fault knob: die like a crashed server, mid-request
        try:
            if args.latency:
                time.sleep(args.latency)
        finally:
            with self.lock:
                if slot >= 0:
                    self.decoded[slot] += int((time.monotonic() - self.busy.pop(slot))
                                              * self.rate)
        return n_req

    def completion(self, req: dict[str, Any], n_req: int) -> dict[str, Any]:
        messages = req.get("messages") or []
        text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        m = MARKER.search(text)
        turn = sum(1 for message in messages
                   if isinstance(message, dict) and message.get("role") == "user")
        final = req.get("final", False) or "Give your FINAL answer" in text
        if final and m:
            content = f"FINAL: {answer_for(self.args.seed, *m.groups())}"
        else:
            content = f"Working on step {turn}: reading files, running tools."
        # Per request, as llama-server and vLLM take it: the request's
        # chat_template_kwargs override the server's defaults.
        kwargs = req.get("chat_template_kwargs")
        think = self.thinking
        if isinstance(kwargs, dict) and "enable_thinking" in kwargs:
            think = bool(kwargs["enable_thinking"])
        if think:
            content = f"<think>Let me reason about step {turn}.</think>{content}"
        prompt_tokens = max(1, len(text) // 4)
        completion_tokens = max(1, len(content) // 4)
        return {
            "id": f"chatcmpl-sim-{n_req}",
            "object": "chat.completion",
            "model": self.args.answer_as or self.args.model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": prompt_tokens,
                      "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }


class SimHandler(BaseHTTPRequestHandler):
    sim: Sim  # set by make_handler
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, the body of every reply
    # on a kept-alive connection waits ~40 ms for the client's delayed ACK.
    disable_nagle_algorithm = True

    def log_message(self, fmt: str, *a: Any) -> None:  # quiet: the harness logs
        pass

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        if self.sim.args.gzip and self.path.rstrip("/").endswith("/completions"):
            # fault knob: gzip whatever Accept-Encoding said (a misconfigured proxy)
            import gzip

            data = gzip.compress(data)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _throttled(self) -> bool:
        """Answer 429 (with Retry-After, as OpenAI and Anthropic do) inside a burst."""
        left = self.sim.throttled_until - time.monotonic()
        if left <= 0:
            return False
        data = json.dumps({"error": {"message": "Rate limit reached", "type": "requests",
                                     "code": "rate_limit_exceeded"}}).encode()
        self.send_response(429)
        self.send_header("Content-Type", "application/json")
        if not self.sim.args.no_retry_after:
            self.send_header("Retry-After", str(max(1, int(left + 0.999))))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        return True

    def _authorized(self) -> bool:
        key_env = self.sim.args.require_key_env
        if not key_env:
            return True
        want = os.environ.get(key_env, "")
        if want and self.headers.get("Authorization") == f"Bearer {want}":
            return True
        self._send(401, {"error": {"message": "invalid api key", "type": "auth"}})
        return False

    def do_GET(self) -> None:
        if self.path.startswith("/v1") and not self._authorized():
            return
        if self.path == "/health":
            if self.sim.loading():
                self._send(503, {"error": {"message": "Loading model", "code": 503}})
            else:
                self._send(200, {"status": "ok"})
        elif self.path == "/slots":
            self._send(200, self.sim.slots())
        elif self.path == "/v1/models":
            if self._throttled():
                return
            args = self.sim.args
            ids = [args.model, *filter(None, args.extra_models.split(","))]
            self._send(200, {"object": "list", "data": [
                {"id": m, "object": "model", "owned_by": "autopilot-demo-sim"} for m in ids]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send(400, {"error": "bad json"})
            return
        if not self._authorized():
            return
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": "not found"})
            return
        if self.sim.loading():
            self._send(503, {"error": {"message": "Loading model"}})
            return
        if self._throttled():
            return
        refused = self.sim.refusal(req)
        if refused is not None:
            self._send(400, refused)
            return
        self._send(200, self.sim.completion(req, self.sim.generate()))


def make_handler(args: argparse.Namespace) -> type[BaseHTTPRequestHandler]:
    """A handler class for one server, over one simulated state."""
    return type("Handler", (SimHandler,), {"sim": Sim(args)})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="SIMULATED OpenAI-compatible endpoint (demo)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="demo-sim-1")
    parser.add_argument("--seed", default=os.environ.get("AUTOPILOT_DEMO_SEED", "7"))
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--startup-delay", type=float, default=0.0)
    # Also from the env, so one replica of several can be the faulty one (replica_env).
    parser.add_argument("--crash-after", type=int,
                        default=int(os.environ.get("AUTOPILOT_DEMO_CRASH_AFTER") or 0))
    parser.add_argument("--never-ready", action="store_true")
    # fault knob: list --model but answer as another (a router serving the wrong model)
    parser.add_argument("--answer-as", default=os.environ.get("AUTOPILOT_DEMO_ANSWER_AS", ""))
    parser.add_argument("--gzip", action="store_true",
                        default=bool(os.environ.get("AUTOPILOT_DEMO_GZIP")),
                        help="fault knob: gzip every completion, whatever Accept-Encoding said")
    parser.add_argument("--parallel", type=int, default=4, help="slots shown by /slots")
    parser.add_argument("--max-model-len", type=int, default=0,
                        help="refuse prompt + max_tokens above this, as vLLM does (0: never)")
    parser.add_argument("--ctx-size", type=int, default=0,
                        help="llama-server's -c: split over --parallel; a prompt over a slot's "
                         "share is refused with HTTP 400 (0: never)")
    parser.add_argument("--chat-template-kwargs", default="",
                        help='JSON, e.g. {"enable_thinking": true}: reasoning in-band')
    parser.add_argument("--require-key-env", default="")
    parser.add_argument("--extra-models", default="",
                        help="more ids for /v1/models, comma separated")
    parser.add_argument("--throttle-every", type=int, default=0,
                        help="fault knob: after every K-th chat request, answer 429 for a while")
    parser.add_argument("--throttle-secs", type=float, default=2.0,
                        help="how long each 429 burst lasts")
    parser.add_argument("--no-retry-after", action="store_true",
                        help="send 429s without a Retry-After header")
    args = parser.parse_args(argv)
    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer.daemon_threads = True
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args))
    print(f"demo-sim endpoint (SIMULATED) listening on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
