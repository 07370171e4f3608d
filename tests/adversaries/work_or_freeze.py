"""A harness of three minds (tests/test_watchdog_run.py, tests/test_gateway.py): ``work``
talks to the model in long non-streaming turns, writing nothing while each is in
flight; ``freeze`` writes one transcript row and then does nothing at all, with no
request of its own; ``underreport`` works and then reports half the tokens it used;
``bypass`` works against the endpoint's own port, around the gateway."""

import json
import sys
import time
import urllib.request
from pathlib import Path

behave, host, port, out, transcript = sys.argv[1:6]
if behave == "bypass":  # straight to the endpoint ({endpoint_port}), around the gateway
    behave, port = "work", sys.argv[6]
Path(out).mkdir(parents=True, exist_ok=True)
t = Path(transcript)
with t.open("a") as f:
    f.write(json.dumps({"role": "user", "content": "start"}) + "\n")
if behave == "freeze":
    time.sleep(120)
    sys.exit(0)
total = 0
for turn in range(4 if behave == "work" else 2):
    req = urllib.request.Request(
        f"http://{host}:{port}/v1/chat/completions",
        data=json.dumps({"model": "demo-sim-1", "messages": [
            {"role": "user", "content": f"turn {turn}"}]}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        doc = json.load(r)
    total += doc["usage"]["completion_tokens"]
    with t.open("a") as f:
        f.write(json.dumps({"role": "assistant", "content": "ok",
                            "completion_tokens": doc["usage"]["completion_tokens"]}) + "\n")
if behave == "underreport":
    total //= 2
Path(out, "summary.json").write_text(json.dumps({"total_completion_tokens": total}))
Path(out, "receipt.json").write_text(json.dumps({"model": "demo-sim-1"}))
