"""A supervisor frozen by SIGSTOP for longer than every watchdog tier and the grader's
timeout comes back without charging its own absence to the cells: no stall or teardown
kill, no grader timeout, no teardown-masked verdict; the run completes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_env, events, wait_for, write_overlay

SLOW_GRADER = ("import subprocess, sys, time; time.sleep(2.0); "
               "sys.exit(subprocess.call([sys.executable, '-m', 'autopilot.demo.grader', "
               "*sys.argv[1:]]))")
# The demo harness, then 1.5 s of teardown (outputs written, process still alive): inside
# the 2 s teardown grace, unless the supervisor's own absence is counted.
LINGER = ("import subprocess, sys, time; "
          "code = subprocess.call([sys.executable, '-m', 'autopilot.demo.harness', "
          "*sys.argv[1:]]); time.sleep(1.5); sys.exit(code)")
HARNESS = ["{python}", "-c", LINGER, "{cell}", "--task", "{task}", "--arm", "{arm}",
           "--n", "{n}", "--attempt", "{attempt}", "--host", "{host}", "--port", "{port}",
           "--model", "{model}", "--out", "{output_dir}", "--think-secs", "0.1"]


def grading_now(state: Path) -> bool:
    """A harness has exited and its cell has no verdict yet: its grader is running."""
    evs = events(state)
    exited = {e["cell"] for e in evs if e["event"] == "cell_exited"}
    return bool(exited - {e["cell"] for e in evs if e["event"] == "cell_verdict"})


@pytest.mark.slow
def test_sigstop_past_every_timeout_charges_nothing_to_the_cells(tmp_path: Path) -> None:
    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {
        "tasks": [{"id": "p1_bugfix"}, {"id": "p2_extract"}, {"id": "p3_market"}],
        "harness": {"argv": HARNESS},
        "grader": {"timeout_secs": 3, "argv": [
            "{python}", "-c", SLOW_GRADER, "{output_dir}", "--out", "{grade_file}"]}})
    p = subprocess.Popen([sys.executable, "-m", "autopilot.cli", "--preset", "demo",
                          "--target-n", "2", "--config", str(over), "--state-dir", str(state),
                          "--quiet"], env=cli_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        wait_for(lambda: grading_now(state), what="a grader running", timeout=120)
        os.kill(p.pid, signal.SIGSTOP)
        time.sleep(12)  # longer than kill_secs (5), stuck_secs (4) and the grader's 3 s
        os.kill(p.pid, signal.SIGCONT)
        _, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait()
    assert p.returncode == 0, err.decode()[-3000:]
    evs = events(state)
    assert [e for e in evs if e["event"] == "cell_killed"] == []
    assert [e for e in evs if e["event"] == "grade_retry"] == []
    verdicts = [e for e in evs if e["event"] == "cell_verdict"]
    assert all(e["verdict"] in ("PASS", "FAIL") for e in verdicts), verdicts
    assert not any(e.get("teardown_masked") for e in verdicts)
    assert "supervisor_was_frozen" in (state / "autopilot.log").read_text()
