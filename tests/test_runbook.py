"""The run policy (autopilot.run.runbook), from tables: a ledger, the rules, an event ->
the policy's memory and the effects, in order. No process, no clock, no file."""

from __future__ import annotations

from typing import Any

import pytest

from autopilot.cell.validity import Classification
from autopilot.config import Rate
from autopilot.plan import Cell
from autopilot.run.runbook import (
    ArmComplete,
    BudgetReached,
    Emit,
    HarnessAnomaly,
    Policy,
    Rules,
    StreakState,
    WriteArmSummary,
    arm_done,
    budget_tick,
    endpoint_failure,
    on_grade_failure,
    on_verdict,
    outcome,
)
from autopilot.state.cellevents import CellQuarantined
from autopilot.state.ledger import Ledger

CELLS = [Cell("t1", "a", 1), Cell("t2", "a", 1), Cell("t1", "b", 1)]
RULES = Rules(infra_retries=1, anomaly_streak=2, pause_on_anomaly=False, max_passes=6)


def ledger(*verdicts: tuple[str, str, str | None], spend: tuple[int, int] = (0, 0)) -> Ledger:
    led = Ledger(CELLS)
    for i, (cid, verdict, reason) in enumerate(verdicts, 1):
        attempt = sum(1 for c, _, _ in verdicts[:i] if c == cid)
        led.apply({"event": "cell_started", "cell": cid, "attempt": attempt, "ts": f"t{i}"})
        led.apply({"event": "cell_verdict", "cell": cid, "attempt": attempt, "verdict": verdict,
                   "reason": reason, "spend": list(spend)})
    return led


def kinds(effects: list[Any]) -> list[str]:
    out = []
    for fx in effects:
        if isinstance(fx, Emit):
            out.append(f"emit:{fx.kind}")
        elif isinstance(fx, HarnessAnomaly | BudgetReached | ArmComplete):
            out.append(f"milestone:{fx.kind}")
        else:
            out.append(type(fx).__name__)
    return out


PASS = Classification("PASS", word="PASS", launched=1.0)
STALL = Classification("INVALID", reason="stall", launched=1.0)
CRASH = Classification("INVALID", reason="harness_crash", launched=1.0)


@pytest.mark.parametrize(("verdicts", "c", "want"), [
    # a valid verdict counts; the arm is not complete while t2 has none
    ([("t1_a_v1", "PASS", None)], PASS, ["CountValid"]),
    # the first INVALID is retried (infra_retries = 1) ...
    ([("t1_a_v1", "INVALID", "stall")], STALL, []),
    # ... the second quarantines it
    ([("t1_a_v1", "INVALID", "stall"), ("t1_a_v1", "INVALID", "stall")], STALL,
     ["emit:cell_quarantined"]),
    # grading alone failed: the run stands, never quarantined
    ([("t1_a_v1", "INVALID", "grader_failed"), ("t1_a_v1", "INVALID", "grader_failed")],
     Classification("INVALID", reason="grader_failed", launched=1.0), []),
    # the preset's own settings refuse the cell (INVALID(config)): quarantined at once,
    # never retried into the same refusal
    ([("t1_a_v1", "INVALID", "config")],
     Classification("INVALID", reason="config", launched=1.0), ["emit:cell_quarantined"]),
    # the provider throttled the harness: launch fewer, first
    ([("t1_a_v1", "INVALID", "rate_limited")],
     Classification("INVALID", reason="rate_limited", launched=1.0), ["Throttled"]),
    # the last valid verdict of an arm completes it: summary, then the milestone
    ([("t1_a_v1", "PASS", None), ("t2_a_v1", "FAIL", None)], PASS,
     ["CountValid", "WriteArmSummary", "milestone:arm_complete"]),
])
def test_on_verdict(verdicts: list[tuple[str, str, str | None]], c: Classification,
                    want: list[str]) -> None:
    led = ledger(*verdicts)
    _, effects = on_verdict(Policy(), RULES, led, verdicts[-1][0], c, regrade=False, now=9.0)
    assert kinds(effects) == want


