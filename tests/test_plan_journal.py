"""Plan ids and identity; journal append/replay including a torn last line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autopilot.errors import PlanChangedError
from autopilot.loader import load_preset
from autopilot.plan import Plan
from autopilot.run.recovery import check_plan_identity
from autopilot.state.journal import Journal, read_events
from autopilot.state.ledger import Ledger


def test_cell_ids_and_order() -> None:
    plan = Plan(load_preset("demo"), 2)
    ids = [c.id for c in plan.cells]
    assert len(ids) == 6 * 2 * 2 == len(set(ids))
    assert ids[0] == "p1_bugfix_demo-nothink_v1"
    # replicate-major inside an arm: every task's v1 before any v2
    assert ids[5] == "p3_writing_demo-nothink_v1" and ids[6] == "p1_bugfix_demo-nothink_v2"
    assert ids[12] == "p1_bugfix_demo-think_v1"


def test_identity_ignores_n_but_not_meaning(tmp_path: Path) -> None:
    p = load_preset("demo")
    assert Plan(p, 3).identity == Plan(p, 20).identity
    over = tmp_path / "o.json"
    over.write_text(json.dumps({"vars": {"seed": "8"}}))
    assert Plan(load_preset("demo", overlay=str(over)), 3).identity != Plan(p, 3).identity
    over.write_text(json.dumps({"run": {"concurrency": 9}, "watchdog": {"stuck_secs": 5}}))
    assert Plan(load_preset("demo", overlay=str(over)), 3).identity == Plan(p, 3).identity


def test_plan_identity_refusal(tmp_path: Path) -> None:
    plan = Plan(load_preset("demo"), 3)
    (tmp_path / "plan.json").write_text(json.dumps({"preset": "other", "identity": "abc"}))
    with pytest.raises(PlanChangedError, match="--allow-plan-change"):
        check_plan_identity(tmp_path, plan, allow_change=False)
    assert check_plan_identity(tmp_path, plan, allow_change=True) is not None


def test_replay_skips_torn_last_line_and_next_append_is_clean(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    j.append("cell_started", cell="p1_bugfix_demo-nothink_v1", attempt=1, pid=1)
    j.append("cell_verdict", cell="p1_bugfix_demo-nothink_v1", attempt=1, verdict="PASS")
    j.close()
    with path.open("ab") as f:
        f.write(b'{"ts":"x","event":"cell_sta')  # died mid-write
    res = read_events(path)
    assert [e["event"] for e in res.events] == ["cell_started", "cell_verdict"]
    assert res.torn_lines == [3]
    j2 = Journal(path)  # repairs the tail: the next record starts on a fresh line
    j2.append("cell_started", cell="p1_bugfix_demo-nothink_v2", attempt=1)
    j2.close()
    res = read_events(path)
    assert [e["event"] for e in res.events] == ["cell_started", "cell_verdict", "cell_started"]
    assert res.torn_lines == [3]


def test_ledger_replay_rebuilds_state() -> None:
    plan = Plan(load_preset("demo"), 1)
    led = Ledger(plan)
    c1, c2, c3 = (c.id for c in plan.cells[:3])
    for ev in [
        {"event": "cell_started", "cell": c1, "attempt": 1, "pid": 5},
        {"event": "cell_verdict", "cell": c1, "attempt": 1, "verdict": "PASS"},
        {"event": "cell_started", "cell": c2, "attempt": 1},
        {"event": "cell_verdict", "cell": c2, "attempt": 1, "verdict": "INVALID",
         "reason": "stall"},
        {"event": "cell_started", "cell": c3, "attempt": 1, "pid": 9},
        {"event": "cell_started", "cell": "not_in_plan_v9", "attempt": 1},
    ]:
        led.apply(ev)
    assert led.cells[c1].status == "PASS"
    assert led.cells[c2].status == "invalid" and led.cells[c2].reasons == ["stall"]
    assert led.cells[c3].status == "running" and led.cells[c3].pid == 9
    assert [c.id for c in led.pending()][:1] == [c2]
    t = led.trust()
    assert t.valid_cells == 1 and t.invalid_by_reason == {"stall": 1}
    assert t.excluded == ((c2, "invalid", ("stall",)),)
    # status.json's form of it, as every version wrote it
    assert t.as_json()["excluded"] == [{"cell": c2, "status": "invalid", "reasons": ["stall"]}]
    assert "items" not in t.as_json()
    assert led.counts().running == 1
