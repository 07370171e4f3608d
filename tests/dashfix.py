"""Hand-built state dirs for the dashboard's snapshot tests (deterministic timestamps)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import psutil

TASKS = ["t_alpha", "t_beta", "t_gamma"]
ARMS = ["m-nothink", "m-think"]
XSS_TASK = "<script>document.body.setAttribute('data-pwned','1')</script>"


def _ts(i: int) -> str:
    return f"2026-11-01T10:{i // 60:02d}:{i % 60:02d}.000+00:00"


def write(state: Path, *, tasks: list[str], n: int, cells: dict[str, Any],
          phase: str, running: list[dict[str, Any]] | None = None,
          baseline: dict[str, Any] | None = None, extra_events: list[dict] | None = None,
          quarantined: tuple[str, ...] = ()) -> Path:
    """cells: cell id -> list of (verdict, reason, masked) attempts, or 'running'."""
    state.mkdir(parents=True)
    (state / "plan.json").write_text(json.dumps(
        {"preset": "fixture", "tasks": tasks, "arms": ARMS, "target_n": n, "identity": "x"}))
    evs: list[dict[str, Any]] = [{"event": "run_started", "target_n": n}]
    for cid, attempts in cells.items():
        if attempts == "running":
            evs.append({"event": "cell_started", "cell": cid, "attempt": 1, "pid": 1})
            continue
        for k, (verdict, reason, masked) in enumerate(attempts, start=1):
            evs.append({"event": "cell_started", "cell": cid, "attempt": k, "pid": 1})
            evs.append({"event": "cell_verdict", "cell": cid, "attempt": k, "verdict": verdict,
                        "reason": reason, "teardown_masked": masked})
        if cid in quarantined:
            evs.append({"event": "cell_quarantined", "cell": cid})
    evs += extra_events or []
    with (state / "journal.jsonl").open("w") as f:
        for i, ev in enumerate(evs):
            f.write(json.dumps({"ts": _ts(i), **ev}) + "\n")
    totals = {"total": len(tasks) * len(ARMS) * n}
    (state / "status.json").write_text(json.dumps({
        "schema_version": 1, "phase": phase, "preset": "fixture", "model": "m-1",
        "engine": "builtin", "target_n": n, "elapsed_secs": 754.0, "eta_secs": 300.0,
        "endpoint": {"state": "up"}, "totals": totals, "running": running or [],
        "thresholds": {"warn_secs": 90, "stuck_secs": 1200}, "baseline": baseline,
        "outcome_reason": "", "tasks_order": tasks, "arms_order": ARMS,
    }))
    # A live supervisor's heartbeat: this test process, beating hourly (never STALE here).
    me = psutil.Process()
    (state / "heartbeat.json").write_text(json.dumps({
        "pid": me.pid, "create_time": me.create_time(), "host": socket.gethostname(),
        "epoch": time.time(), "interval_secs": 3600, "phase": phase}))
    return state


def cid(task: str, arm: str, n: int) -> str:
    return f"{task}_{arm}_v{n}"


P, F = ("PASS", None, False), ("FAIL", None, False)


def partial(root: Path) -> Path:
    cells: dict[str, Any] = {
        cid("t_alpha", "m-nothink", 1): [P], cid("t_beta", "m-nothink", 1): [F],
        cid("t_gamma", "m-nothink", 1): "running", cid("t_alpha", "m-nothink", 2): "running",
    }
    return write(root / "partial", tasks=TASKS, n=3, cells=cells, phase="run:pass1",
                 running=[{"cell": cid("t_gamma", "m-nothink", 1), "frozen_secs": 125.0,
                           "tier": "WARN"},
                          {"cell": cid("t_alpha", "m-nothink", 2), "frozen_secs": 3.0,
                           "tier": "OK"}])


def complete(root: Path) -> Path:
    pattern = {"t_alpha": "PPPPP", "t_beta": "FFPFF", "t_gamma": "PPPFF"}
    cells = {}
    for arm in ARMS:
        for t, pat in pattern.items():
            for n, ch in enumerate(pat, start=1):
                cells[cid(t, arm, n)] = [P if ch == "P" else F]
    return write(root / "complete", tasks=TASKS, n=5, cells=cells, phase="COMPLETE",
                 baseline={"arm": "m-nothink", "n": 10, "passes": {"t_alpha": 9, "t_beta": 1}})


def trust(root: Path) -> Path:
    tasks = [*TASKS, XSS_TASK]
    cells: dict[str, Any] = {
        cid("t_alpha", "m-nothink", 1): [("INVALID", "stall", False), P],
        cid("t_beta", "m-nothink", 1): [("INVALID", "grader_failed", False)] * 3,
        cid("t_gamma", "m-nothink", 1): [("PASS", None, True)],
        cid("t_alpha", "m-think", 1): [("INVALID", "<b>zero_tokens</b>", False)],
        cid(XSS_TASK, "m-think", 1): [F],
    }
    return write(root / "trust", tasks=tasks, n=2, cells=cells, phase="INCOMPLETE",
                 quarantined=(cid("t_beta", "m-nothink", 1),),
                 extra_events=[{"event": "milestone", "kind": "harness_anomaly",
                                "priority": "emergency"}])


def wide(root: Path) -> Path:
    """N=20: too wide for 80 columns as one column per replicate."""
    pattern = {"t_alpha": "PPPPF PPFPP PPPPP PPFPP", "t_beta": "FFPFF FsFFF FFmFF FpFFR",
               "t_gamma": "PPPFF PPPPQ PPPPP PP..."}
    codes = {"P": P, "F": F, "p": ("PASS", None, True), "s": ("INVALID", "stall", False),
             "m": ("INVALID", "missing_output", False), "Q": ("FAIL", None, False)}
    cells: dict[str, Any] = {}
    quarantined = []
    for arm in ARMS:
        for t, pat in pattern.items():
            for n, ch in enumerate(pat.replace(" ", ""), start=1):
                if ch == ".":
                    continue
                if ch == "R":
                    cells[cid(t, arm, n)] = "running"
                    continue
                if ch == "Q":
                    quarantined.append(cid(t, arm, n))
                    cells[cid(t, arm, n)] = [("INVALID", "harness_crash", False)] * 3
                    continue
                cells[cid(t, arm, n)] = [codes[ch]]
    return write(root / "wide", tasks=TASKS, n=20, cells=cells, phase="run:pass1",
                 running=[{"cell": cid("t_beta", arm, 20), "frozen_secs": 300.0, "tier": "WARN"}
                          for arm in ARMS],
                 quarantined=tuple(quarantined))
