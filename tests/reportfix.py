"""Runs on disk for the report's golden tests: per-cell artifacts + journal + plan.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autopilot.loader import load_preset
from autopilot.state import resolved

ROOT = Path(__file__).resolve().parent.parent
PRESET = ROOT / "tests" / "presets" / "report-fixture.toml"
TASKS = ["t_alpha", "t_beta", "t_gamma"]
ARMS = ["fx-nothink", "fx-think"]


def build(state: Path, n: int, verdicts: dict[str, Any], *, usage: bool = True,
          preset: Path = PRESET, finish: str = "stop") -> Path:
    """verdicts: cell -> word (grade verdict) | ("INVALID", reason) attempts list."""
    cells = state / "cells"
    cells.mkdir(parents=True)
    # As a run records it: the resolved preset beside plan.json, its sha256 in it.
    digest, _ = resolved.write(state, load_preset(str(preset)))
    (state / "plan.json").write_text(json.dumps({
        "preset": "report-fixture", "preset_path": str(preset), "target_n": n,
        "tasks": TASKS, "arms": ARMS, "resolved_sha256": digest}))
    evs = []
    for i, (cid, spec) in enumerate(sorted(verdicts.items())):
        attempts = spec if isinstance(spec, list) else [spec]
        for k, a in enumerate(attempts, start=1):
            evs.append({"event": "cell_started", "cell": cid, "attempt": k})
            if isinstance(a, tuple) and a[0] == "QUARANTINE":
                evs.append({"event": "cell_quarantined", "cell": cid})
                continue
            if isinstance(a, tuple):
                evs.append({"event": "cell_verdict", "cell": cid, "attempt": k,
                            "verdict": "INVALID", "reason": a[1]})
                continue
            masked = a.endswith("*")
            word = a.rstrip("*")
            out = cells / cid
            out.mkdir(exist_ok=True)
            summary = {"finish_reason": "length" if i % 5 == 4 else finish, "iterations": 3}
            if usage:
                summary |= {"total_prompt_tokens": 1000 + i, "total_completion_tokens": 100 + i}
            else:
                summary |= {"total_completion_tokens": 1}
            (out / "summary.json").write_text(json.dumps(summary))
            (out / "grade.json").write_text(json.dumps({"verdict": word}))
            evs.append({"event": "cell_verdict", "cell": cid, "attempt": k,
                        "verdict": "FAIL" if word == "FAIL" else "PASS",
                        "teardown_masked": masked})
    with (state / "journal.jsonl").open("w") as f:
        for ev in evs:
            f.write(json.dumps({"ts": "2026-11-01T10:00:00+00:00", **ev}) + "\n")
    return state


def cid(task: str, arm: str, n: int) -> str:
    return f"{task}_{arm}_v{n}"


def complete_run(state: Path, **kw: Any) -> Path:
    pattern = {"t_alpha": "PPPPP", "t_beta": "FFPFF", "t_gamma": "PPPFF"}
    think = {"t_alpha": "PPPPP", "t_beta": "PPPPF", "t_gamma": "PPPPP"}
    v = {}
    for arm, pat in (("fx-nothink", pattern), ("fx-think", think)):
        for t, s in pat.items():
            for n, ch in enumerate(s, start=1):
                v[cid(t, arm, n)] = "PASS" if ch == "P" else "FAIL"
    return build(state, 5, v, **kw)


def partial_run(state: Path) -> Path:
    v = {cid("t_alpha", "fx-nothink", 1): "PASS", cid("t_beta", "fx-nothink", 1): "FAIL",
         cid("t_gamma", "fx-nothink", 1): "STRUCTURAL_PASS"}
    return build(state, 3, v)


def trust_run(state: Path) -> Path:
    v: dict[str, Any] = {
        cid("t_alpha", "fx-nothink", 1): [("INVALID", "stall"), "PASS"],
        cid("t_beta", "fx-nothink", 1): [("INVALID", "grader_failed")] * 3 + [("QUARANTINE",)],
        cid("t_gamma", "fx-nothink", 1): "PASS*",
        cid("t_alpha", "fx-think", 1): "FAIL",
        cid("t_beta", "fx-think", 1): "MISSING_OUTPUT",
        cid("t_gamma", "fx-think", 1): "PASS",
    }
    return build(state, 1, v)
