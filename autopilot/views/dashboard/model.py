"""What the dashboard shows, loaded read-only from a state dir.

The journal is the truth for every cell's state (the verdicts in it were read from the
grade files by the validity classifier); status.json adds what only the live supervisor
knows (phase, ETA, endpoint state, how long a running cell's transcript has been frozen).
Nothing here writes, locks, or fails on sparse data: a missing file is an empty view.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autopilot.escape import clean, finite, sane
from autopilot.plan import Cell
from autopilot.state.cellevents import CellVerdict
from autopilot.state.fsutil import parse_iso
from autopilot.state.journal import state_events
from autopilot.state.ledger import CellState, Ledger, Trust
from autopilot.state.liveness import shown
from autopilot.state.statusdoc import Status
from autopilot.state.statusdoc import read as read_status
from autopilot.state.untrusted import state_json

NOTABLE = {
    "cell_verdict", "cell_quarantined", "cell_killed", "endpoint_down", "endpoint_restart",
    "endpoint_failed", "milestone", "run_started", "run_finished", "notify_failed",
    "plan_changed", "endpoint_throttled", "launch_throttled",
}


@dataclass
class DashData:
    state_dir: Path
    status: dict[str, Any]
    tasks: list[str]
    arms: list[str]
    target_n: int
    cells: dict[str, CellState]
    trust: Trust
    events: list[dict[str, Any]] = field(default_factory=list)
    completions: list[float] = field(default_factory=list)
    baseline: dict[str, Any] | None = None
    ledger: Ledger | None = None  # the replay behind ``cells`` (metrics read its counters)
    doc: Status = field(default_factory=Status)  # ``status`` read through its schema

    def cell(self, task: str, arm: str, replicate: int) -> CellState | None:
        return self.cells.get(f"{task}_{arm}_v{replicate}")

    def matrix(self, arm: str) -> dict[str, dict[int, CellState]]:
        out: dict[str, dict[int, CellState]] = {}
        for task in self.tasks:
            row = {}
            for replicate in range(1, self.target_n + 1):
                state = self.cell(task, arm, replicate)
                if state is not None:
                    row[replicate] = state
            out[task] = row
        return out


def _epoch(ts: Any) -> float | None:
    return parse_iso(ts)


MAX_N = 10_000  # a target N beyond this in a state dir is not a run of ours


def _names(values: Any) -> list[str]:
    """Task ids / arm labels (already ``sane``): strings only, each shown as it is (a
    forged one is text in every view, never markup: see term and html)."""
    if not isinstance(values, list):
        return []
    return [v for v in values if isinstance(v, str) and v]


def _count(value: Any) -> int:
    return value if type(value) is int and 0 < value <= MAX_N else 0


def _float(value: Any) -> float:
    return finite(value)


def load(state_dir: Path, recent: int = 8) -> DashData | None:
    """The dashboard's view of ``state_dir``; None when there is no run there yet."""
    status = state_json(state_dir, "status.json")
    plan = state_json(state_dir, "plan.json")
    if not isinstance(status, dict) and not isinstance(plan, dict):
        return None
    status = sane(status) if isinstance(status, dict) else {}
    status = shown(state_dir, status) if status else status
    plan = sane(plan) if isinstance(plan, dict) else {}
    tasks = _names(plan.get("tasks") or status.get("tasks_order"))
    arms = _names(plan.get("arms") or status.get("arms_order"))
    # plan.json first: every launch records its N there before its first snapshot, and
    # validate and the report read it (a kill in between must not split the views).
    target_n = _count(plan.get("target_n")) or _count(status.get("target_n"))
    cells = [Cell(task, arm, replicate) for arm in arms
             for replicate in range(1, target_n + 1) for task in tasks]
    ledger = Ledger(cells)
    events: deque[dict[str, Any]] = deque(maxlen=max(recent, 0))  # the last few only
    completions: list[float] = []
    for raw in state_events(state_dir):
        # the ledger keeps words; views escape what they show of them
        event = ledger.apply(raw)  # typed, for the kinds it folds
        if raw["event"] in NOTABLE:
            events.append(sane(raw))  # shown as written (cleaned here, once)
        if isinstance(event, CellVerdict) and event.verdict in ("PASS", "FAIL"):
            when = _epoch(event.ts)
            if when is not None:
                completions.append(when)
    _clean_cells(ledger)
    doc = read_status(status)  # every field its type or its default
    for run in doc.running:
        state = ledger.cells.get(run.cell)
        if state is not None and state.status == "running":
            state.frozen_secs = _float(run.frozen_secs)
            state.tier = run.tier or "OK"
    return DashData(
        state_dir=state_dir, status=status, tasks=tasks, arms=arms, target_n=target_n,
        cells=ledger.cells, trust=ledger.trust(), events=list(events),
        completions=completions,
        baseline=doc.baseline, ledger=ledger, doc=doc,
    )


def _clean_cells(ledger: Ledger) -> None:
    """The words a grader or a state dir put in the journal (reasons, verdict words,
    details, caveats) cleaned once, per cell, after the replay: every view of the
    dashboard — the trust line, the grid's titles, --trend, --flips, the served page —
    then shows no escape sequence and no bidi override of theirs."""
    for state in ledger.cells.values():
        state.reasons = [clean(reason, 80) for reason in state.reasons]
        state.reason = clean(state.reason, 80) if state.reason is not None else None
        state.word = clean(state.word, 200) if state.word is not None else None
        state.caveat = clean(state.caveat, 200) if state.caveat is not None else None
        state.detail = clean(state.detail, 600)


def counts(cells: Iterable[CellState]) -> dict[str, Any]:
    """The ledger's counts in the dashboard's terms (awaiting a grade shows as running;
    ``samples``: what many-item cells scored, where there are such)."""
    tally = Ledger([]).counts(list(cells))
    out: dict[str, Any] = {
        "pass": tally.pass_, "fail": tally.fail, "invalid": tally.invalid,
        "quarantined": tally.quarantined, "ungraded": tally.ungraded,
        "running": tally.running + tally.grading, "pending": tally.pending, "valid": tally.done}
    if tally.items:
        out["samples"] = tally.items
    return out


def samples_text(tally: dict[str, Any]) -> str:
    """`` · 17/24 samples`` where a group's cells grade many items, else ""."""
    scored = tally.get("samples")
    return f" · {scored['passed']}/{scored['scored']} samples" if scored else ""
