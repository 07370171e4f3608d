"""A cell of many items as pure data (autopilot.cell.itemsprogress, autopilot.state.items):
what a harness says of its progress is shape-checked, its deadline scales with the
items still to run within the cap, a cut is INVALID(interrupted) whatever the evidence
says, and only a cut that moved on spends no retry."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import write_overlay

from autopilot.cell.itemsprogress import ItemsWatch, deadline_secs, read_progress
from autopilot.cell.validity import Evidence, RunOutcome, classify, count_by_evidence
from autopilot.config import DEFAULT_VERDICTS
from autopilot.config.limits import limits_for
from autopilot.loader import load_preset
from autopilot.plan import Plan
from autopilot.state.items import ItemsProgress, progress_of
from autopilot.state.ledger import Ledger


@pytest.mark.parametrize("raw, expect", [
    ({"total": 8, "done": 4, "reused": 3}, ItemsProgress(8, 4, 3)),
    ({"total": 8, "done": 0}, ItemsProgress(8, 0, 0)),
    ({"total": 8, "done": 9}, None),                 # more done than there are
    ({"total": 8, "done": 2, "reused": 3}, None),    # more reused than done
    ({"total": 0, "done": 0}, None),
    ({"total": 8.0, "done": 4}, None),               # not whole counts
    ({"total": True, "done": 0}, None),
    ({"total": 10**9, "done": 0}, None),             # beyond any eval
    ([8, 4], None), ("8/4", None), (None, None),
])
def test_progress_is_shape_checked(raw: object, expect: ItemsProgress | None) -> None:
    assert progress_of(raw) == expect


def test_the_file_is_read_as_untrusted_input(tmp_path: Path) -> None:
    f = tmp_path / "items.json"
    f.write_text('{"total": 6, "done": 3}')
    assert read_progress(f) == ItemsProgress(6, 3)
    link = tmp_path / "link.json"
    link.symlink_to(f)
    assert read_progress(link) is None  # never through a link
    big = tmp_path / "big.json"
    big.write_text('{"total": 6, "done": 3, "pad": "' + "x" * 10_000 + '"}')
    assert read_progress(big) is None
    watch = ItemsWatch(f)
    assert watch.poll() and watch.last == ItemsProgress(6, 3)
    assert not watch.poll()  # unchanged: not read again
    f.write_text('{"total": 6, "done": 4}')
    os.utime(f, ns=(1, 1))
    assert watch.poll() and watch.last == ItemsProgress(6, 4)
    f.write_text("garbage")
    os.utime(f, ns=(2, 2))
    assert not watch.poll() and watch.last == ItemsProgress(6, 4)  # the last good word


def test_the_deadline_scales_with_the_items_still_to_run(tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {
        "watchdog": {"deadline_overhead_secs": 60, "deadline_cap_secs": 3600},
        "harness": {"wall_budget_secs": 300, "item_budget_secs": 60},
        "tasks": [{"id": "p1_bugfix"}, {"id": "p2_hallucination", "wall_budget_secs": 100}]})
    p = load_preset("demo", overlay=str(over))
    lim, own = limits_for(p, "p1_bugfix"), limits_for(p, "p2_hallucination")
    assert deadline_secs(lim, None) == 360  # before the count is known
    assert deadline_secs(lim, ItemsProgress(1, 0)) == 360  # one item: a cell
    assert deadline_secs(lim, ItemsProgress(8, 0)) == 8 * 60 + 60
    assert deadline_secs(lim, ItemsProgress(8, 5, 5)) == 360  # 3 to run: the floor
    assert deadline_secs(lim, ItemsProgress(1000, 0)) == 3600  # never past the cap
    assert deadline_secs(own, ItemsProgress(8, 0)) == 160  # the task's own budget stands
    assert ItemsWatch(None).rescale(10.0, lim, 370.0, "c", 1) is None
    f = tmp_path / "items.json"
    f.write_text('{"total": 8, "done": 0}')
    watch = ItemsWatch(f)
    moved, said = watch.rescale(10.0, lim, 370.0, "c", 1)  # type: ignore[misc]
    assert moved == 10.0 + 540 and (said.deadline_secs, said.total) == (540, 8)
    f.write_text('{"total": 8, "done": 1}')
    os.utime(f, ns=(5, 5))
    assert watch.rescale(10.0, lim, moved, "c", 1) is None  # progress moves no deadline


def test_a_cut_is_interrupted_never_the_models_fail() -> None:
    cut = RunOutcome(exit_code=-15, killed="deadline", kill_reason="hard deadline passed",
                     working=True, finished={"total": 8, "done": 4, "reused": 1})
    c = classify(cut, None, DEFAULT_VERDICTS)
    assert (c.verdict, c.reason) == ("INVALID", "interrupted")
    assert "4 of 8 samples finished (3 by this attempt)" in c.detail
    assert c.finished == {"total": 8, "done": 4, "reused": 1, "new": 3}
    # the verdict as journaled: how far it got, and no items (nothing it counts)
    ev = c.as_event("c", 2)
    assert (ev.finished, ev.items, ev.verdict, ev.reason) == (
        c.finished, None, "INVALID", "interrupted")
    assert "items" not in ev.model_fields_set and "ungraded" not in ev.model_fields_set
    # a request open at the cut would make a one-item cell the model's FAIL: not here
    ev = Evidence(requests=5, answered=4, errors={"context_overflow": 1})
    assert count_by_evidence(c, cut, ev).reason == "interrupted"
    one = RunOutcome(exit_code=-15, killed="deadline", kill_reason="x", working=True)
    assert count_by_evidence(classify(one, None, DEFAULT_VERDICTS), one,
                             Evidence(requests=1, answered=1)).verdict == "FAIL"
    whole = RunOutcome(exit_code=4, finished={"total": 8, "done": 8})
    assert classify(whole, None, DEFAULT_VERDICTS).reason == "harness_crash"
    assert not c.harness_break


def test_only_a_cut_that_moved_on_spends_no_retry() -> None:
    plan = Plan(load_preset("demo"), 1)
    cid = plan.cells[0].id
    led = Ledger(plan)
    for n, finished in enumerate(({"total": 6, "done": 3, "reused": 0, "new": 3},
                                  {"total": 6, "done": 3, "reused": 3, "new": 0},
                                  {"total": 6, "done": 99}), 1):
        led.apply({"event": "cell_verdict", "cell": cid, "attempt": n, "verdict": "INVALID",
                   "reason": "interrupted", "finished": finished})
    assert led.cells[cid].invalid_attempts == 2  # no progress, and a forged count
