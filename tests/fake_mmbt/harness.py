#!/usr/bin/env python3
"""FAKE of the MMBT checkout's tooling/harness.py (tests only), written by us from the
published harness's facts, never its code. Same command line:

    harness.py <run_name> <task_file> --model M --port P --temperature T
               --stuck-threshold S [--input-mount DIR] --docker-socket --gpus all

Same files, beside itself: tooling/logs/<run>/receipt.json (before the loop; the served
model nested at vllm.served_model_name, the harness hash at harness.file_sha256),
transcript.jsonl (one row per model turn: type, iter, completion_tokens, content_len,
finish_reason; no message text), summary.json (model, finish_reason, iterations, token
totals, elapsed_s) and workspace_final.tar.gz of tooling/workspace/<run>/. Like the real
one it copies the input dir to tooling/workspace/_input_<run> and, finding a stale copy
there, tries `sudo rm -rf` on it: without sudo that re-run crashes (exit 1, no artifacts).
No Docker sandbox: the "agent" writes answer.txt into the workspace from the model's
FINAL answer, or nothing for a task whose prompt says NO_DELIVERABLE.
FAKE_HARNESS_HOLD=<file>: after the artifacts, wait until that file exists."""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime

ap = argparse.ArgumentParser()
ap.add_argument("run_name")
ap.add_argument("task_file")
ap.add_argument("--model", required=True)
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--temperature", type=float, default=0.0)
ap.add_argument("--stuck-threshold", type=int, default=30)
ap.add_argument("--input-mount", default=None)
ap.add_argument("--docker-socket", action="store_true")
ap.add_argument("--gpus", default=None)
a = ap.parse_args()

here = os.path.dirname(os.path.abspath(__file__))
log_dir = os.path.join(here, "logs", a.run_name)
os.makedirs(log_dir, exist_ok=True)
workspace = os.path.join(here, "workspace", a.run_name)
if os.path.exists(workspace):
    shutil.rmtree(workspace)
os.makedirs(workspace)
if a.input_mount:
    src = os.path.abspath(a.input_mount)
    if not os.path.isdir(src):
        sys.exit(f"--input-mount path does not exist: {src}")
    copy = os.path.join(here, "workspace", f"_input_{a.run_name}")
    if os.path.exists(copy):
        try:
            subprocess.run(["sudo", "rm", "-rf", copy], check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit(f"stale input copy {copy}: sudo rm -rf failed: {e}")
    shutil.copytree(src, copy)

url = f"http://127.0.0.1:{a.port}/v1/chat/completions"
task = open(a.task_file).read()
with open(os.path.join(log_dir, "receipt.json"), "w") as f:
    json.dump({"schema_version": 1, "run_name": a.run_name,
               "captured_at": datetime.now(UTC).isoformat(),
               "harness": {"path": os.path.abspath(__file__), "git_sha": None,
                           "file_sha256": hashlib.sha256(open(__file__, "rb").read()).hexdigest()},
               "task": {"path": os.path.abspath(a.task_file)},
               "vllm": {"served_model_name": a.model, "api_url": url, "containers": []},
               "sandbox": {"image": "bench-sandbox:latest",
                           "runtime": {"input_mount": a.input_mount, "gpus": a.gpus,
                                       "docker_socket": a.docker_socket}},
               "harness_loop_config": {"stuck_threshold_iters": a.stuck_threshold}}, f, indent=2)

task_id, _, rest = a.run_name.partition("_")
task_id = task_id + "_" + rest.split("_", 1)[0]
arm, n = rest.split("_", 1)[1].rsplit("_v", 1)
messages = [{"role": "system", "content": f"task={task_id} arm={arm} n={n}"},
            {"role": "user", "content": task + "\nGive your FINAL answer."}]
t0 = time.time()
finish, tokens, ptokens, content = None, 0, 0, ""
# As tooling/harness.py does: max_model_len hard-coded to 262144, and
# max_tokens = min(180000, max_model_len - prompt - 14000) (prompt: ~4 chars a token).
prompt_est = sum(len(m["content"]) for m in messages) // 4
body = json.dumps({"model": a.model, "messages": messages, "temperature": a.temperature,
                   "seed": 42, "stream": False,
                   "max_tokens": min(180000, 262144 - prompt_est - 14000)}).encode()
try:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    resp = json.loads(urllib.request.urlopen(req, timeout=600).read())
    content = resp["choices"][0]["message"]["content"] or ""
    tokens = resp["usage"]["completion_tokens"]
    ptokens = resp["usage"]["prompt_tokens"]
    finish = "model_stopped"
    row = {"t": datetime.now(UTC).isoformat(), "iter": 1, "type": "model",
           "completion_tokens": tokens, "prompt_tokens": ptokens, "content_len": len(content),
           "tool_calls": [], "finish_reason": resp["choices"][0].get("finish_reason")}
except (urllib.error.URLError, TimeoutError) as e:
    finish = f"api_error: {e}"
    row = {"t": datetime.now(UTC).isoformat(), "iter": 1, "type": "error", "error": str(e)}
with open(os.path.join(log_dir, "transcript.jsonl"), "a") as f:
    f.write(json.dumps(row) + "\n")
if "FINAL:" in content and "NO_DELIVERABLE" not in task:
    with open(os.path.join(workspace, "answer.txt"), "w") as f:
        f.write(content.rsplit("FINAL:", 1)[1].strip())
with open(os.path.join(log_dir, "summary.json"), "w") as f:
    json.dump({"started_at": datetime.fromtimestamp(t0, UTC).isoformat(),
               "ended_at": datetime.now(UTC).isoformat(), "elapsed_s": round(time.time() - t0, 1),
               "iterations": 1, "total_completion_tokens": tokens,
               "total_prompt_tokens": ptokens, "model": a.model, "finish_reason": finish,
               "done_summary": None}, f, indent=2)
with tarfile.open(os.path.join(log_dir, "workspace_final.tar.gz"), "w:gz") as tf:
    tf.add(workspace, arcname=".")
hold = os.environ.get("FAKE_HARNESS_HOLD")
while hold and not os.path.exists(hold):
    time.sleep(0.05)
