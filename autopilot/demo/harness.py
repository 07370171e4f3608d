"""Demo harness: one cell against the (simulated) endpoint, like the origin harness.py.

Writes, under ``--out``: ``receipt.json`` before the loop (requested model, API URL,
temperature, this file's sha256), ``transcript.jsonl`` one row per turn with token
counts, the deliverable ``answer.txt``, then ``summary.json`` (``finish_reason``,
``iterations``, token totals, ``elapsed_s``, served ``model``) and ``timing.json``.

With ``--prompt`` it is a plain single-turn harness for a *real* model (the
``tiny-llamacpp`` preset): the prompt goes out as is and the reply is the deliverable.

Fault knob ``--hang-share``: on a cell's first attempt, that share of cells freeze after
one turn and sleep forever (a stuck cell for the watchdog to kill; the retry heals).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autopilot.demo import unit
from autopilot.lazyimport import httpx as _import_httpx

if TYPE_CHECKING:
    import httpx
else:  # without its CLI's imports: ~85 ms per cell (autopilot.lazyimport)
    httpx = _import_httpx()


def _append(path: Path, row: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()


def _write(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


class RateLimited(Exception):
    """The provider kept answering 429 past the harness's patience."""


def _chat(client: httpx.Client, url: str, body: dict[str, Any], retry_secs: float,
          rate_limit_secs: float) -> Any:
    deadline = time.monotonic() + retry_secs
    limited_since: float | None = None
    while True:
        wait = 0.2
        try:
            resp = client.post(url, json=body)
            if resp.status_code == 200:
                return resp.json()
            err = f"HTTP {resp.status_code}"
            if resp.status_code == 429:
                # A well-behaved client: wait as told (Retry-After), up to its patience.
                now = time.monotonic()
                limited_since = limited_since or now
                if now - limited_since >= rate_limit_secs:
                    raise RateLimited(f"HTTP 429 for {now - limited_since:.0f}s")
                try:
                    wait = min(30.0, float(resp.headers.get("Retry-After") or 1.0))
                except ValueError:
                    wait = 1.0
                print(f"rate limited (429), retrying in {wait:g}s", flush=True)
                deadline = max(deadline, now + wait + retry_secs)
        except httpx.HTTPError as e:
            err = type(e).__name__
        if time.monotonic() >= deadline:
            print(f"endpoint unreachable: {err}", file=sys.stderr, flush=True)
            sys.exit(3)
        time.sleep(wait)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="bench-autopilot demo harness")
    parser.add_argument("cell")
    parser.add_argument("--task", required=True)
    parser.add_argument("--arm", required=True)
    parser.add_argument("--n", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", default="7")
    parser.add_argument("--attempt", type=int, default=1)
    parser.add_argument("--think-secs", type=float, default=0.05)
    parser.add_argument("--hang-share", type=float, default=0.0)
    parser.add_argument("--retry-secs", type=float, default=8.0)
    parser.add_argument("--rate-limit-secs", type=float, default=20.0,
                        help="give up (finish_reason 'rate_limited: ...') after 429s this long")
    parser.add_argument("--temperature", type=float, default=0.3)
    parser.add_argument("--timeout", type=float, default=30.0, help="per request, seconds")
    parser.add_argument("--base-url", default="", help="OpenAI-compatible base URL (…/v1); "
                        "overrides --host/--port")
    parser.add_argument("--api-key-env", default="", help="NAME of the env var with the API key")
    parser.add_argument("--prompt", default="", help="a real single-turn prompt (for a real "
                        "model) instead of the simulator's scripted conversation")
    parser.add_argument("--max-tokens", type=int, default=0)
    args = parser.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    base = args.base_url.rstrip("/") or f"http://{args.host}:{args.port}/v1"
    url = f"{base}/chat/completions"
    # Like the OpenAI clients: the key from $OPENAI_API_KEY (the autopilot puts the
    # attempt's gateway key there), or from the variable --api-key-env names.
    key = (os.environ.get(args.api_key_env, "") if args.api_key_env else "") \
        or os.environ.get("OPENAI_API_KEY", "")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    _write(out / "receipt.json", {
        "cell": args.cell, "model": args.model, "api_url": url, "temperature": args.temperature,
        "stuck_threshold": None,
        "harness_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    })
    transcript = out / "transcript.jsonl"
    print(f"cell {args.cell} attempt {args.attempt} starting", flush=True)
    turns = 1 if args.prompt else 2 + int(unit(args.seed, "turns", args.cell) * 3)
    hang = args.attempt == 1 and unit(args.seed, "hang", args.cell) < args.hang_share
    system = f"You are a demo agent. task={args.task} arm={args.arm} n={args.n}"
    messages: list[dict[str, Any]] = [] if args.prompt else [{"role": "system", "content": system}]
    tot_p = tot_c = 0
    served = args.model
    content = ""
    finish_reason = "stop"
    with httpx.Client(timeout=args.timeout, trust_env=False, headers=headers) as client:
        for turn in range(1, turns + 1):
            final = turn == turns
            user = "Give your FINAL answer." if final else f"Continue with step {turn}."
            messages.append({"role": "user", "content": args.prompt or user})
            body: dict[str, Any] = {"model": args.model, "messages": messages,
                                    "temperature": args.temperature}
            if args.max_tokens:
                body["max_tokens"] = args.max_tokens
            try:
                resp = _chat(client, url, body, args.retry_secs, args.rate_limit_secs)
            except RateLimited as e:
                # Said in its own summary, as a real harness reports an endpoint error:
                # the autopilot classifies it INVALID(rate_limited) and retries the cell.
                print(f"giving up: {e}", flush=True)
                finish_reason = f"rate_limited: {e}"
                break
            choice = resp["choices"][0]
            content = choice["message"].get("content") or ""
            finish_reason = choice.get("finish_reason") or "stop"
            usage = resp.get("usage", {})
            served = resp.get("model", served)
            tot_p += int(usage.get("prompt_tokens", 0))
            tot_c += int(usage.get("completion_tokens", 0))
            messages.append({"role": "assistant", "content": content})
            _append(transcript, {"turn": turn, "role": "assistant", "content": content,
                                 "prompt_tokens": usage.get("prompt_tokens"),
                                 "completion_tokens": usage.get("completion_tokens"),
                                 "ts": time.time()})
            if hang:
                print("fault knob: hanging (frozen transcript)", flush=True)
                while True:
                    time.sleep(3600)
            time.sleep(args.think_secs)
    answer = content.strip() if args.prompt else content.removeprefix("FINAL:").strip()
    (out / "answer.txt").write_text(answer + "\n")
    _write(out / "summary.json", {
        "finish_reason": finish_reason, "iterations": turns, "total_prompt_tokens": tot_p,
        "total_completion_tokens": tot_c, "elapsed_s": round(time.time() - t0, 3),
        "model": served,
    })
    _write(out / "timing.json", {"start": t0, "stop": time.time(), "pid": os.getpid()})
    print(f"cell {args.cell} done: {answer}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
