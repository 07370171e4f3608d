"""FAKE origin harness (tests only), with the interface of the origin's tooling/harness.py:

    harness.py <cell> <task_file> --model M --port P --temperature T --stuck-threshold S
               [--input-mount DIR] --docker-socket --gpus all

Talks to the endpoint on 127.0.0.1:P, writes logs/<cell>/receipt.json before the loop,
transcript.jsonl per turn, then summary.json and workspace_final.tar.gz (the workspace
holds answer.txt), all beside this file, as the origin does."""

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("cell")
ap.add_argument("task_file")
ap.add_argument("--model", required=True)
ap.add_argument("--port", required=True)
ap.add_argument("--temperature", type=float, default=0.3)
ap.add_argument("--stuck-threshold", type=int, default=500)
ap.add_argument("--input-mount", default=None)
ap.add_argument("--docker-socket", action="store_true")
ap.add_argument("--gpus", default=None)
a = ap.parse_args()

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "logs", a.cell)
os.makedirs(out, exist_ok=True)
url = f"http://127.0.0.1:{a.port}/v1/chat/completions"
with open(os.path.join(out, "receipt.json"), "w") as f:
    json.dump({"model": a.model, "api_url": url, "temperature": a.temperature,
               "stuck_threshold": a.stuck_threshold, "input_mount": a.input_mount,
               "thinking": os.environ.get("BENCH_THINKING"),
               "harness_sha256": hashlib.sha256(open(__file__, "rb").read()).hexdigest()}, f)
task = os.path.basename(a.task_file).removesuffix(".md")
arm = a.cell[len(task) + 1:].rsplit("_v", 1)[0]
n = a.cell.rsplit("_v", 1)[1]
msgs = [{"role": "system", "content": f"task={task} arm={arm} n={n}"},
        {"role": "user", "content": "Give your FINAL answer."}]
t0 = time.time()
req = urllib.request.Request(url, data=json.dumps({"model": a.model, "messages": msgs}).encode(),
                             headers={"Content-Type": "application/json"})
resp = json.loads(urllib.request.urlopen(req, timeout=30).read())
content = resp["choices"][0]["message"]["content"]
usage = resp["usage"]
with open(os.path.join(out, "transcript.jsonl"), "a") as f:
    f.write(json.dumps({"role": "assistant", "content": content, **usage}) + "\n")
buf = io.BytesIO(content.removeprefix("FINAL:").strip().encode())
with tarfile.open(os.path.join(out, "workspace_final.tar.gz"), "w:gz") as tf:
    info = tarfile.TarInfo("answer.txt")
    info.size = len(buf.getvalue())
    tf.addfile(info, buf)
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump({"finish_reason": "stop", "iterations": 1,
               "total_prompt_tokens": usage["prompt_tokens"],
               "total_completion_tokens": usage["completion_tokens"],
               "elapsed_s": round(time.time() - t0, 3), "model": resp.get("model")}, f)
sys.exit(0)
