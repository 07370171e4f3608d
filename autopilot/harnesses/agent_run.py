"""Run one agent CLI headless as a cell's harness: ``python -m
autopilot.harnesses.agent_run --agent claude --out {output_dir} --base-url {base_url}
--model claude-sonnet-4-5 --prompt-file TASK.md``.

The agent (autopilot.harnesses.agents) runs in the cell's own home (``{out}/home``:
every config and session file it writes stays in the cell), in ``{out}/work`` unless
``--workdir`` says otherwise, with its stdin closed, pointed at the cell's gateway with
the attempt's key (read from ``--key-env``, where the autopilot puts it; the provider's
key never reaches this process). Each line it prints goes to ``transcript.jsonl`` as it
comes (the watchdog's progress). When it ends, ``summary.json`` says why
(``finish_reason``), what it claims it used (``total_prompt_tokens`` cache-inclusive,
``total_completion_tokens``, ``self_reported`` by bucket, ``agent_cost_usd`` at its own
vendor's list price) — a claim the run holds against the gateway's meter, never the
count — and its answer goes to ``answer.txt``. The exit status is the agent's.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from autopilot.harnesses.agents import AGENTS
from autopilot.harnesses.agents.base import Claim, Setup

OUTPUT_CAP = 64 << 20  # bytes of the agent's output kept for reading its claim


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="run an agent CLI as a cell's harness")
    parser.add_argument("--agent", required=True, choices=sorted(AGENTS))
    parser.add_argument("--out", required=True, help="the cell's output dir")
    parser.add_argument("--workdir", default="", help="where it works (default OUT/work)")
    parser.add_argument("--base-url", required=True, help="the cell's gateway ({base_url})")
    parser.add_argument("--model", required=True, help="the model id the agent asks for")
    parser.add_argument("--prompt", default="")
    parser.add_argument("--prompt-file", default="")
    parser.add_argument("--key-env", default="OPENAI_API_KEY",
                        help="the variable holding the attempt's key")
    parser.add_argument("--max-output-tokens", type=int, default=0)
    parser.add_argument("--dialect", default="", help="the wire, for an agent that speaks several")
    parser.add_argument("--bin-dir", default="", help="where the CLI's executable is "
                        "(default: PATH)")
    parser.add_argument("--args", default="", help="more arguments for the CLI, split as a "
                        "shell would (never run by one)")
    parser.add_argument("extra", nargs="*", help="after --: the preset's own CLI arguments")
    return parser.parse_args(argv)


def _private(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def summary(agent: str, model: str, claim: Claim, code: int | None,
            elapsed: float) -> dict[str, Any]:
    tokens = claim.tokens
    finish = claim.finish
    if code != 0 and finish == "completed":
        finish = f"stopped: {agent} exited with status {code}"
    doc: dict[str, Any] = {"agent": agent, "model": model, "finish_reason": finish,
                           "exit_code": code, "elapsed_s": round(elapsed, 3),
                           "self_reported": dict(tokens), "agent_cost_usd": claim.cost_usd,
                           "agent_model": claim.model, "turns": claim.turns,
                           "answer": claim.answer[:2000]}
    # Only what it said: a count it did not give is not a claim of zero.
    if any(bucket in tokens for bucket in ("input", "cache_write", "cache_read")):
        doc["total_prompt_tokens"] = sum(tokens.get(bucket, 0)
                                         for bucket in ("input", "cache_write", "cache_read"))
    if "output" in tokens:
        doc["total_completion_tokens"] = tokens["output"]
    return doc


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    agent = AGENTS[args.agent]
    out = Path(args.out)
    home = _private(out / "home")
    work = _private(Path(args.workdir) if args.workdir else out / "work")
    prompt = Path(args.prompt_file).read_text() if args.prompt_file else args.prompt
    if not prompt.strip():
        print("agent_run: no prompt (--prompt or --prompt-file)", file=sys.stderr)
        return 2
    binary = (str(Path(args.bin_dir) / agent.binary) if args.bin_dir
              else shutil.which(agent.binary) or agent.binary)
    setup = Setup(home=home, workdir=work, base_url=args.base_url.rstrip("/"),
                  key=os.environ.get(args.key_env, ""), model=args.model, prompt=prompt,
                  max_output_tokens=args.max_output_tokens or None, dialect=args.dialect or None,
                  extra=(*shlex.split(args.args), *args.extra))
    launch = agent.launch(setup, binary)
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_DATA_HOME": str(home / ".local/share"),
           "XDG_CACHE_HOME": str(home / ".cache"), "XDG_STATE_HOME": str(home / ".local/state"),
           # PWD too: a CLI that reads it (opencode) would take the supervisor's
           # directory for its project
           "PWD": str(work), "NO_COLOR": "1", **launch.env}
    t0 = time.monotonic()
    kept: list[bytes] = []
    size = 0
    code: int | None
    try:
        proc = subprocess.Popen(launch.argv, cwd=work, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE)
    except OSError as e:
        print(f"agent_run: cannot start {binary}: {e.strerror}", file=sys.stderr)
        _write_json(out / "summary.json", summary(args.agent, args.model, Claim(
            error=f"cannot start {agent.binary}: {e.strerror}"), None, 0.0))
        return 127
    # A stop of this process is the agent's stop: pass it on, then let it end.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: proc.send_signal(s))
    assert proc.stdout is not None
    with open(out / "transcript.jsonl", "ab", buffering=0) as transcript:
        for line in proc.stdout:
            transcript.write(line)
            if size < OUTPUT_CAP:
                kept.append(line)
                size += len(line)
    code = proc.wait()
    text = b"".join(kept).decode("utf-8", "replace")
    claim = agent.claim(text)
    (out / "answer.txt").write_text(claim.answer)
    _write_json(out / "summary.json", summary(args.agent, args.model, claim, code,
                                              time.monotonic() - t0))
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
