"""Adversary: one transcript row, then writes to stdout forever (alive, busy, no progress)."""

import json
import os
import sys
import time

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "transcript.jsonl"), "a") as f:
    f.write(json.dumps({"role": "assistant", "content": "start"}) + "\n")
i = 0
while True:
    print(f"still very busy {i}", flush=True)
    i += 1
    time.sleep(0.01)
