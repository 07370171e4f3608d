"""Pure decision functions, table-driven with a fake clock: watchdog tiers, validity,
retry/quarantine, harness-break streaks, restart policy, ETA."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import write_overlay

from autopilot.cell.validity import Checks, GradeOutcome, RunOutcome, classify
from autopilot.cell.watchdog import Limits, Observation, WatchState, decide
from autopilot.config import DEFAULT_VERDICTS, BuiltinEndpoint
from autopilot.config.limits import limits_for
from autopilot.endpoints.policy import backoff_secs, restart_action
from autopilot.endpoints.ports import probe_pause
from autopilot.loader import load_preset
from autopilot.run.placement import ReplicaView, choose_replica
from autopilot.run.runbook import StreakState, should_quarantine, streak_step
from autopilot.state.status import eta_secs, fmt_secs, oneline
from autopilot.state.statusdoc import read as read_status

LIM = Limits(warn_secs=90, probe_secs=180, kill_secs=300, stuck_secs=1200,
             teardown_grace_secs=10, deadline=5000)


def drive(trace: list[tuple[float, int | None, int, bool, bool]], limits: Limits = LIM):
    """trace rows: (t, transcript_size, spool_size, completion, alive) -> decisions"""
    s = WatchState.begin(0.0)
    out = []
    for t, tr, sp, comp, alive in trace:
        s, d = decide(s, Observation(now=t, transcript_size=tr, spool_size=sp,
                                     completion=comp, alive=alive), limits)
        out.append(d)
    return out


def test_tiers_on_no_progress() -> None:
    ds = drive([(10, 10, 5, False, True), (100, 10, 5, False, True),
                (190, 10, 5, False, True), (311, 10, 5, False, True)])
    assert [d.action for d in ds] == ["OK", "WARN", "PROBE", "KILL"]
    assert ds[-1].kind == "stall" and all(d.changed for d in ds[1:])


def test_slow_but_progressing_is_never_stuck() -> None:
    trace = [(t, t, 0, False, True) for t in range(0, 4000, 60)]  # grows every minute
    no_deadline = Limits(**{**LIM.__dict__, "deadline": 1e9})
    assert {d.action for d in drive(trace, no_deadline)} == {"OK"}


def test_transcript_freeze_kills_even_while_spool_grows() -> None:
    trace = [(t, 100, t, False, True) for t in range(10, 1300, 10)]  # writes forever
    ds = drive(trace)
    kill = next(d for d in ds if d.action == "KILL")
    assert kill.kind == "stall" and "transcript frozen" in kill.reason
    assert kill.frozen_secs >= 1200


def test_deadline() -> None:
    ds = drive([(t, t, 0, False, True) for t in range(0, 5100, 50)])
    kill = next(d for d in ds if d.action == "KILL")
    assert kill.kind == "deadline"


def test_hung_teardown_after_grace() -> None:
    ds = drive([(5, 10, 0, False, True), (6, 20, 0, True, True), (12, 20, 0, True, True),
                (17, 20, 0, True, True)])
    assert [d.action for d in ds] == ["OK", "OK", "OK", "KILL"]
    assert ds[-1].kind == "teardown"


def test_teardown_not_flagged_when_process_exits() -> None:
    ds = drive([(6, 20, 0, True, True), (30, 20, 0, True, False)])
    assert [d.action for d in ds] == ["OK", "OK"]


def test_a_cells_deadline_is_its_budget_plus_overhead_under_the_cap(tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {
        "watchdog": {"deadline_overhead_secs": 600, "deadline_cap_secs": 3600},
        "harness": {"wall_budget_secs": 600},
        "tasks": [{"id": "p1_bugfix", "wall_budget_secs": 5000, "stuck_secs": 77},
                  {"id": "p2_hallucination"}]})
    p = load_preset("demo", overlay=str(over))
    long, short = limits_for(p, "p1_bugfix"), limits_for(p, "p2_hallucination")
    assert (short.deadline_secs, short.stuck_secs) == (1200, p.watchdog.stuck_secs)
    assert (long.deadline_secs, long.stuck_secs, long.wall_budget_secs) == (3600, 77, 5000)


R = DEFAULT_VERDICTS
DONE = RunOutcome(exit_code=0, completion=True)
GOOD = GradeOutcome(True, grade={"verdict": "PASS"})


@pytest.mark.parametrize(
    ("run", "grade", "checks", "label"),
    [
        (DONE, GOOD, Checks(), "PASS"),
        (DONE, GradeOutcome(True, grade={"verdict": "FAIL"}), Checks(), "FAIL"),
        (DONE, GradeOutcome(True, grade={"verdict": "STRUCTURAL_PASS"}), Checks(), "PASS"),
        (RunOutcome(None, killed="stall"), None, Checks(), "INVALID(stall)"),
        (RunOutcome(None, killed="deadline"), None, Checks(), "INVALID(deadline)"),
        (RunOutcome(2), None, Checks(), "INVALID(harness_crash)"),
        (RunOutcome(0), None, Checks(), "INVALID(missing_output)"),
        (RunOutcome(3, endpoint_down=True), None, Checks(), "INVALID(endpoint_down)"),
        # a cell starved by an outage is stall-killed: the outage is the reason
        (RunOutcome(None, killed="stall", endpoint_down=True), None, Checks(),
         "INVALID(endpoint_down)"),
        (RunOutcome(None, killed="deadline", endpoint_down=True), None, Checks(),
         "INVALID(endpoint_down)"),
        (DONE, GOOD, Checks(malformed="finish_reason is a list, not a string"),
         "INVALID(malformed_summary)"),
        (DONE, GradeOutcome(False, "exit 1"), Checks(), "INVALID(grader_failed)"),
        (DONE, GradeOutcome(True, grade=None), Checks(), "INVALID(malformed_grade)"),
        (DONE, GradeOutcome(True, grade={"score": 1}), Checks(), "INVALID(malformed_grade)"),
        (DONE, GradeOutcome(True, grade={"verdict": "MAYBE"}), Checks(),
         "INVALID(malformed_grade)"),
        (DONE, GradeOutcome(True, grade={"verdict": "MISSING_OUTPUT"}), Checks(), "FAIL"),
        (DONE, GOOD, Checks(finish_error="api_error: HTTP Error 500"), "INVALID(api_error)"),
        (DONE, GOOD, Checks(tokens=0, tokens_checked=True), "INVALID(zero_tokens)"),
        (DONE, GOOD, Checks(tokens=None, tokens_checked=True), "INVALID(zero_tokens)"),
        (DONE, GOOD, Checks(tokens=math.nan, tokens_checked=True), "INVALID(zero_tokens)"),
        (DONE, GOOD, Checks(mismatches=("model: a vs b",)), "INVALID(arm_mismatch)"),
        # below the disk floor, whatever broke the harness is the disk's doing ...
        (RunOutcome(1, disk_low=True), None, Checks(), "INVALID(disk_full)"),
        (RunOutcome(None, killed="stall", disk_low=True), None, Checks(),
         "INVALID(disk_full)"),
        (RunOutcome(0, completion=True, disk_low=True), GOOD,
         Checks(malformed="summary.json is not JSON"), "INVALID(disk_full)"),
        # ... but a valid verdict stands, and grading's own failures keep their name
        (RunOutcome(0, completion=True, disk_low=True), GOOD, Checks(), "PASS"),
        (RunOutcome(0, completion=True, disk_low=True), GradeOutcome(False, "exit 1"),
         Checks(), "INVALID(grader_failed)"),
    ],
)
def test_classify_table(run, grade, checks, label) -> None:
    assert classify(run, grade, R, checks).label() == label


def test_teardown_masked_is_valid_and_flagged() -> None:
    c = classify(RunOutcome(-9, killed="teardown", completion=True), GOOD, R)
    assert c.label() == "PASS" and c.teardown_masked


def test_retry_then_quarantine() -> None:
    assert [should_quarantine(k, 2) for k in (1, 2, 3)] == [False, False, True]


def test_streak_fires_once_per_streak() -> None:
    s, fired = StreakState(), []
    for t, brk in enumerate([True, True, True, True, False, True, True, True]):
        s, f = streak_step(s, "break" if brk else "healthy", float(t), 3)
        fired.append(f)
    assert fired == [False, False, True, False, False, False, False, True]


@pytest.mark.parametrize(("arrivals", "fires_at"), [
    # (launch stamp, kind) in the order the results arrive
    # three crashes launched in a row; a healthy grade launched after them reports first
    ([(1, "break"), (2, "break"), (4, "healthy"), (3, "break")], 3),
    # a healthy grade launched between the crashes splits them: no streak
    ([(1, "break"), (3, "break"), (2, "healthy"), (4, "break")], None),
    # infrastructure INVALIDs (a stall, the endpoint down) neither count nor split
    ([(1, "break"), (2, "neutral"), (3, "break"), (4, "neutral"), (5, "break")], 4),
    # a late crash joining a streak that already alarmed does not alarm again
    ([(1, "break"), (2, "break"), (4, "break"), (3, "break"), (5, "break")], 2),
])
def test_streak_counts_in_launch_order(arrivals: list[tuple[int, str]],
                                       fires_at: int | None) -> None:
    s, fired = StreakState(), []
    for i, (t, kind) in enumerate(arrivals):
        s, f = streak_step(s, kind, float(t), 3)  # type: ignore[arg-type]
        if f:
            fired.append(i)
    assert fired == ([] if fires_at is None else [fires_at])


def test_restart_policy() -> None:
    cfg = BuiltinEndpoint(engine="builtin", down_restart_secs=90, max_restarts=3,
                          restart_window_secs=1000, restart_backoff_secs=10)
    assert restart_action(None, 0, [], cfg) == "ok"
    assert restart_action(0, 50, [], cfg) == "wait"
    assert restart_action(0, 95, [], cfg) == "restart"
    assert restart_action(0, 100, [95], cfg) == "wait"  # backoff 10 after one restart
    assert restart_action(0, 106, [95], cfg) == "restart"
    assert restart_action(0, 300, [100, 200, 290], cfg) == "give_up"
    assert restart_action(0, 2000, [100, 200, 290], cfg) == "restart"  # window passed
    assert [backoff_secs(k, 5, 30) for k in range(5)] == [0, 5, 10, 20, 30]


def test_readiness_probe_pause_is_proportional_and_capped() -> None:
    waits = [0.0, 0.05, 0.1, 1.0, 5.0, 60.0, 3600.0]
    pauses = [probe_pause(w) for w in waits]
    assert pauses == sorted(pauses)  # never probes faster as the wait grows
    assert pauses[2] <= 0.03  # an endpoint up in 0.1 s is seen within 30 ms
    for w, p in zip(waits, pauses, strict=True):
        assert p <= 0.01 + w / 10 + 1e-9  # seen at most ~10% late
    assert pauses[-1] == 0.5  # a 30-minute load is not hammered


def test_eta_and_oneline() -> None:
    assert eta_secs(10, 0, 100) is None
    assert eta_secs(10, 5, 100) == 200
    assert eta_secs(0, 0, 0) == 0
    assert fmt_secs(31) == "0:31" and fmt_secs(3725) == "1:02:05"
    assert fmt_secs(float("inf")) == fmt_secs(float("nan")) == "?"  # a status.json's 1e999
    line = oneline(read_status({"phase": "run:pass1", "preset": "demo", "eta_secs": 31,
                                "totals": {"done": 14, "total": 24, "pass": 9, "fail": 5,
                                           "invalid": 0, "running": 2}}))
    assert line == "run:pass1 demo 14/24 done P9 F5 I0 | 2 running | eta 0:31"
    # a field of another shape (a hostile or torn status.json) reads as its default
    odd = oneline(read_status({"phase": ["x"], "preset": "demo", "eta_secs": "soon",
                               "totals": {"done": [14], "total": 24, "pass": None},
                               "trust": {"teardown_masked_cells": True},
                               "liveness": {"label": 7}, "throttle": {"throttled": "yes"}}))
    assert odd == "? demo 0/24 done P0 F0 I0 | 0 running | eta ?", odd
    every = oneline(read_status({
        "phase": "run:pass1", "preset": "demo", "totals": {"running": 2},
        "trust": {"teardown_masked_cells": 1}, "released": "2026-12-05T01:00:00Z",
        "liveness": {"state": "gone", "label": "stopped (supervisor gone)"},
        "endpoint": {"state": "down"}, "throttle": {"limit": 2, "ceiling": 8,
                                                    "throttled": True}}))
    assert every.split(" | ") == [
        "run:pass1 demo 0/0 done P0 F0 I0 M1", "2 running when last seen", "eta ?",
        "stopped (supervisor gone)", "released 2026-12-05T01:00:00Z: its outputs may be "
        "another run's now; its verdicts are as journaled", "endpoint down",
        "provider throttling: 2/8 at once"]


def _wd(**kw):
    from autopilot.config import Watchdog

    return Watchdog(**{"substance": True, "scroll_loop_streak": 30, "runaway_secs": 600, **kw})


def _call(page: int) -> dict:
    return {"role": "assistant", "tool_calls": [
        {"function": {"name": "read", "arguments": f'{{"file": "a.py", "page": {page}}}'}}]}


def _decide(rows: list[dict], stale: float, cfg):
    """The substance decision over transcript rows, each read as the check reads it."""
    from autopilot.cell.substance import step_of, substance_decision

    return substance_decision([step_of(r, cfg) for r in rows], stale, cfg)


def test_scroll_loop_tail_streak_ignores_digits() -> None:
    rows = [{"role": "assistant", "content": "hi"}] + [_call(p) for p in range(30)]
    assert _decide(rows, 0, _wd()) == (
        "WARN", "scroll loop: 30 identical tool calls in a row")
    assert _decide(rows, 0, _wd(substance_kill=True))[0] == "KILL"
    assert _decide(rows[:30], 0, _wd()) is None  # 29 is not a streak
    broken = [*rows[:15], {"role": "assistant", "tool_calls": [{"function": {"name": "x"}}]}]
    assert _decide(broken + [_call(1)] * 5, 0, _wd()) is None


def test_runaway_generation() -> None:
    rows = [_call(1), {"role": "assistant", "content": "thinking " * 1000}]
    assert _decide(rows, 601, _wd())[1].startswith("runaway generation")
    assert _decide(rows, 599, _wd()) is None
    assert _decide(rows[:1], 5000, _wd()) is None  # a tool call is pending
    assert _decide(rows, 5000, _wd(runaway_secs=0)) is None  # off


def test_check_substance_reads_transcript_tail(tmp_path) -> None:
    import json as _json

    from autopilot.cell.substance import SubstanceState, check_substance

    t = tmp_path / "transcript.jsonl"
    t.write_text("".join(_json.dumps(_call(i)) + "\n" for i in range(40)) + '{"torn')
    s, d = check_substance(SubstanceState(), t, 0.0, _wd(substance_kill=True))
    assert d is not None and d.action == "KILL" and d.kind == "substance" and d.changed
    s, d = check_substance(s, t, 1.0, _wd(substance_kill=True))
    assert d is not None and not d.changed


def _long_turn(generating: list[int | None]) -> list[str]:
    """One non-streaming model turn: the transcript never moves; the endpoint's decoded
    counter is sampled once a second."""
    lim = Limits(warn_secs=5, probe_secs=8, kill_secs=10, stuck_secs=6,
                 teardown_grace_secs=2, deadline=10_000)
    s = WatchState.begin(0.0)
    out = []
    for t, g in enumerate(generating, start=1):
        s, d = decide(s, Observation(now=float(t), transcript_size=100, spool_size=0,
                                     generating=g), lim)
        out.append(d.action if d.action != "KILL" else f"KILL:{d.kind}")
    return out


def test_a_decoding_endpoint_is_progress_for_a_long_turn() -> None:
    # 20 s of decoding: never a stall, though the transcript is frozen far past stuck_secs
    assert set(_long_turn(list(range(100, 2100, 100)))) == {"OK"}


def test_a_frozen_transcript_with_an_idle_endpoint_is_still_killed() -> None:
    # idle endpoint: the transcript last moved at t=1, so frozen 6 s at t=7 -> kill
    acts = _long_turn([None] * 12)
    assert acts[5] == "WARN" and acts[6] == "KILL:stall"
    # decoding stops at t=4 (the counter stays put): WARN at t=9, the freeze kills at t=10
    acts = _long_turn([100, 200, 300, 400, 400, 400, 400, 400, 400, 400, 400])
    assert acts[:9] == ["OK"] * 8 + ["WARN"]
    assert acts[9] == "KILL:stall"


def test_slots_and_metrics_are_read_defensively() -> None:
    from autopilot.endpoints.base import metrics_generation, slots_generation

    busy = [{"id": 0, "is_processing": True, "next_token": [{"n_decoded": 40}],
             "n_prompt_tokens_processed": 10},
            {"id": 1, "is_processing": False, "next_token": [{"n_decoded": 5}]}]
    assert slots_generation(busy) == 55
    assert slots_generation([{**busy[0], "is_processing": False}]) is None  # idle
    for junk in (None, {}, "x", [1], [{"is_processing": True, "next_token": "x"}]):
        assert slots_generation(junk) in (None, 0)
    text = ("# HELP vllm:num_requests_running x\n"
            'vllm:num_requests_running{model_name="m"} 1.0\n'
            'vllm:generation_tokens_total{model_name="m"} 1234.0\n'
            'vllm:prompt_tokens_total{model_name="m"} 66.0\n')
    assert metrics_generation(text) == 1300
    assert metrics_generation(text.replace("} 1.0", "} 0.0")) is None
    assert metrics_generation("garbage\n\x1b[31m") is None


def test_throttle_halves_per_episode_and_grows_back_when_calm() -> None:
    from autopilot.run.throttle import CALM_SECS, HALVE_SECS, Throttle, on_throttled, on_tick

    t = Throttle(limit=8, ceiling=8)
    assert not t.throttled
    t = on_throttled(t, 100.0)
    assert t.limit == 4 and t.throttled
    t = on_throttled(t, 100.0 + HALVE_SECS / 2)  # the same episode: no further halving
    assert t.limit == 4
    t = on_throttled(t, 100.0 + HALVE_SECS + 1)
    assert t.limit == 2
    t = on_throttled(on_throttled(t, 200.0), 200.0 + HALVE_SECS + 1)
    assert t.limit == 1  # never below one cell at once
    quiet = 200.0 + HALVE_SECS + 1
    assert on_tick(t, quiet + CALM_SECS - 1).limit == 1  # not calm long enough
    t = on_tick(t, quiet + CALM_SECS)
    assert t.limit == 2
    assert on_tick(t, quiet + CALM_SECS + 1).limit == 2  # one step per calm period
    for k in range(2, 20):
        t = on_tick(t, quiet + CALM_SECS * k)
    assert t.limit == 8 and not t.throttled  # back to the ceiling, never past it


@pytest.mark.parametrize(("tokens", "usd", "spend", "rate", "why"), [
    (None, None, (10**9, 10**9), None, None),
    (1000, None, (400, 500), None, None),
    (1000, None, (500, 500), None, "budget reached: 1000 tokens of 1000"),
    (None, 1.0, (10**6, 0), (0.5, 2.0), None),
    (None, 1.0, (10**6, 250_000), (0.5, 2.0), "budget reached: $1.0000 of $1"),
    (None, 1.0, (10, 10), None, "budget unusable: a USD budget needs a rate-card price"),
])
def test_budget_reached(tokens, usd, spend, rate, why) -> None:
    from autopilot.config import Rate
    from autopilot.state.budget import Spend, reached

    got = reached(tokens, usd, Spend(*spend), Rate.model_validate(rate) if rate else None)
    assert (got is None and why is None) or (got is not None and why is not None
                                             and got.startswith(why))


def test_spend_from_summaries_and_journals() -> None:
    from autopilot.state.budget import Spend, of_events, of_summary

    assert of_summary({"total_prompt_tokens": 10, "total_completion_tokens": 5}) == Spend(10, 5)
    assert of_summary({"total_prompt_tokens": float("inf"), "total_completion_tokens": "x"}) \
        == Spend()
    from autopilot.state.events import parse

    evs = [{"event": "cell_verdict", "cell": "c", "spend": [10, 5]},
           {"event": "cell_verdict", "cell": "c", "spend": [1, 1], "regrade": True},
           {"event": "cell_verdict", "cell": "c", "spend": [-1, 2]},
           {"event": "cell_verdict", "cell": "c", "spend": [True, 2]},
           {"event": "cell_verdict", "cell": "c", "spend": "10,5"},
           {"event": "cell_started", "cell": "c", "spend": [7, 7]}]
    assert of_events(filter(None, map(parse, evs))) == Spend(10, 5)


def _r(spec: str) -> list[ReplicaView]:
    """'U2 D0 F0': up with 2 free slots, down, failed."""
    return [ReplicaView(up=t[0] == "U", failed=t[0] == "F", free=int(t[1:])) for t in spec.split()]


@pytest.mark.parametrize(("spec", "allowed", "expect"), [
    ("U1 U3 U2", None, 1),  # the most free slots
    ("U2 U2", None, 0),  # a tie: the lowest index, reproducibly
    ("U0 U0", None, "wait"),  # all full: wait for a slot
    ("D2 U0", None, "wait"),  # one down (it may come back), one full
    ("F2 U1", None, 1),  # a failed replica is never chosen
    ("F2 F1", None, "none"),  # none can ever serve: the run must end
    ("U3 U1 U1", [1, 2], 1),  # the arm's pins, even with a freer replica elsewhere
    ("U3 F1 F1", [1, 2], "none"),  # its pinned replicas all failed
    ("U3 D1 F1", [1, 2], "wait"),  # a pinned one is down, not failed
])
def test_choose_replica(spec: str, allowed: list[int] | None, expect: object) -> None:
    assert choose_replica(_r(spec), allowed) == expect


@pytest.mark.parametrize(
    ("free", "low", "change"),
    [
        (10_000, False, None),  # plenty
        (999, False, "low"),  # below the floor of 1000
        (1000, False, None),  # at the floor is not below it
        (1200, True, None),  # above the floor, but not by the headroom: still low
        (1500, True, "ok"),  # back with headroom (RESUME_FACTOR)
        (None, True, None),  # a failed statvfs is no evidence either way
        (None, False, None),
    ],
)
def test_disk_floor_rule(free, low, change) -> None:
    from autopilot.state.diskspace import Reading, decide

    reading = None if free is None else Reading(free, "/x")
    assert decide(reading, 1000, low) == change
    assert decide(reading, 0, low) is None  # floor 0: switched off


def test_disk_watch_low_periods_and_overlap() -> None:
    from autopilot.state.diskspace import DiskWatch, Reading, floor_bytes

    now = [0.0]
    seen: list[str | None] = []
    w = DiskWatch((), 1000, lambda: now[0], on_change=lambda ch, r: seen.append(ch))
    now[0] = 10.0
    assert w.apply(Reading(10, "/x")) is True  # low from t=10
    now[0] = 20.0
    assert w.apply(Reading(5000, "/x")) is False  # back at t=20
    assert seen == ["low", "ok"]
    assert w.overlaps(5, 12) and w.overlaps(15, 16) and w.overlaps(19, 30)
    assert not w.overlaps(0, 9) and not w.overlaps(21, 40)
    # the floor never exceeds what preflight accepted at the start
    assert floor_bytes(200, 1.0) == 200_000_000 and floor_bytes(200, 0.05) == 50_000_000
    assert floor_bytes(200, 0) == 0


def test_a_full_disk_spends_no_retry() -> None:
    from autopilot.loader import load_preset
    from autopilot.plan import Plan
    from autopilot.state.ledger import Ledger

    plan = Plan(load_preset("demo"), 1)
    cid = plan.cells[0].id
    led = Ledger(plan)
    for n, reason in enumerate(("disk_full", "rate_limited", "harness_crash"), 1):
        led.apply({"event": "cell_verdict", "cell": cid, "attempt": n,
                   "verdict": "INVALID", "reason": reason})
    assert led.cells[cid].invalid_attempts == 1  # only the harness crash counts
    assert led.cells[cid].reasons == ["disk_full", "rate_limited", "harness_crash"]


def test_oneline_says_the_disk_is_low_while_running() -> None:
    snap = {"phase": "run:pass1", "preset": "demo", "totals": {"done": 1, "total": 4},
            "disk": {"low": True, "floor_mb": 200.0, "free_mb": 12.5, "where": "/x"}}
    assert oneline(read_status(snap)).endswith("| disk low (12.5 MB free): launching paused")
    assert "disk low" not in oneline(read_status({**snap, "phase": "COMPLETE"}))
    assert "disk low" not in oneline(read_status({**snap, "disk": {"low": False}}))


def _mmbt_rows(commands: list[str]) -> list[dict]:
    """Transcript rows in the MMBT harness's shape: a model row announcing each tool call
    ({name, args_len}), then the tool row with its args and output."""
    rows: list[dict] = []
    for i, cmd in enumerate(commands, 1):
        rows.append({"t": f"2026-05-02T10:{i // 60:02d}:{i % 60:02d}Z", "iter": i,
                     "type": "model", "completion_tokens": 40 + i, "prompt_tokens": 900 * i,
                     "content_len": 120, "finish_reason": "tool_calls",
                     "tool_calls": [{"name": "bash", "args_len": len(cmd) + 14}]})
        rows.append({"t": f"2026-05-02T10:{i // 60:02d}:{i % 60:02d}Z", "iter": i,
                     "type": "tool", "name": "bash", "args": {"command": cmd},
                     "output": f"line {i}\n" * 40, "exit_code": 0})
    return rows


NORMAL_MMBT = [
    ["ls -la", "cat README.md", "python -m pytest -q", "sed -n '1,80p' src/app.py",
     "grep -rn 'def parse' src", "python -m pytest -q tests/test_parse.py",
     "git diff", "python -m pytest -q", "cat > /workspace/answer.md <<'EOF'\nok\nEOF"],
    ["ls inputs", "head -50 inputs/data.csv", "python3 -c 'import csv'", "wc -l inputs/*.csv",
     "python3 extract.py", "python3 extract.py --check", "cat out.json", "ls -la out"],
    ["find . -name '*.log' | head", *[f"sed -n '{k * 40 + 1},{k * 40 + 40}p' app.log"
                                      for k in range(12)], "grep -c ERROR app.log",
     "python3 triage.py", "cat triage.md"],
]


def test_substance_reads_the_mmbt_transcript_shape(tmp_path) -> None:
    from autopilot.cell.substance import SubstanceState, check_substance
    from autopilot.config import Watchdog

    cfg = Watchdog(substance=True, transcript_schema="mmbt", runaway_secs=600)
    path = tmp_path / "transcript.jsonl"
    # A 40-iteration scroll loop: the same file paged by offset, a model row between each.
    loop = _mmbt_rows(["ls"] + [f"sed -n '{k * 50 + 1},{k * 50 + 50}p' src/logalyzer.py"
                                for k in range(40)])
    path.write_text("".join(json.dumps(r) + "\n" for r in loop))
    _, d = check_substance(SubstanceState(), path, 100.0, cfg)
    assert d is not None and d.action == "WARN" and "scroll loop: 40 identical" in d.reason
    # The same rows read as role / tool_calls messages see nothing: the blind spot.
    _, blind = check_substance(SubstanceState(), path, 100.0,
                               Watchdog(substance=True, runaway_secs=600))
    assert blind is None
    # Twelve normal transcripts of the real shape (repeats, paging a while) raise nothing.
    for i in range(12):
        cmds = NORMAL_MMBT[i % 3] * (1 + i % 2) + [f"echo done {i}"]
        path.write_text("".join(json.dumps(r) + "\n" for r in _mmbt_rows(cmds)))
        _, d = check_substance(SubstanceState(), path, 100.0 + i, cfg)
        assert d is None, (i, d)
    # Runaway: stale past runaway_secs with a model row last.
    rows = [*_mmbt_rows(["ls", "cat a.py"]), {"type": "model", "iter": 3, "tool_calls": []}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    st, d = check_substance(SubstanceState(), path, 0.0, cfg)
    assert d is None
    _, d = check_substance(st, path, 700.0, cfg)
    assert d is not None and "runaway generation" in d.reason


def _ev(requests=3, answered=3, errors=None, first=None):
    from autopilot.cell.validity import Evidence

    return Evidence(requests, answered, errors or {}, first)


@pytest.mark.parametrize(("c", "run", "ev", "label", "caveat"), [
    # the model ran out of time while the endpoint answered: its FAIL
    (("INVALID", "deadline"), RunOutcome(None, killed="deadline"), _ev(), "FAIL", "timed out"),
    # it looped (the substance watchdog's kill): its FAIL
    (("INVALID", "stall"), RunOutcome(None, killed="stall",
                                      kill_reason="scroll loop: 30 identical tool commands"),
     _ev(), "FAIL", "looped"),
    # it outgrew its context (a 400 saying so, after earlier answers): its FAIL
    (("INVALID", "api_error"), RunOutcome(0, completion=True),
     _ev(errors={"context_overflow": 1}), "FAIL", "context exceeded"),
    # the first request already over the served context: the preset's settings
    (("INVALID", "zero_tokens"), RunOutcome(0, completion=True),
     _ev(1, 1, {"context_overflow": 1}, "context_overflow"), "INVALID(config)", None),
    # a frozen harness with no request in flight: a stall, the infrastructure's
    (("INVALID", "stall"), RunOutcome(None, killed="stall", kill_reason="transcript frozen"),
     _ev(), "INVALID(stall)", None),
    # the endpoint failing, down, or never reached: INVALID as before
    (("INVALID", "deadline"), RunOutcome(None, killed="deadline"),
     _ev(errors={"endpoint_error": 2}), "INVALID(deadline)", None),
    (("INVALID", "endpoint_down"), RunOutcome(None, killed="stall", endpoint_down=True),
     _ev(), "INVALID(endpoint_down)", None),
    (("INVALID", "deadline"), RunOutcome(None, killed="deadline"), _ev(0, 0),
     "INVALID(deadline)", None),
    # killed at the deadline before any answer came back, nothing open at the endpoint:
    # no evidence of the model
    (("INVALID", "deadline"), RunOutcome(None, killed="deadline"), _ev(1, 0),
     "INVALID(deadline)", None),
    # ... but with its first request open at the endpoint all along: the model's FAIL
    (("INVALID", "deadline"), RunOutcome(None, killed="deadline", working=True), _ev(1, 0),
     "FAIL", "timed out"),
    # working, yet the endpoint was failing it: the infrastructure's
    (("INVALID", "deadline"), RunOutcome(None, killed="deadline", working=True),
     _ev(2, 0, {"endpoint_error": 1}), "INVALID(deadline)", None),
    # grading's own failures and valid verdicts are never touched
    (("INVALID", "grader_failed"), RunOutcome(0, completion=True),
     _ev(errors={"context_overflow": 1}), "INVALID(grader_failed)", None),
    (("PASS", None), RunOutcome(0, completion=True), _ev(), "PASS", None),
    # no gateway evidence: as before
    (("INVALID", "deadline"), RunOutcome(None, killed="deadline"), None,
     "INVALID(deadline)", None),
])
def test_count_by_evidence(c, run, ev, label, caveat) -> None:
    from autopilot.cell.validity import Classification, count_by_evidence

    got = count_by_evidence(Classification(c[0], reason=c[1]), run, ev)
    assert (got.label(), got.caveat) == (label, caveat)
    # the counting before the gateway, on request
    assert count_by_evidence(Classification(c[0], reason=c[1]), run, ev,
                             "invalid").label() == Classification(c[0], reason=c[1]).label()


def test_the_origins_coder_p3_market_is_zero_of_ten_not_zero_of_zero() -> None:
    """Coder p3_market in the origin's scorecard: 5 loops, 4 HTTP-400 context overflows, 1
    wall-killed — 0/10 against the model, not 10 INVALID and 'no data'."""
    from autopilot.cell.validity import Classification, count_by_evidence

    loop = RunOutcome(None, killed="stall", kill_reason="scroll loop: 30 identical")
    cells = ([(("INVALID", "stall"), loop, _ev(40, 40))] * 5
             + [(("INVALID", "api_error"), RunOutcome(0, completion=True),
                 _ev(12, 12, {"context_overflow": 1}))] * 4
             + [(("INVALID", "deadline"), RunOutcome(None, killed="deadline"), _ev(30, 30))])
    got = [count_by_evidence(Classification(v, reason=r), run, ev) for (v, r), run, ev in cells]
    assert [g.verdict for g in got] == ["FAIL"] * 10
    assert sum(g.verdict == "PASS" for g in got) == 0  # 0/10
