"""validate, the dashboard and the report count one fold of the journal
(autopilot.state.ledger): for every state a kill can leave a cell in, the three say the
same counts.

The base is a real run: p1 PASS, p2 INVALID(grader_unavailable) (its grader needs a
file that is not there, ``on_unavailable = "record"``). Each case then raises N to 2 and
appends, for p1's v2, the events a supervisor writes before the state (the shapes of the
real journal: cell_spawning, cell_started, cell_exited, cell_adopted, cell_abandoned,
cell_verdict, cell_quarantined), as if it had been killed right there.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli, write_overlay

pytestmark = pytest.mark.timeout(300)

CELL = "p1_bugfix_demo-nothink_v2"
TS = "2099-01-01T00:00:0{}+00:00"


def _started(k: int = 1) -> list[dict[str, Any]]:
    return [{"event": "cell_spawning", "cell": CELL, "attempt": k, "marker": "x"},
            {"event": "cell_started", "cell": CELL, "attempt": k, "pid": 999999999}]


def _invalid(k: int) -> list[dict[str, Any]]:
    return [*_started(k), {"event": "cell_exited", "cell": CELL, "attempt": k,
                           "outcome": {"exit_code": 1, "completion": False}},
            {"event": "cell_verdict", "cell": CELL, "attempt": k, "verdict": "INVALID",
             "reason": "missing_output", "detail": "no summary.json"}]


# state -> (events for p1 v2, what validate calls the cell, its PENDING reason)
CASES: dict[str, tuple[list[dict[str, Any]], str, str]] = {
    "not run": ([], "ABSENT", ""),
    "running": (_started(), "PENDING", "interrupted"),
    "exited, not graded": ([*_started(), {"event": "cell_exited", "cell": CELL,
                                          "attempt": 1, "outcome": {"exit_code": 0}}],
                           "PENDING", "grading"),
    "adopted": ([*_started(), {"event": "cell_adopted", "cell": CELL, "attempt": 1,
                               "outcome": {"exit_code": 0, "completion": True}}],
                "PENDING", "grading"),
    "abandoned": ([*_started(), {"event": "cell_abandoned", "cell": CELL, "attempt": 1,
                                 "why": "stopped by SIGTERM"}], "PENDING", "abandoned"),
    "quarantined": ([*_invalid(1), *_invalid(2), *_invalid(3),
                     {"event": "cell_quarantined", "cell": CELL}], "INVALID", "quarantined"),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("ledger")
    over = write_overlay(tmp / "o.json", {
        "vars": {"think_secs": "0"}, "baseline": None,
        "tasks": [{"id": "p1_bugfix"},
                  {"id": "p2_extract", "grader_requires": ["/nonexistent/answer-key"]}],
        "arms": [{"label": "demo-nothink", "mode": "nothink"}],
        "grader": {"on_unavailable": "record"}})
    state = tmp / "state"
    r = run_cli("--preset", "demo", "--config", str(over), "--target-n", "1",
                "--state-dir", str(state), "--quiet")
    assert r.returncode == 1, r.stderr[-2000:]  # INCOMPLETE: p2 is ungradable here
    assert "grader_unavailable" in r.stdout + r.stderr
    return state


def views(state: Path) -> dict[str, dict[str, int]]:
    """Each view's counts in common terms: valid, excluded (INVALID of any kind,
    quarantined included), quarantined, and not counted (no verdict)."""
    v = run_cli("validate", "--state-dir", str(state))
    assert v.returncode in (0, 1), v.stderr
    got = dict(re.findall(r"(\w+)=(\d+)", v.stdout.splitlines()[0]))
    val = {k: int(x) for k, x in got.items()}
    quarantined = v.stdout.count("  quarantined  ")
    validate = {"valid": val.get("PASS", 0) + val.get("FAIL", 0),
                "excluded": val.get("INVALID", 0), "quarantined": quarantined,
                "uncounted": val.get("PENDING", 0) + val.get("ABSENT", 0)
                + val.get("RUNNING", 0)}
    d = run_cli("--json", "--state-dir", str(state), prog="dashboard")
    assert d.returncode == 0, d.stderr
    t = json.loads(d.stdout)["trust"]
    cells = [w for arm in json.loads(d.stdout)["arms"].values()
             for task in arm["tasks"].values() for w in task["cells"].values()]
    dashboard = {"valid": t["valid_cells"],
                 "excluded": t["invalid_cells"] + t["quarantined_cells"] + t["ungraded_cells"],
                 "quarantined": t["quarantined_cells"],
                 "uncounted": sum(w in ("RUNNING", "PENDING") for w in cells)}
    rep = run_cli("report", "--state-dir", str(state))
    assert rep.returncode == 0, rep.stderr
    m = re.search(r"Trust: valid (\d+) · invalid (\d+)(?: \([^)]*\))? · quarantined (\d+) · "
                  r".* not run (\d+)", rep.stdout)
    assert m, rep.stdout[:600]
    valid, invalid, quar, not_run = map(int, m.groups())
    report = {"valid": valid, "excluded": invalid + quar, "quarantined": quar,
              "uncounted": not_run}
    return {"validate": validate, "dashboard": dashboard, "report": report}


@pytest.mark.parametrize("case", list(CASES))
def test_validate_the_dashboard_and_the_report_agree(base: Path, tmp_path: Path,
                                                     case: str) -> None:
    state = tmp_path / "state"
    shutil.copytree(base, state)
    plan = json.loads((state / "plan.json").read_text())
    (state / "plan.json").write_text(json.dumps({**plan, "target_n": 2}))
    evs, word, reason = CASES[case]
    with (state / "journal.jsonl").open("a") as f:
        for i, ev in enumerate(evs):
            f.write(json.dumps({"ts": TS.format(i % 10), **ev}) + "\n")
    seen = views(state)
    assert seen["validate"] == seen["dashboard"] == seen["report"], seen
    quarantined = case == "quarantined"
    assert seen["validate"] == {"valid": 1, "excluded": 2 if quarantined else 1,
                                "quarantined": int(quarantined),
                                "uncounted": 1 + (not quarantined)}, seen
    v = run_cli("validate", "--state-dir", str(state)).stdout
    assert re.search(r"p2_extract_demo-nothink_v1 +grader_unavailable", v)
    if word == "PENDING":
        assert f"{reason} 1" in v  # the pending line names why, as the journal does
    elif word == "INVALID":
        assert re.search(rf"{CELL} +quarantined +after 3 INVALID attempts", v)
