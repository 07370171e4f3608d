"""``autopilot regrade``: re-run the grader on finished cells, never the harness.

After a grader is fixed (or a missing helper appears), the outputs of every finished
attempt are still on disk: an hour of GPU work per cell that must not be re-spent. This
re-grades them in place and journals each result as a new ``cell_verdict`` of the *same*
attempt with ``regrade: true``, so the ledger replaces the old verdict and nothing is
counted twice. It takes the run lock (a supervisor driving the run is exit 3) and touches
only cells whose verdict came from grading (PASS, FAIL or ungraded): an INVALID run is a
harness matter and stays for the supervisor to re-run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autopilot.cell.grading import judge_cell
from autopilot.cell.validity import RunOutcome, attempt_outcomes
from autopilot.config import Preset
from autopilot.plan import Plan, cell_context
from autopilot.state.eventbase import record_of
from autopilot.state.fsutil import atomic_write_json, parse_iso
from autopilot.state.journal import Journal, state_events
from autopilot.state.ledger import Ledger
from autopilot.state.lock import RunLock
from autopilot.templates import render

REGRADABLE = ("PASS", "FAIL", "ungraded")


@dataclass(frozen=True)
class Regraded:
    cell: str
    attempt: int
    before: str
    after: str


SLACK_SECS = 1.0  # journal times are cut to the millisecond; clocks of nodes may differ a little


def attempt_ends(events: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    """When each attempt's harness was last heard of: its latest event before any
    regrade (its exit, its first verdict)."""
    out: dict[tuple[str, int], float] = {}
    for event in events:
        cid, k, ts = event.get("cell"), event.get("attempt"), parse_iso(event.get("ts"))
        if isinstance(cid, str) and type(k) is int and ts is not None \
                and not event.get("regrade"):
            out[(cid, k)] = max(out.get((cid, k), ts), ts)
    return out


def written_after(paths: list[Path], end: float | None) -> str | None:
    """The first of ``paths`` modified after ``end`` (None: all are from before it)."""
    if end is None:
        return None
    for path in paths:
        try:
            if path.stat().st_mtime > end + SLACK_SECS:
                return str(path)
        except OSError:
            continue
    return None


def _label(status: str, reason: str | None) -> str:
    return f"ungraded({reason})" if status == "ungraded" else status


async def regrade(
    preset: Preset, plan: Plan, state_dir: Path, *, task: str | None = None,
    arm: str | None = None, say: Callable[[str], None] = print,
) -> list[Regraded]:
    lock = RunLock(state_dir)
    lock.acquire()  # LockHeld (exit 3) while a supervisor drives the run
    journal = Journal(state_dir / "journal.jsonl")
    try:
        events = state_events(state_dir).events
        ledger = Ledger(plan)
        for event in events:
            ledger.apply(event)
        outcomes = attempt_outcomes(events)
        ended = attempt_ends(events)
        done: list[Regraded] = []
        for state in list(ledger.cells.values()):
            if state.status not in REGRADABLE or (task and state.task != task) \
                    or (arm and state.arm != arm):
                continue
            cell = plan.by_id[state.id]
            ctx = cell_context(preset, cell, state.attempts, state_dir)
            outcome = outcomes.get((state.id, state.attempts), RunOutcome(0, completion=True))
            completion = [Path(render(template, ctx)) for template in preset.harness.completion]
            if not all(path.exists() for path in completion):
                say(f"{state.id}: skipped, its outputs are gone ({completion[0].parent})")
                continue
            later = written_after(completion, ended.get((state.id, state.attempts)))
            if later:
                # Not this attempt's outputs: another run's, written once this one let
                # its output dirs go (autopilot.state.claims). Never graded as ours.
                why = f"{later} was written after attempt {state.attempts} ended"
                journal.append("regrade_skipped", cell=state.id, attempt=state.attempts, why=why)
                say(f"{state.id}: skipped, {why} (not this run's output)")
                continue
            before = _label(state.status, state.reason)
            result = await judge_cell(preset, ctx, outcome,
                                      state_dir / "logs" / f"{state.id}.grade.log")
            kind, fields = record_of(result.as_event(state.id, state.attempts, regrade=True), {})
            record = journal.append(kind, **fields)
            ledger.apply(record)
            after = _label(ledger.cells[state.id].status, ledger.cells[state.id].reason)
            done.append(Regraded(state.id, state.attempts, before, after))
            say(f"{state.id} (attempt {state.attempts}): {before} -> {after}"
                + (f" [{result.detail}]" if result.detail else ""))
        return done
    finally:
        journal.close()
        lock.release()


def refresh_status(preset: Preset, plan: Plan, state_dir: Path) -> dict[str, Any]:
    """status.json rebuilt from the journal after a regrade (no supervisor is running)."""
    from autopilot.run.once import snapshot_once

    snap = snapshot_once(preset, plan, state_dir)
    atomic_write_json(state_dir / "status.json", snap)
    return snap
