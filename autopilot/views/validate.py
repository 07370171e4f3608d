"""Postflight: the same fail-closed classification, re-done over what is on disk.

``autopilot validate`` re-reads every cell's artifacts (completion files, token and arm
evidence, the grade file; it never re-runs a grader) together with the journal's record
of how each attempt ended, and reports every cell that cannot be trusted. It also flags
grade or summary files in directories that map to no cell of the plan — the origin's
"arm-less directory" bug signature (a run whose arm label was lost wrote its scores
where no aggregate would ever look).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autopilot.cell.grading import missing_requirements, read_checks
from autopilot.cell.validity import (
    Checks,
    GradeOutcome,
    RunOutcome,
    by_gateway,
    classify,
    evidence_of,
    grader_unavailable,
)
from autopilot.config import Preset
from autopilot.escape import clean, term
from autopilot.plan import Plan, cell_context
from autopilot.state.cellevents import CellExited, CellMetered, CellRan, CellSpawning, CellStarted
from autopilot.state.claims import released_at
from autopilot.state.eventbase import CellEventBase
from autopilot.state.fsutil import parse_iso, read_json
from autopilot.state.journal import state_events
from autopilot.state.ledger import Ledger
from autopilot.templates import render

ARTIFACT_NAMES = ("grade.json", "summary.json")


@dataclass
class CellCheck:
    cell: str
    verdict: str  # PASS / FAIL / INVALID / ABSENT / RUNNING / PENDING (no verdict yet)
    reason: str = ""
    detail: str = ""
    caveat: str | None = None


@dataclass
class ValidationResult:
    cells: list[CellCheck] = field(default_factory=list)
    armless: list[str] = field(default_factory=list)
    foreign: int = 0  # such directories written outside this run's attempts: not ours
    in_progress: bool = False  # a live supervisor drives the run: running cells wait

    @property
    def invalid(self) -> list[CellCheck]:
        return [check for check in self.cells if check.verdict == "INVALID"]

    @property
    def ok(self) -> bool:
        return not self.invalid and not self.armless


def validate_run(preset: Preset, plan: Plan, state_dir: Path,
                 in_progress: bool = False) -> ValidationResult:
    """``in_progress``: a live supervisor drives the run, so a cell it is running is
    reported RUNNING, not judged from half-written outputs."""
    ledger, last_outcome, spans, metered = _fold(plan, state_dir)
    result = ValidationResult(in_progress=in_progress)
    # Outputs let go (autopilot release): a next run may have moved or rewritten them, so
    # a cell with a verdict keeps it as journaled instead of being judged from them.
    released = released_at(state_dir)
    for cell in plan.cells:
        state = ledger.cells[cell.id]
        ctx = cell_context(preset, cell, max(1, state.attempts), state_dir)
        out_dir = Path(ctx["output_dir"])
        phase = state.phase
        if released and state.status in ("PASS", "FAIL", "invalid"):
            result.cells.append(CellCheck(
                cell.id, state.status.upper(), state.reason or "",
                f"released {clean(released, 40)}: as journaled (its outputs may be "
                "another run's now)"))
            continue
        if phase == "quarantined":
            reason, detail = (clean(state.reasons[-1] if state.reasons else "", 40),
                              clean(state.detail, 300))
            result.cells.append(CellCheck(
                cell.id, "INVALID", "quarantined",
                f"after {state.invalid_attempts} INVALID attempts; last: "
                f"{reason}{': ' + detail if detail else ''}"))
            continue
        if in_progress and phase == "running":
            result.cells.append(CellCheck(cell.id, "RUNNING"))
            continue
        # What the journal says, first: a cell abandoned by a stopping (or restarted)
        # supervisor, or one whose supervisor died mid-attempt (kill -9), has no verdict
        # yet. Its half-written outputs are no evidence: a resume adopts or re-runs it.
        if state.abandoned is not None:
            result.cells.append(CellCheck(cell.id, "PENDING", "abandoned",
                                          clean(state.abandoned, 120)))
            continue
        if phase == "running" and ledger.handed_over:
            result.cells.append(CellCheck(
                cell.id, "RUNNING", "handed_over",
                "under its data path; the next supervisor re-attaches to it"))
            continue
        if phase == "running":
            result.cells.append(CellCheck(
                cell.id, "PENDING", "interrupted",
                "its supervisor died mid-attempt; a resume adopts or re-runs it"))
            continue
        if phase == "ran":
            # The journal has no verdict for it: judging its outputs here would call it
            # grader_failed while the run (a resume) grades it.
            result.cells.append(CellCheck(
                cell.id, "PENDING", "grading",
                "its harness ended and it is being graded" if in_progress else
                "its harness ended before its supervisor stopped; a resume grades it"))
            continue
        if state.attempts == 0 and not out_dir.exists():
            result.cells.append(CellCheck(cell.id, "ABSENT"))
            continue
        completion = all(Path(render(judged, ctx)).exists() for judged in preset.harness.completion)
        rec = last_outcome.get(cell.id, {})
        outcome = RunOutcome(
            exit_code=rec.get("exit_code", 0 if completion else None),
            killed=rec.get("killed"), completion=completion,
            endpoint_down=bool(rec.get("endpoint_down")), kill_reason=rec.get("kill_reason"),
            disk_low=bool(rec.get("disk_low")), working=rec.get("working") is True,
            # a state file's: shape-checked where it is read (autopilot.state.items)
            finished=rec.get("finished") if isinstance(rec.get("finished"), dict) else None,
        )
        grade_path = Path(ctx["grade_file"])
        grade = (GradeOutcome(True, grade=read_json(grade_path)) if grade_path.exists()
                 else GradeOutcome(False, "no grade file"))
        checks = read_checks(preset, ctx) if completion else Checks()
        judged = classify(outcome, grade, preset.grader.verdicts, checks,
                          preset.grader.verdict_field)
        missing = missing_requirements(preset, cell.task, ctx)
        if judged.grade_side and missing:  # not a broken grader: one that cannot run here
            judged = grader_unavailable(missing)
        seen = evidence_of(metered.get(cell.id))
        if seen is not None:  # as the run judged it: the gateway's evidence counts too
            unread = (metered.get(cell.id) or {}).get("unmetered")
            if type(unread) is not int or unread < 0:
                unread = 0
            judged = by_gateway(judged, outcome, seen, unread=unread,
                                required=preset.gateway.require_metering,
                                policy=preset.trust.count)
        result.cells.append(CellCheck(cell.id, judged.verdict, judged.reason or "", judged.detail,
                                      judged.caveat))
    result.armless, result.foreign = armless_dirs(preset, plan, state_dir,
                                                  list(spans.values()))
    return result


Evidence = tuple[Ledger, dict[str, dict[str, Any]], dict[tuple[str, int], list[float]],
                 dict[str, dict[str, Any]]]


def _fold(plan: Plan, state_dir: Path) -> Evidence:
    """Where each cell stands is the ledger's fold of the journal (autopilot.state.ledger),
    the same one the dashboard, the report and the supervisor read; what is collected
    beside it is evidence for re-judging the outputs: each cell's last outcome, each
    attempt's first and last event, the gateway's evidence of its latest attempt."""
    ledger = Ledger(plan)
    last_outcome: dict[str, dict[str, Any]] = {}
    spans: dict[tuple[str, int], list[float]] = {}
    metered: dict[str, dict[str, Any]] = {}
    for event in state_events(state_dir).typed():
        ledger.apply(event)
        if not isinstance(event, CellEventBase) or not event.cell:
            continue
        cid, ts = event.cell, parse_iso(event.ts)
        if ts is not None:
            key = (cid, event.attempt if event.attempt is not None else
                   max(1, ledger.cells[cid].attempts if cid in ledger.cells else 1))
            span = spans.setdefault(key, [ts, ts])
            span[0], span[1] = min(span[0], ts), max(span[1], ts)
        match event:
            case CellSpawning() | CellStarted():
                last_outcome.pop(cid, None)
                metered.pop(cid, None)
            case CellExited() | CellRan() if isinstance(event.outcome, dict):
                last_outcome[cid] = event.outcome
            case CellMetered():
                metered[cid] = event.model_dump(by_alias=True)
    return ledger, last_outcome, spans, metered


SPAN_SLACK = 0.05  # seconds around an attempt's journaled span (its ts are cut to ms)


def armless_dirs(preset: Preset, plan: Plan, state_dir: Path,
                 spans: list[list[float]]) -> tuple[list[str], int]:
    """Directories beside the cells' output dirs, holding grade/summary files, whose name
    is no cell of this plan's tasks x arms (any replicate number), written while one of
    this run's attempts ran (``spans``: each attempt's first and last journaled event).
    An output root is claimed by one run at a time (autopilot.state.claims), so files
    written outside every attempt of this run are another run's (or older): counted, not
    flagged. Returns (flagged, foreign)."""
    def ours(mtime: float) -> bool:
        return any(first - SPAN_SLACK <= mtime <= last + SPAN_SLACK for first, last in spans)

    tasks = "|".join(re.escape(task.id) for task in preset.tasks)
    arms = "|".join(re.escape(arm.label) for arm in preset.arms)
    cell_re = re.compile(rf"^(?:{tasks})_(?:{arms})_v\d+$")
    parents = {Path(cell_context(preset, cell, 1, state_dir)["output_dir"]).parent
               for cell in plan.cells[:1]}
    flagged: list[str] = []
    foreign = 0
    for parent in parents:
        if not parent.is_dir():
            continue
        for entry in sorted(parent.iterdir()):
            if not entry.is_dir() or cell_re.match(entry.name):
                continue
            found: list[str] = []
            mine = False
            for name in ARTIFACT_NAMES:
                try:
                    stat = (entry / name).lstat()
                except OSError:
                    continue
                found.append(name)
                mine = mine or ours(stat.st_mtime)
            if found and mine:
                flagged.append(f"{entry} ({', '.join(found)})")
            elif found:
                foreign += 1
    return flagged, foreign


def render_table(result: ValidationResult) -> str:
    counts: dict[str, int] = {}
    for check in result.cells:
        counts[check.verdict] = counts.get(check.verdict, 0) + 1
    lines = ["validate: " + " ".join(f"{k}={v}" for k, v in sorted(counts.items()))]
    if result.in_progress:
        lines.append(f"run in progress: {counts.get('RUNNING', 0)} running cell(s) are not "
                     "judged until they end; INVALID below are from finished attempts")
    if result.invalid:
        width = max(len(check.cell) for check in result.invalid)
        lines.append(f"{'cell':<{width}}  reason            detail")
        for check in result.invalid:
            lines.append(f"{check.cell:<{width}}  {check.reason:<16}  {term(check.detail, 300)}")
    why: dict[str, tuple[int, str]] = {}
    for check in result.cells:
        if check.verdict == "PENDING":
            count, detail = why.get(check.reason, (0, check.detail))
            why[check.reason] = (count + 1, detail)
    if why:
        lines.append("pending (no verdict in the journal yet): " + "; ".join(
            f"{reason or 'not run'} {count}" + (f" ({term(said, 160)})" if said else "")
            for reason, (count, said) in sorted(why.items())))
    for armless in result.armless:
        lines.append(f"ARM-LESS DIRECTORY: {term(armless, 500)} maps to no cell of the plan")
    if result.foreign:
        lines.append(f"{result.foreign} director{'y' if result.foreign == 1 else 'ies'} "
                     "beside the cells' outputs written outside this run's attempts "
                     "(another run's, or older): not judged")
    return "\n".join(lines)
