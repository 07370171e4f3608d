"""Adversary: the demo harness, then one of its outputs replaced by something that hurts
a reader (argv[1] names which), as a broken or malicious harness would leave it.

  fifo      summary.json becomes a FIFO nobody writes (a blocking open hangs for good)
  zero      summary.json becomes a symlink to /dev/zero (a whole read never ends)
  bigint    total_prompt_tokens becomes a 401-digit integer (no float holds it)
  none      leave the outputs alone
"""

import json
import os
import subprocess
import sys

mode, out, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
code = subprocess.call([sys.executable, "-m", "autopilot.demo.harness", *rest])
summary = os.path.join(out, "summary.json")
if code == 0 and mode in ("fifo", "zero"):
    os.unlink(summary)
    if mode == "fifo":
        os.mkfifo(summary)
    else:
        os.symlink("/dev/zero", summary)
elif code == 0 and mode == "bigint":
    with open(summary) as f:
        doc = json.load(f)
    doc["total_prompt_tokens"] = int("1" + "0" * 400)
    with open(summary, "w") as f:
        f.write(json.dumps(doc))
sys.exit(code)