def test_quarantine_names_the_attempts_and_reasons() -> None:
    led = ledger(("t1_a_v1", "INVALID", "stall"), ("t1_a_v1", "INVALID", "endpoint_down"))
    _, effects = on_verdict(Policy(), RULES, led, "t1_a_v1", STALL, regrade=False, now=9.0)
    assert effects == [Emit(CellQuarantined(cell="t1_a_v1", attempts=2,
                                            reasons=["stall", "endpoint_down"]))]
    assert effects[0].fields() == {"cell": "t1_a_v1", "attempts": 2,  # as journaled
                                   "reasons": ["stall", "endpoint_down"]}


def test_an_arm_is_announced_once() -> None:
    led = ledger(("t1_a_v1", "PASS", None), ("t2_a_v1", "PASS", None))
    policy, first = arm_done(Policy(), led, "a")
    assert first == [WriteArmSummary("a"), ArmComplete("a", passed=2, valid=2)]
    assert arm_done(policy, led, "a") == (policy, [])
    assert arm_done(Policy(), led, "b")[1] == []  # b has no valid verdict yet


def test_two_breaks_in_a_row_alarm_once_and_pause_when_told() -> None:
    rules = Rules(infra_retries=1, anomaly_streak=2, pause_on_anomaly=True)
    p, fx1 = on_grade_failure(Policy(), rules, "t1_a_v1", replace_launched(CRASH, 1.0), now=0)
    assert fx1 == [] and p.streak.count == 1
    p, fx2 = on_grade_failure(p, rules, "t2_a_v1", replace_launched(CRASH, 2.0), now=0)
    assert kinds(fx2) == ["milestone:harness_anomaly", "emit:launching_paused"]
    assert p.alarms == 1 and p.paused and "harness-break streak of 2" in p.paused
    assert fx2[0].advice.endswith("; launching paused")  # type: ignore[union-attr]
    p, fx3 = on_grade_failure(p, rules, "t1_b_v1", replace_launched(CRASH, 3.0), now=0)
    assert fx3 == [] and p.alarms == 1  # the same streak never alarms twice


def test_an_infrastructure_invalid_neither_counts_nor_splits_the_streak() -> None:
    p, _ = on_grade_failure(Policy(), RULES, "t1_a_v1", replace_launched(CRASH, 1.0), now=0)
    p, fx = on_grade_failure(p, RULES, "t2_a_v1", replace_launched(STALL, 2.0), now=0)
    assert fx == [] and p.streak.count == 1
    p, fx = on_grade_failure(p, RULES, "t1_b_v1", replace_launched(CRASH, 3.0), now=0)
    assert kinds(fx) == ["milestone:harness_anomaly"] and p.paused is None  # alert only


def test_a_verdict_without_a_launch_stamp_is_ordered_by_now() -> None:
    c = Classification("INVALID", reason="harness_crash")
    p, _ = on_grade_failure(Policy(), RULES, "t1_a_v1", c, now=5.0)
    assert p.streak.seen == ((5.0, True),)


def test_a_regrade_feeds_neither_the_streak_nor_the_budget() -> None:
    rules = Rules(infra_retries=1, anomaly_streak=1, pause_on_anomaly=True, budget_tokens=1)
    led = ledger(("t1_a_v1", "INVALID", "harness_crash"), spend=(5, 5))
    p, fx = on_verdict(Policy(), rules, led, "t1_a_v1", CRASH, regrade=True, now=0)
    assert fx == [] and p == Policy()
    p, fx = on_verdict(Policy(), rules, led, "t1_a_v1", CRASH, regrade=False, now=0)
    assert kinds(fx) == ["milestone:harness_anomaly", "emit:launching_paused"]


