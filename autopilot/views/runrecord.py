"""What a run's own record says about how it ran, for the findings report: plan and
benchmark changes, what served the model, the gateway's errors, who the harnesses ran
as. Read from the state dir (untrusted: shape-checked, escaped for markdown)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from autopilot.escape import md
from autopilot.state.cellevents import CellMetered
from autopilot.state.journal import state_events
from autopilot.state.runevents import PlanChanged


def plan_changes(state_dir: Path) -> list[tuple[str, str, str]]:
    """(when, old identity, new identity) of every plan change the journal records (a
    resume with --allow-plan-change relabels earlier verdicts under the new preset)."""
    return [(md(event.ts, 40), md(event.old, 40), md(event.new, 40))
            for event in state_events(state_dir).typed() if isinstance(event, PlanChanged)]


def recorded_pins(state_dir: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The benchmark files' digests recorded in plan.json (autopilot.run.drift), and
    (when, files) of every ``benchmark_drift`` the journal records; shape-checked and
    markdown-safe (plan.json is a state file: untrusted)."""
    from autopilot.state.untrusted import state_json

    rec = state_json(state_dir, "plan.json")
    raw = rec.get("benchmark_files") if isinstance(rec, dict) else None
    pins = [(md(k, 300), md(v, 80) if isinstance(v, str) else "missing")
            for k, v in list(raw.items())[:200]] if isinstance(raw, dict) else []
    drifts = [(md(event.get("ts"), 40), md(", ".join(map(str, files))[:600], 600))
              for event in state_events(state_dir)
              if event.get("event") == "benchmark_drift"
              and isinstance(files := event.get("files"), dict)]
    return pins, drifts


def endpoint_record(state_dir: Path) -> list[str]:
    """What served the model at the latest launch (identity.jsonl ``endpoint``), as
    markdown list items; shape-checked and escaped (a state file: untrusted)."""
    import json

    from autopilot.state.untrusted import lines, owner_of

    last: Any = None
    for raw in lines(state_dir / "identity.jsonl", owner_of(state_dir)):
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("endpoint"), dict):
            last = rec["endpoint"]
    if not isinstance(last, dict):
        return []
    out = [f"- engine: {md(last.get('engine'), 40)}"]
    for key in ("binary", "libraries", "model", "image_id"):
        part = last.get(key)
        if isinstance(part, dict):
            out.append(f"- {key}: " + ", ".join(f"{md(k, 60)} {md(v, 300)}"
                                                 for k, v in list(part.items())[:16]))
    if isinstance(last.get("image"), str):
        out.append(f"- image: {md(last['image'], 300)}")
    gpus = last.get("gpus")
    if isinstance(gpus, list):
        out += ["- gpu: " + ", ".join(f"{md(k, 20)} {md(v, 80)}" for k, v in
                                       list(gpu.items())[:6]) for gpu in gpus[:16]
                if isinstance(gpu, dict)]
    return out


def gateway_errors(state_dir: Path) -> dict[str, int]:
    """Every attempt's gateway errors by kind (cell_metered), summed; shape-checked."""
    total: Counter[str] = Counter()
    for event in state_events(state_dir).typed():
        errors = event.errors if isinstance(event, CellMetered) else None
        if isinstance(errors, dict):
            total.update({md(k, 40): v for k, v in errors.items()
                          if type(v) is int and 0 < v < 10**9})
    return dict(sorted(total.items()))


def isolation(state_dir: Path) -> list[str]:
    """Who the latest launch's harnesses ran as and how they were contained (its
    ``run_started``), as markdown list items; shape-checked (the journal is untrusted)."""
    last: Any = None
    for event in state_events(state_dir):
        if event.get("event") == "run_started" and isinstance(event.get("harness_user"), dict):
            last = event
    if last is None:
        return ["- harness user: not journaled (a launch before harness.user existed)"]
    who = last["harness_user"]
    mode = {"cell": "a uid of its own per live cell", "same": "the supervisor's user"}.get(
        who.get("mode"), "unknown")
    out = [f"- harness user: {mode} ({md(who.get('why'), 300)})"]
    if who.get("mode") == "same":
        out[0] += ": a harness could read the run's token and rewrite its journal"
    if isinstance(last.get("containment"), str):
        out.append(f"- {md(last['containment'], 300)}")
    return out
