"""Run state folded from journal events (the decisions over it: autopilot.run.runbook).

``Ledger.apply(event)`` is the only way state changes, both when replaying a journal on
start and live (the supervisor appends an event, then applies that same record), so a
resumed run and a run that never stopped cannot disagree.

Vocabulary (DESIGN.md): a cell is ABSENT until it first starts; PASS / FAIL come from
the grader; INVALID(reason) means the cell could not be trusted and is excluded from
aggregates; after ``infra_retries`` INVALID attempts the cell is quarantined, which is
reported and never counted as success. A cell whose harness run stands but whose grading
failed (or whose grader is unavailable) is *ungraded*: excluded like INVALID, never
re-run, and turned into PASS / FAIL by ``autopilot regrade`` once the grader works.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from autopilot.plan import Cell, Plan
from autopilot.state.budget import COST_BASES, MAX_COUNT, METERED, Spend, of_metered, of_verdict
from autopilot.state.cellevents import (
    CellAbandoned,
    CellAdopted,
    CellExited,
    CellGradeMetered,
    CellKilled,
    CellMetered,
    CellQuarantined,
    CellRan,
    CellSpawning,
    CellStarted,
    CellVerdict,
    GradeRetry,
    RequestFailover,
)
from autopilot.state.eventbase import CellEventBase, EventBase
from autopilot.state.events import parse
from autopilot.state.items import ITEM_KINDS, items_of, progress_of
from autopilot.state.runevents import EndpointRestart, NotifyFailed, RunHandedOver, RunStarted

# INVALID reasons that spend no retry: a throttling provider, a full disk, the death of
# the attempt's data path (the cell is re-run once the infrastructure is back; none of
# them says anything about the cell).
NOT_COUNTED = frozenset({"rate_limited", "disk_full", "datapath_lost"})

def _progressed(reason: str, finished: Any) -> bool:
    """An interrupted attempt that finished items of its own: resumable work that moved
    on spends no retry (the cell's items bound how often that can happen); one that
    finished none counts like any INVALID."""
    if reason != "interrupted":
        return False
    got = progress_of(finished)
    return got is not None and got.new > 0


# Ungraded cells that are done all the same: a grader that cannot run here (recorded by
# the preset's choice), and a sample the grader says has no score (Inspect's NaN: its
# metrics skip it; re-running the harness would not give it one).
SETTLED_UNGRADED = frozenset({"grader_unavailable", "unscored"})

# What a cell keeps of its latest attempt's meter (cell_metered).
METER_FIELDS = ("attempt", "requests", "prompt_tokens", "completion_tokens", "errors",
                "unmetered", "tokens")

Status = Literal["pending", "running", "ran", "PASS", "FAIL", "invalid", "quarantined",
                 "ungraded"]
VALID = ("PASS", "FAIL")


@dataclass
class CellState:
    id: str
    task: str
    arm: str
    n: int
    status: Status = "pending"
    attempts: int = 0
    invalid_attempts: int = 0
    reasons: list[str] = field(default_factory=list)
    reason: str | None = None
    detail: str = ""  # the last verdict's detail (why), for every view that lists the cell
    word: str | None = None
    caveat: str | None = None
    teardown_masked: bool = False
    pid: int | None = None
    create_time: float | None = None
    start_ticks: int | None = None
    started_ts: str | None = None
    finished_ts: str | None = None
    ran_outcome: dict[str, Any] | None = None  # per-arm grading: outputs awaiting a grade
    # the attempt's harness ended (cell_exited) or was adopted, and no verdict yet: being
    # graded, or, with its supervisor gone, graded by the resume
    exited: bool = False
    abandoned: str | None = None
    # a cell that grades many items (an Inspect task's samples): their counts, from its
    # valid verdict (autopilot.state.items); the views count these
    items: dict[str, int] | None = None  # why the last attempt was abandoned (re-run, uncharged)
    # the gateway's totals of the latest attempt (cell_metered), and the verdict's basis
    metered: dict[str, Any] | None = None
    cost_basis: str | None = None
    # runtime only (not journaled): refreshed by the watchdog
    frozen_secs: float = 0.0
    tier: str = "OK"
    last_signal: str | None = None

    @property
    def valid(self) -> bool:
        return self.status in VALID

    @property
    def phase(self) -> str:
        """Where the cell stands, in the one word every view counts by (validate, the
        dashboard, the report, status.json): its status, except that a running cell
        whose harness has ended is being graded (``ran``)."""
        return "ran" if self.status == "running" and self.exited else self.status

    @property
    def absent(self) -> bool:
        return self.attempts == 0


class Ledger:
    """Per-cell state of a plan (or of a bare list of cells, for read-only tools that
    have the state dir but not the preset)."""

    def __init__(self, plan: Plan | Sequence[Cell]) -> None:
        cells = plan.cells if isinstance(plan, Plan) else plan
        self.cells: dict[str, CellState] = {
            cell.id: CellState(cell.id, cell.task, cell.arm, cell.n) for cell in cells
        }
        self.recent: list[dict[str, Any]] = []
        self.fails: list[dict[str, Any]] = []
        self.endpoint_restarts = 0
        self.grade_retries = 0
        self.completed_ts: list[str] = []
        # Counters for monitoring (autopilot.views.metrics): watchdog kills by kind, failed
        # notifications. Replaying a journal rebuilds them exactly.
        self.kills: Counter[str] = Counter()
        self.notify_failures = 0
        self.spend = Spend()  # tokens used by every attempt (journaled with its verdict)
        self.claimed = Spend()  # the part of it only harnesses' summaries state
        # responses the gateway answered but could not meter: spend of unknown size
        self.unmetered = 0
        # what graders spent through their own listener (model-graded scoring), on its
        # own line: not any cell's spend, but the run's (budgets count it)
        self.grading = Spend()
        self.failovers = 0  # requests the gateway sent to another replica than the cell's
        # The last launch handed over (SIGUSR2): a "running" cell runs on under its data
        # path until a successor re-attaches, it was not interrupted.
        self.handed_over = False

    def _cell(self, cid: str) -> CellState | None:
        # Events of cells outside this plan (an earlier, bigger --target-n) are kept in
        # the journal but do not count towards this plan.
        return self.cells.get(cid)

    def apply(self, record: dict[str, Any] | EventBase) -> EventBase | None:
        """Fold one journal event, by its type (autopilot.state.events), and return it
        typed; a record that fits no type changes nothing. A record of a kind the ledger
        does not fold is not even parsed (a replay of 100,000 events pays for what it
        counts): None."""
        if isinstance(record, dict):
            if record.get("event") not in FOLDED:
                return None
            event, raw = parse(record), record
        else:
            event, raw = record, None
        if event is None:
            return None
        fold = _FOLDS.get(type(event))
        if fold is not None:
            # ``raw``: the record as written, for the budget's shape checks (a typed
            # event is dumped only where one is needed: a verdict's spend, a meter).
            fold(self, event, raw)
        return event

    # -- what each type changes (the table _FOLDS, below the class, maps type -> fold)

    def _run_counter(self, ev: EventBase, _: Any) -> None:
        match ev:
            case NotifyFailed():
                self.notify_failures += 1
            case EndpointRestart():
                self.endpoint_restarts += 1
            case GradeRetry():
                self.grade_retries += 1
            case RequestFailover():
                self.failovers += 1
            case RunHandedOver():  # until the next launch: its running attempts go on
                self.handed_over = True
            case RunStarted():
                self.handed_over = False

    def _grade_metered(self, ev: CellGradeMetered, raw: dict[str, Any] | None) -> None:
        spent = of_metered(raw or ev.model_dump(by_alias=True))
        if spent is not None:
            self.grading = self.grading + spent
        if _count(ev.unmetered):
            self.unmetered += ev.unmetered

    def _cell_event(self, ev: CellEventBase, raw: dict[str, Any] | None) -> None:
        cell = self._cell(ev.cell) if ev.cell else None
        if cell is None:
            return
        match ev:
            case CellVerdict():
                raw = raw or ev.model_dump(by_alias=True)
                spent = of_verdict(ev)
                self.spend = self.spend + spent
                if ev.cost_basis == "self_reported":  # a harness's word: no budget's count
                    self.claimed = self.claimed + spent
                if _count(ev.unmetered) and not ev.regrade:
                    self.unmetered += ev.unmetered
                self._verdict(cell, ev, raw)
            case CellSpawning():
                # The attempt exists from here on (its process may, unjournaled).
                self._launched(cell, ev.attempt, ev.ts)
                cell.pid = cell.create_time = cell.start_ticks = None
            case CellStarted():
                self._launched(cell, ev.attempt, ev.ts)
                cell.pid, cell.create_time = ev.pid, ev.create_time
                cell.start_ticks = ev.start_ticks
            case CellExited() | CellAdopted():
                cell.exited = cell.status == "running"
            case CellKilled():
                self.kills[ev.kind or "stall"] += 1
            case CellAbandoned():
                if ev.never_started:  # no harness ever ran as it: its number is free
                    cell.attempts = max(0, (ev.attempt or cell.attempts) - 1)
                cell.status = "pending"
                cell.pid = cell.create_time = None
                cell.exited, cell.abandoned = False, ev.why or "abandoned"
            case CellRan():
                cell.status = "ran"
                cell.ran_outcome = ev.outcome if isinstance(ev.outcome, dict) else None
                cell.pid = cell.create_time = None
                cell.exited, cell.abandoned = False, None
            case CellMetered():
                cell.metered = {key: getattr(ev, key) for key in METER_FIELDS}
            case CellQuarantined():
                cell.status = "quarantined"
                cell.pid = cell.create_time = None
                cell.exited, cell.abandoned = False, None

    @staticmethod
    def _launched(cell: CellState, attempt: int | None, ts: str | None) -> None:
        cell.status = "running"
        cell.attempts = attempt if attempt is not None else cell.attempts + 1
        cell.started_ts = ts
        cell.frozen_secs, cell.tier, cell.last_signal = 0.0, "OK", None
        cell.exited, cell.abandoned = False, None

    def _verdict(self, cell: CellState, ev: CellVerdict, raw: dict[str, Any]) -> None:
        verdict = ev.verdict
        cell.pid = cell.create_time = None
        cell.exited, cell.abandoned = False, None
        cell.finished_ts = ev.ts
        cell.word = ev.word
        cell.caveat = ev.caveat
        cell.teardown_masked = ev.teardown_masked
        cell.detail = ev.detail or ""
        cell.cost_basis = ev.cost_basis if ev.cost_basis in COST_BASES else None
        # a state file's: shape-checked as when it was graded
        cell.items = items_of(raw.get("items")) if verdict in VALID else None
        if verdict in VALID:
            cell.status = verdict  # type: ignore[assignment]
            cell.reason = None
        elif ev.ungraded:
            # The attempt's outputs stand; only grading failed: no retry is spent.
            cell.status = "ungraded"
            cell.reason = ev.reason or "grader_failed"
            cell.reasons.append(cell.reason)
        else:
            cell.status = "invalid"
            cell.reason = ev.reason or "unknown"
            if cell.reason not in NOT_COUNTED and not _progressed(cell.reason, ev.finished):
                cell.invalid_attempts += 1
            cell.reasons.append(cell.reason)
        row = {
            "cell": cell.id,
            "verdict": verdict if verdict in VALID else f"INVALID({cell.reason})",
            "ts": ev.ts,
            "attempt": ev.attempt,
            "teardown_masked": cell.teardown_masked,
        }
        self.recent = [*self.recent[-19:], row]
        if verdict != "PASS":
            self.fails = [*self.fails[-49:], row]
        if verdict in VALID and not ev.regrade:
            self.completed_ts.append(str(ev.ts))

    # ------------------------------------------------------------------ queries

    def pending(self) -> list[CellState]:
        """Cells to run in the next pass, in plan order."""
        return [cell for cell in self.cells.values() if cell.status in ("pending", "invalid")]

    def complete(self) -> bool:
        return all(self.settled(cell) for cell in self.cells.values())

    def settled(self, cell: CellState) -> bool:
        """Counts towards completion: a valid verdict, or a cell the preset chose to
        record as ungradable (its grader cannot run here; reported, never a success)."""
        return cell.valid or (cell.status == "ungraded" and cell.reason in SETTLED_UNGRADED)

    def counts(self, cells: list[CellState] | None = None) -> Counts:
        cells = list(self.cells.values()) if cells is None else cells
        items: Counter[str] = Counter()
        for cell in cells:
            if cell.items and cell.status in VALID:
                items.update(cell.items)
        return _counts(Counter(cell.phase for cell in cells), items)

    def trust(self) -> Trust:
        """The fail-closed accounting block shown everywhere aggregates are shown."""
        return self.summary().trust

    def summary(self) -> Summary:
        """Totals, per-arm and per-(arm, task) counts and the trust block in ONE pass:
        status.json is rebuilt on every transition, and a 20,000-cell plan must not
        stall the event loop."""
        groups: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        items: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        by_reason: Counter[str] = Counter()
        excluded: list[Excluded] = []
        attempts = masked = retried = 0
        basis: Counter[str] = Counter()
        for cell in self.cells.values():
            groups[(cell.arm, cell.task)][cell.phase] += 1
            if cell.items and cell.status in VALID:
                items[(cell.arm, cell.task)].update(cell.items)
            if cell.cost_basis and cell.status in VALID:
                basis[cell.cost_basis] += 1
            if cell.reasons:
                by_reason.update(cell.reasons)
                attempts += cell.invalid_attempts
            if cell.status in ("invalid", "quarantined", "ungraded"):
                excluded.append(Excluded(cell.id, cell.status, tuple(cell.reasons)))
            if cell.teardown_masked and cell.status in VALID:
                masked += 1
            if cell.attempts > 1:
                retried += 1
        by_arm: dict[str, Counter[str]] = defaultdict(Counter)
        arm_items: dict[str, Counter[str]] = defaultdict(Counter)
        for (arm, _), cnt in groups.items():
            by_arm[arm].update(cnt)
        for (arm, _), cnt in items.items():
            arm_items[arm].update(cnt)
        total: Counter[str] = Counter()
        total_items: Counter[str] = Counter()
        for cnt in by_arm.values():
            total.update(cnt)
        for cnt in arm_items.values():
            total_items.update(cnt)
        trust = Trust(
            valid_cells=total["PASS"] + total["FAIL"],
            invalid_cells=total["invalid"],
            invalid_attempts=attempts,
            invalid_by_reason=dict(sorted(by_reason.items())),
            teardown_masked_cells=masked,
            quarantined_cells=total["quarantined"],
            ungraded_cells=total["ungraded"],
            # whose word a valid cell's tokens rest on: the gateway's, or the harness's
            # own where the gateway's count disagrees with it (a flag; the verdict stands)
            metered_cells=sum(basis[kind] for kind in METERED),
            cost_mismatch_cells=basis["self_reported_mismatch"],
            grade_retries=self.grade_retries,
            retried_cells=retried,
            excluded=tuple(excluded),
            items=dict(total_items) if total_items else None,
        )
        return Summary(
            totals=_counts(total, total_items),
            arms={name: _counts(cnt, arm_items.get(name)) for name, cnt in by_arm.items()},
            tasks={key: _counts(cnt, items.get(key)) for key, cnt in groups.items()},
            trust=trust,
        )


class Counts(NamedTuple):
    """A group's cells by where they stand (``CellState.phase``): what status.json's
    totals, and each arm's and task's, hold (``autopilot.state.statusdoc.Totals`` reads
    them back, by the same names). A named tuple, the cheapest to build: a 20,000-cell
    plan has thousands of groups, counted again at every transition."""

    total: int = 0
    pass_: int = 0
    fail: int = 0
    invalid: int = 0
    quarantined: int = 0
    ungraded: int = 0
    running: int = 0
    grading: int = 0
    pending: int = 0
    items: dict[str, int] | None = None  # what its many-item cells scored, if any

    @property
    def done(self) -> int:
        return self.pass_ + self.fail

    def as_json(self) -> dict[str, int | dict[str, int]]:
        """As status.json holds it (``pass``; ``items`` only where there are some)."""
        (total, passed, failed, invalid, quarantined, ungraded, running, grading, pending,
         items) = self
        out: dict[str, int | dict[str, int]] = {
            "total": total, "pass": passed, "fail": failed, "invalid": invalid,
            "quarantined": quarantined, "ungraded": ungraded, "running": running,
            "grading": grading, "pending": pending, "done": passed + failed}
        if items:
            out["items"] = dict(items)
        return out


class Excluded(NamedTuple):
    """A cell no pass rate counts: INVALID now, quarantined, or ungraded."""

    cell: str
    status: str
    reasons: tuple[str, ...]  # its INVALID attempts' reasons, in order


@dataclass(frozen=True)
class Trust:
    """The fail-closed accounting block shown everywhere aggregates are shown: what
    counts, what does not, and why (status.json's ``trust``, by these names)."""

    valid_cells: int = 0
    invalid_cells: int = 0
    invalid_attempts: int = 0  # those that spent a retry
    invalid_by_reason: dict[str, int] = field(default_factory=dict)  # every INVALID attempt
    teardown_masked_cells: int = 0
    quarantined_cells: int = 0
    ungraded_cells: int = 0
    metered_cells: int = 0
    cost_mismatch_cells: int = 0
    grade_retries: int = 0
    retried_cells: int = 0
    excluded: tuple[Excluded, ...] = ()
    items: dict[str, int] | None = None  # what many-item cells scored, if any

    def as_json(self) -> dict[str, object]:
        """As status.json holds it (``items`` only where there are some)."""
        out: dict[str, object] = {
            "valid_cells": self.valid_cells, "invalid_cells": self.invalid_cells,
            "invalid_attempts": self.invalid_attempts,
            "invalid_by_reason": dict(self.invalid_by_reason),
            "teardown_masked_cells": self.teardown_masked_cells,
            "quarantined_cells": self.quarantined_cells,
            "ungraded_cells": self.ungraded_cells, "metered_cells": self.metered_cells,
            "cost_mismatch_cells": self.cost_mismatch_cells,
            "grade_retries": self.grade_retries, "retried_cells": self.retried_cells,
            "excluded": [{"cell": e.cell, "status": e.status, "reasons": list(e.reasons)}
                         for e in self.excluded]}
        if self.items:
            out["items"] = dict(self.items)
        return out


@dataclass
class Summary:
    totals: Counts
    arms: dict[str, Counts]
    tasks: dict[tuple[str, str], Counts]
    trust: Trust


def _counts(phases: Counter[str], items: Counter[str] | None = None) -> Counts:
    """A group's cells by phase; with ``items``, what its many-item cells scored (the
    counting unit there: passed of scored)."""
    return Counts(
        sum(phases.values()), phases["PASS"], phases["FAIL"], phases["invalid"],
        phases["quarantined"], phases["ungraded"], phases["running"], phases["ran"],
        phases["pending"],
        # reused (samples an earlier attempt scored) only where there were some
        {k: items[k] for k in ITEM_KINDS if k != "reused" or items[k]} if items else None)


def _count(value: Any) -> bool:
    """A count a state file carries, within bounds (a hostile value counts nothing)."""
    return type(value) is int and 0 < value <= MAX_COUNT


# Which fold each event type goes to; every other kind leaves the ledger as it is.
_FOLDS: dict[type[EventBase], Any] = {
    **dict.fromkeys((NotifyFailed, EndpointRestart, GradeRetry, RequestFailover,
                     RunHandedOver, RunStarted),
                    Ledger._run_counter),
    CellGradeMetered: Ledger._grade_metered,
    **dict.fromkeys((CellVerdict, CellSpawning, CellStarted, CellExited, CellAdopted,
                     CellKilled, CellAbandoned, CellRan, CellMetered, CellQuarantined),
                    Ledger._cell_event),
}
FOLDED = frozenset(str(t.model_fields["event"].default) for t in _FOLDS)
