"""A dead or frozen run never looks alive: every view reads the heartbeat and says
STALE (with its age) or "stopped (supervisor gone)"; a live run is shown as it is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env, events, run_cli, wait_for, write_overlay

from autopilot.state.liveness import judge

HB = {"pid": 1, "create_time": 1.0, "host": "h", "epoch": 1000.0, "interval_secs": 10}


@pytest.mark.parametrize(("phase", "hb", "alive", "now", "state", "label"), [
    ("run:pass1", HB, True, 1005.0, "live", ""),
    ("run:pass1", HB, True, 1031.0, "stale", "STALE (heartbeat 31s old)"),
    ("run:pass1", {**HB, "interval_secs": 0.5}, True, 1002.0, "stale",
     "STALE (heartbeat 2s old)"),
    ("run:pass1", HB, False, 1001.0, "gone", "stopped (supervisor gone)"),
    ("handed_over", HB, False, 1001.0, "handover",  # systemctl restart: the gap
     "handing over: attempts run on under their data paths; the next supervisor "
     "re-attaches"),
    ("run:pass1", HB, None, 1200.0, "stale", "STALE (heartbeat 3m20s old)"),  # other host
    ("run:pass1", HB, None, 1001.0, "live", ""),
    ("run:pass1", None, False, 1001.0, "unknown", "no heartbeat (supervisor not running?)"),
    ("COMPLETE", HB, False, 9999.0, "finished", ""),
    ("INCOMPLETE", None, False, 9999.0, "finished", ""),
    # a phase of another shape (a hostile status.json) is no phase, and no crash
    (["COMPLETE"], HB, False, 1001.0, "gone", "stopped (supervisor gone)"),
    ({"x": 1}, HB, True, 1005.0, "live", ""),
])
def test_judge(phase, hb, alive, now, state, label) -> None:
    live = judge(phase, hb, alive, now)
    assert (live.state, live.label) == (state, label)


def views(state: Path) -> tuple[str, dict, str]:
    one = run_cli("--state-dir", str(state), "--oneline", prog="dashboard")
    js = run_cli("--state-dir", str(state), "--json", prog="dashboard")
    grid = run_cli("--state-dir", str(state), "--no-color", "--no-events", prog="dashboard")
    assert one.returncode == js.returncode == grid.returncode == 0, one.stderr + js.stderr
    return one.stdout.strip(), json.loads(js.stdout), grid.stdout


@pytest.mark.parametrize("phase", [["COMPLETE"], {"a": 1}, 7, None])
def test_a_status_of_another_shape_is_shown_not_a_traceback(tmp_path: Path,
                                                           phase: object) -> None:
    """status.json is untrusted: a phase that is no text (a list is not even hashable)
    is shown by every view as what it can tell, never as a traceback."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "status.json").write_text(json.dumps({"phase": phase, "preset": "p"}))
    import socket

    gone = {**HB, "host": socket.gethostname()}  # pid 1, but not since 1970: not its holder
    (state / "heartbeat.json").write_text(json.dumps(gone))
    one, js, grid = views(state)
    assert "stopped (supervisor gone)" in one, one
    assert js["liveness"]["state"] == "gone"
    assert "Traceback" not in grid


@pytest.mark.slow
def test_frozen_then_dead_supervisor_is_shown_as_such(tmp_path: Path) -> None:
    state = tmp_path / "state"
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0.4"}})
    args = ["--preset", "demo", "--target-n", "3", "--concurrency", "2", "--config",
            str(over), "--state-dir", str(state), "--quiet"]
    p = subprocess.Popen([sys.executable, "-m", "autopilot.cli", *args],
                         env=cli_env(AUTOPILOT_HEARTBEAT_SECS="0.3"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: sum(e["event"] == "cell_started" for e in events(state)) >= 2,
                 what="cells running")
        one, js, _ = views(state)
        assert js["liveness"]["state"] == "live" and "STALE" not in one

        os.kill(p.pid, signal.SIGSTOP)
        wait_for(lambda: "STALE (heartbeat" in views(state)[0], what="STALE in --oneline")
        one, js, grid = views(state)
        assert one.startswith("STALE demo ") and "running when last seen" in one
        assert js["phase"] == "STALE" and js["liveness"]["state"] == "stale"
        assert js["liveness"]["heartbeat_age_secs"] > 0.9
        assert grid.startswith("STALE (heartbeat ")

        os.kill(p.pid, signal.SIGCONT)
        wait_for(lambda: "STALE" not in views(state)[0], what="recovery after SIGCONT")

        p.kill()  # kill -9: the heartbeat names a process that is gone
        p.wait()
        one, js, grid = views(state)
        assert one.startswith("stopped demo ") and one.endswith("stopped (supervisor gone)")
        assert js["phase"] == "stopped" and js["liveness"]["state"] == "gone"
        assert grid.startswith("stopped (supervisor gone), as last written")
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait()
    r = run_cli(*args)  # resume: finishes, and the views agree it is over
    assert r.returncode == 0, r.stderr[-2000:]
    one, js, _ = views(state)
    assert one.startswith("COMPLETE demo ") and js["liveness"]["state"] == "finished"