@pytest.mark.parametrize(("rules", "spend", "why"), [
    (Rules(1, 3, False, budget_tokens=100), (40, 60), "budget reached: 100 tokens of 100"),
    (Rules(1, 3, False, budget_tokens=100), (40, 59), None),
    (Rules(1, 3, False, budget_usd=1.0, rate=Rate.model_validate([1e6, 0.0])), (1, 0),
     "budget reached: $1.0000 of $1"),
    (Rules(1, 3, False, budget_usd=1.0), (1, 0), "budget unusable"),
    (Rules(1, 3, False), (10**6, 10**6), None),
])
def test_budget_tick(rules: Rules, spend: tuple[int, int], why: str | None) -> None:
    led = ledger(("t1_a_v1", "PASS", None), spend=spend)
    p, fx = budget_tick(Policy(), rules, led)
    if why is None:
        assert fx == [] and p.paused is None
        return
    assert kinds(fx) == ["emit:launching_paused", "milestone:budget_reached"]
    assert p.paused and p.paused.startswith(why)
    assert budget_tick(p, rules, led) == (p, [])  # once stopped, said once


@pytest.mark.parametrize(("fails", "why"), [
    ([], None),
    ([None], None),
    (["crashed"], "crashed"),
    (["a", None], None),  # one replica still serves
    (["a", "replica 1: b"], "replica 0: a; replica 1: b"),
])
def test_endpoint_failure(fails: list[str | None], why: str | None) -> None:
    assert endpoint_failure(fails) == why


@pytest.mark.parametrize(("verdicts", "kw", "want"), [
    ([], {"stopped_by": "SIGTERM"}, ("stopped", "stopped by SIGTERM")),
    ([("t1_a_v1", "PASS", None), ("t2_a_v1", "PASS", None), ("t1_b_v1", "FAIL", None)], {},
     ("COMPLETE", "")),
    ([], {"paused": "budget reached"}, ("INCOMPLETE", "budget reached")),
    ([], {"paused": "budget reached", "reason": "endpoint failed"},
     ("INCOMPLETE", "endpoint failed")),
    ([("t1_a_v1", "INVALID", "stall")] * 2, {}, ("INCOMPLETE", "max passes (6) reached")),
    ([], {}, ("INCOMPLETE", "max passes (6) reached")),
])
def test_outcome(verdicts: list[tuple[str, str, str | None]], kw: dict[str, Any],
                 want: tuple[str, str]) -> None:
    args: dict[str, Any] = {"stopped_by": None, "paused": None, "reason": ""} | kw
    out = outcome(ledger(*verdicts), RULES, **args)
    assert (out.phase, out.reason) == want


def test_nothing_left_to_run_is_not_complete_while_a_cell_is_ungradable() -> None:
    led = ledger(("t1_a_v1", "PASS", None), ("t2_a_v1", "PASS", None))
    led.apply({"event": "cell_started", "cell": "t1_b_v1", "attempt": 1})
    led.apply({"event": "cell_verdict", "cell": "t1_b_v1", "attempt": 1, "verdict": "INVALID",
               "reason": "grader_unavailable", "ungraded": True})
    assert led.complete()  # settled: no pass would run it again
    out = outcome(led, RULES, stopped_by=None, paused=None, reason="")
    assert out.phase == "INCOMPLETE" and out.reason.startswith("1 ungradable here")


def test_outcome_names_quarantined_then_ungraded_cells() -> None:
    led = ledger(("t1_a_v1", "INVALID", "stall"))
    led.apply({"event": "cell_quarantined", "cell": "t1_a_v1"})
    out = outcome(led, RULES, stopped_by=None, paused=None, reason="")
    assert out.reason == "1 quarantined: t1_a_v1"
    led = ledger(("t1_a_v1", "PASS", None), ("t2_a_v1", "PASS", None))
    led.apply({"event": "cell_started", "cell": "t1_b_v1", "attempt": 1})
    led.apply({"event": "cell_verdict", "cell": "t1_b_v1", "attempt": 1, "verdict": "INVALID",
               "reason": "grader_failed", "ungraded": True})
    out = outcome(led, RULES, stopped_by=None, paused=None, reason="")
    assert out.reason.startswith("1 ungraded (grading failed; their runs stand): t1_b_v1")


def replace_launched(c: Classification, t: float) -> Classification:
    from dataclasses import replace

    return replace(c, launched=t)


def test_streak_state_counts_the_breaks_at_the_end() -> None:
    assert StreakState(((1.0, True), (2.0, False), (3.0, True), (4.0, True))).count == 2
