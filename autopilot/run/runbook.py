"""The run policy: what the run does after each thing that happens, as data (pure).

The loop (autopilot.run.supervisor) records what happened — a verdict, a grading try
that failed, a launch about to be made, the end of the passes — and asks this module
what follows. The answer is the policy's new memory (``Policy``) and a list of effects
(emit an event, push a milestone, throttle launching, write an arm's summary, count a
valid verdict) that the loop applies in order. Nothing here reads a file, a clock or a
process: every rule is a function of the ledger, the preset's rules and the event, and
is table-tested like ``watchdog.decide`` (tests/test_runbook.py).

The rules, in the words of DESIGN.md:
- an INVALID attempt is retried ``infra_retries`` times; the next INVALID quarantines it;
- ``anomaly_streak`` harness breaks in a row, in launch order, alarm once (and pause
  launching when ``on_anomaly = "pause"``); infrastructure INVALIDs neither count nor split;
- a spend at or past ``[budget]`` stops launching (a resumed run stays stopped);
- an arm whose every cell has a valid verdict is complete (once per run);
- the run's outcome: stopped by a signal, COMPLETE, or INCOMPLETE with the first reason
  that applies (the loop's own, the pause, quarantine, ungraded cells, max passes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

from autopilot.cell.validity import Classification
from autopilot.config import Preset, Rate
from autopilot.state import budget
from autopilot.state.cellevents import CellQuarantined
from autopilot.state.eventbase import EventBase
from autopilot.state.ledger import VALID, Ledger
from autopilot.state.runevents import LaunchingPaused, MilestoneKind


def should_quarantine(invalid_attempts: int, infra_retries: int) -> bool:
    """Retry an INVALID cell ``infra_retries`` times; the next INVALID quarantines it."""
    return invalid_attempts > infra_retries


StreakKind = Literal["break", "healthy", "neutral"]
STREAK_MEMORY = 256  # results remembered for ordering; a streak is never that long


@dataclass(frozen=True)
class StreakState:
    """Recent results as (launch stamp, is a break), ordered by launch, and the stamps of
    the breaks that already alarmed."""
    seen: tuple[tuple[float, bool], ...] = ()
    alarmed: frozenset[float] = frozenset()

    @property
    def count(self) -> int:
        """Breaks at the end of the launch order: the streak as it stands."""
        total = 0
        for _, brk in reversed(self.seen):
            if not brk:
                break
            total += 1
        return total


def streak_step(state: StreakState, kind: StreakKind, launched: float,
                threshold: int) -> tuple[StreakState, bool]:
    """Harness-break streak: True exactly once when ``threshold`` breaks follow each other
    in *launch* order; a healthy result launched between them splits the streak, so a
    later streak alarms again. Launch order, not completion order: with cells running
    at once, a grader that crashed may be reported just after a healthy grade that
    started later, and three crashes in a row must still read as three in a row.
    A neutral result (INVALID for infrastructure: a stall, the endpoint down) says
    nothing about the harness and leaves the streak as it is."""
    if kind == "neutral":
        return state, False
    seen = sorted((*state.seen, (launched, kind == "break")))[-STREAK_MEMORY:]
    i = seen.index((launched, kind == "break"))
    if kind == "healthy":
        return StreakState(tuple(seen), state.alarmed), False
    lo, hi = i, i  # the run of breaks around the new one
    while lo > 0 and seen[lo - 1][1]:
        lo -= 1
    while hi + 1 < len(seen) and seen[hi + 1][1]:
        hi += 1
    run = {stamp for stamp, _ in seen[lo:hi + 1]}
    fire = hi - lo + 1 >= threshold and not (run & state.alarmed)
    kept = {stamp for stamp, _ in seen}
    alarmed = (state.alarmed | run) if fire or run & state.alarmed else state.alarmed
    return StreakState(tuple(seen), frozenset(alarmed & kept)), fire


# ---------------------------------------------------------------------- effects


@dataclass(frozen=True)
class Emit:
    """Journal a typed event (autopilot.state.events), and so apply it to the ledger."""
    event: EventBase

    @property
    def kind(self) -> str:
        return self.event.event

    def fields(self) -> dict[str, Any]:
        """What the journal records beside its time and kind: the fields the policy set."""
        return self.event.model_dump(by_alias=True, exclude={"ts", "event"},
                                     exclude_unset=True)


@dataclass(frozen=True)
class HarnessAnomaly:
    """A milestone (journaled, pushed to the phone): a streak of harness breaks."""
    alarm: int
    streak: int
    last_cell: str
    reason: str | None
    advice: str
    kind: ClassVar[MilestoneKind] = "harness_anomaly"


@dataclass(frozen=True)
class BudgetReached:
    """A milestone: the run's budget is spent (launching stopped)."""
    why: str
    kind: ClassVar[MilestoneKind] = "budget_reached"


