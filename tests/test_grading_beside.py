"""A cell's slot goes to the next cell once its harness has ended: its grading runs
beside the next harness (Backend.grades_beside), unless the grading uses the model.

Real runs of the CLI with a one-slot run of two cells. The handshake is the first
cell's grader waiting for the second cell's harness to start: it can only see that if
the slot was given back before the grading.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from conftest import events, run_cli, write_overlay

# The harness marks that it started (in a dir the test owns), then leaves its outputs.
HARNESS = ["/bin/sh", "-c", 'touch "$2/started-$3"; mkdir -p "$1"; '
           "echo '{{\"total_completion_tokens\": 1}}' > \"$1/summary.json\"",
           "cell", "{output_dir}", "MARKS", "{task}"]

# t0's grader waits (up to its last argument's seconds) for t1's harness to start: PASS
# if it did while t0 was being graded, FAIL if it never did. t1's grade is PASS at once.
GRADER_SCRIPT = """
import json, os, sys, time
out, task, marks, wait = sys.argv[1:4] + [float(sys.argv[4])]
verdict = "PASS"
if task == "t0":
    deadline = time.monotonic() + wait
    while not os.path.exists(os.path.join(marks, "started-t1")):
        if time.monotonic() > deadline:
            verdict = "FAIL"
            break
        time.sleep(0.02)
with open(out, "w") as fh:
    json.dump(dict(verdict=verdict), fh)
"""


def overlay(tmp: Path, marks: Path, wait: float, **grader: Any) -> Path:
    harness = [marks.as_posix() if arg == "MARKS" else arg for arg in HARNESS]
    doc = {"tasks": [{"id": "t0"}, {"id": "t1"}], "arms": [{"label": "b-x", "mode": "x"}],
           "harness": {"argv": harness, "completion": ["{output_dir}/summary.json"],
                       "user": "same"},
           "grader": {"argv": [sys.executable, "-c", GRADER_SCRIPT, "{grade_file}", "{task}",
                               marks.as_posix(), str(wait)], **grader},
           "run": {"concurrency": 1}, "trust": {"arm_checks": []}, "baseline": None}
    return write_overlay(tmp / "o.json", doc)


def first(evs: list[dict[str, Any]], event: str, cell: str) -> int:
    return next(i for i, ev in enumerate(evs) if ev["event"] == event and ev["cell"] == cell)


def test_the_next_harness_runs_while_a_cell_is_graded(state_dir: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    r = run_cli("--preset", "demo", "--target-n", "1", "--config",
                str(overlay(tmp_path, marks, wait=10.0)), "--state-dir", str(state_dir),
                "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    evs = events(state_dir)
    verdicts = {ev["cell"]: ev["verdict"] for ev in evs if ev["event"] == "cell_verdict"}
    # t0's grader saw t1's harness start: the one slot was free while t0 was graded
    assert verdicts == {"t0_b-x_v1": "PASS", "t1_b-x_v1": "PASS"}, verdicts
    assert first(evs, "cell_exited", "t0_b-x_v1") < first(evs, "cell_spawning", "t1_b-x_v1") \
        < first(evs, "cell_verdict", "t0_b-x_v1")
    # and never two harnesses at once: t1 spawned only once t0's had ended
    assert first(evs, "cell_spawning", "t1_b-x_v1") > first(evs, "cell_exited", "t0_b-x_v1")


def test_a_grading_that_uses_the_model_keeps_its_slot(state_dir: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    r = run_cli("--preset", "demo", "--target-n", "1", "--config",
                str(overlay(tmp_path, marks, wait=1.0, model_access=True)),
                "--state-dir", str(state_dir), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    evs = events(state_dir)
    verdicts = {ev["cell"]: ev["verdict"] for ev in evs if ev["event"] == "cell_verdict"}
    # model-graded scoring loads the endpoint as a cell does: no harness started while t0
    # was graded (its grader waited a second for one), and the next cell waited for it
    assert verdicts == {"t0_b-x_v1": "FAIL", "t1_b-x_v1": "PASS"}, verdicts
    assert first(evs, "cell_verdict", "t0_b-x_v1") < first(evs, "cell_spawning", "t1_b-x_v1")