@dataclass(frozen=True)
class ArmComplete:
    """A milestone: every cell of an arm has a valid verdict."""
    arm: str
    passed: int
    valid: int
    kind: ClassVar[MilestoneKind] = "arm_complete"


Milestone = HarnessAnomaly | BudgetReached | ArmComplete
"""Journal a milestone and push it to the notifier (its fields are its details)."""


@dataclass(frozen=True)
class Throttled:
    """The provider throttled the harness: launch fewer cells at once."""


@dataclass(frozen=True)
class WriteArmSummary:
    """Write ``summary-<arm>.txt``, the origin's PASS/FAIL table."""
    arm: str


@dataclass(frozen=True)
class CountValid:
    """One more valid verdict this session (the ETA's rate)."""


Effect = Emit | HarnessAnomaly | BudgetReached | ArmComplete | Throttled | WriteArmSummary \
    | CountValid


@dataclass(frozen=True)
class Rules:
    """The preset's settings the policy decides by."""
    infra_retries: int
    anomaly_streak: int
    pause_on_anomaly: bool
    budget_tokens: int | None = None
    budget_usd: float | None = None
    rate: Rate | None = None
    max_passes: int = 6

    @classmethod
    def of(cls, preset: Preset) -> Rules:
        return cls(infra_retries=preset.trust.infra_retries,
                   anomaly_streak=preset.trust.anomaly_streak,
                   pause_on_anomaly=preset.trust.on_anomaly == "pause",
                   budget_tokens=preset.budget.tokens, budget_usd=preset.budget.usd,
                   rate=preset.rate_for(),
                   max_passes=preset.run.max_passes)


@dataclass(frozen=True)
class Policy:
    """What the policy remembers between events."""
    streak: StreakState = field(default_factory=StreakState)
    alarms: int = 0
    paused: str | None = None  # launching stopped (an anomaly pause, a budget), and why
    announced: frozenset[str] = frozenset()  # arms whose completion was announced


Decision = tuple[Policy, list[Effect]]


# ---------------------------------------------------------------------- decisions


def on_verdict(policy: Policy, rules: Rules, ledger: Ledger, cid: str, c: Classification,
               *, regrade: bool, now: float) -> Decision:
    """A verdict was journaled (the ledger already holds it). ``now``: wall-clock time,
    the launch stamp of a verdict that carries none."""
    state = ledger.cells[cid]
    effects: list[Effect] = []
    if c.reason == "rate_limited":
        effects.append(Throttled())
    if c.verdict in VALID:
        effects.append(CountValid())
    elif not c.grade_side and (c.reason == "config" or should_quarantine(
            state.invalid_attempts, rules.infra_retries)):
        # INVALID(config): the preset's own settings refuse the cell; a retry is the same
        # refusal again, never a silent loop.
        effects.append(Emit(CellQuarantined(cell=cid, attempts=state.attempts,
                                            reasons=list(state.reasons))))
    if not regrade:  # the streak is about fresh runs and fresh grades
        policy, more = on_grade_failure(policy, rules, cid, c, now=now)
        effects += more
        policy, more = budget_tick(policy, rules, ledger)
        effects += more
    policy, more = arm_done(policy, ledger, state.arm)
    return policy, effects + more


def on_grade_failure(policy: Policy, rules: Rules, cid: str, c: Classification, *,
                     now: float) -> Decision:
    """A result that feeds the harness-break streak (a verdict, or a grading try that
    failed and will be retried)."""
    launched = c.launched if c.launched is not None else now
    streak, fire = streak_step(policy.streak, c.streak_kind, launched, rules.anomaly_streak)
    policy = replace(policy, streak=streak)
    if not fire:
        return policy, []
    policy = replace(policy, alarms=policy.alarms + 1)
    effects: list[Effect] = [HarnessAnomaly(
        alarm=policy.alarms, streak=streak.count, last_cell=cid, reason=c.reason or c.word,
        advice="harness or grader looks broken; check the launcher and grade logs"
               + ("; launching paused" if rules.pause_on_anomaly else ""))]
    if rules.pause_on_anomaly and not policy.paused:
        why = (f"paused after a harness-break streak of {streak.count} "
               f"(last {cid}: {c.label()}{' ' + c.word if c.word else ''}); "
               "fix the harness, then re-run the same command")
        policy = replace(policy, paused=why)
        effects.append(Emit(LaunchingPaused(why=why)))
    return policy, effects


def budget_tick(policy: Policy, rules: Rules, ledger: Ledger) -> Decision:
    """Before a launch and after a verdict: stop launching once the budget is spent."""
    if policy.paused or (rules.budget_tokens is None and rules.budget_usd is None):
        return policy, []
    metered = ledger.spend - ledger.claimed + ledger.grading
    why = budget.reached(rules.budget_tokens, rules.budget_usd, metered, rules.rate,
                         ledger.unmetered, ledger.claimed)
    if not why:
        return policy, []
    paused = (f"{why}; launching stopped (fail closed: the gateway's count is the only one "
              "a budget takes)" if why.startswith("budget unprovable")
              else f"{why}; launching stopped (raise [budget] to go on)")
    return replace(policy, paused=paused), [Emit(LaunchingPaused(why=paused)),
                                            BudgetReached(why)]


def arm_done(policy: Policy, ledger: Ledger, arm: str) -> Decision:
    """An arm whose every cell has a valid verdict is complete: announced once a run."""
    if arm in policy.announced:
        return policy, []
    cells = [cell for cell in ledger.cells.values() if cell.arm == arm]
    if not all(cell.valid for cell in cells):
        return policy, []
    counts = ledger.counts(cells)
    return replace(policy, announced=policy.announced | {arm}), [
        WriteArmSummary(arm),
        ArmComplete(arm, passed=counts.pass_, valid=counts.done)]


def endpoint_failure(fails: Sequence[str | None]) -> str | None:
    """Why no replica can serve any more (each replica's reason), or None while one can."""
    if not fails or not all(fails):
        return None
    if len(fails) == 1:
        return fails[0]
    return "; ".join(f if f and f.startswith("replica ") else f"replica {i}: {f}"
                     for i, f in enumerate(fails))


@dataclass(frozen=True)
class Outcome:
    phase: Literal["stopped", "COMPLETE", "INCOMPLETE"]
    reason: str


def outcome(ledger: Ledger, rules: Rules, *, stopped_by: str | None, paused: str | None,
            reason: str) -> Outcome:
    """How the run ends. ``stopped_by``: the signal's name; ``reason``: what the loop
    already knows (an endpoint that failed, a disk that filled), kept first."""
    if stopped_by:
        return Outcome("stopped", f"stopped by {stopped_by}")
    if ledger.complete():
        # Nothing is left to run. COMPLETE (exit 0) means every cell has a valid verdict:
        # cells recorded ungradable here (grader_unavailable) are not, and say so.
        ungradable = [cell.id for cell in ledger.cells.values()
                      if not cell.valid and cell.reason != "unscored"]  # unscored: done, said
        if not ungradable:
            return Outcome("COMPLETE", "")
        return Outcome("INCOMPLETE", (
            f"{len(ungradable)} ungradable here (grader_unavailable; their runs stand): "
            f"{', '.join(ungradable[:5])}; provide what preflight named, then "
            "`autopilot regrade`"))
    if paused and not reason:
        reason = paused
    if not reason:
        quarantined = [e.cell for e in ledger.trust().excluded if e.status == "quarantined"]
        ungraded = [cell.id for cell in ledger.cells.values()
                    if cell.status == "ungraded" and not ledger.settled(cell)]
        if quarantined:
            reason = f"{len(quarantined)} quarantined: {', '.join(quarantined[:5])}"
        elif ungraded and not ledger.pending():
            reason = (f"{len(ungraded)} ungraded (grading failed; their runs stand): "
                      f"{', '.join(ungraded[:5])}; fix the grader, then `autopilot regrade`")
        else:
            reason = f"max passes ({rules.max_passes}) reached"
    return Outcome("INCOMPLETE", reason)


__all__ = [
    "ArmComplete", "BudgetReached", "CountValid", "Effect", "Emit", "HarnessAnomaly", "Milestone",
    "Outcome", "Policy", "Rules", "StreakKind",
    "StreakState", "Throttled", "WriteArmSummary", "arm_done", "budget_tick",
    "endpoint_failure", "on_grade_failure", "on_verdict", "outcome", "should_quarantine",
    "streak_step",
]
