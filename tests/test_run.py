"""Whole runs of the embedded demo through the real CLI, real subprocesses.

Handshakes, not sleeps: tests wait on journal events the supervisor fsyncs before it
acts. No assertion on wall-clock duration.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import psutil
import pytest
from conftest import (
    events,
    run_cli,
    spawn_cli,
    token_holders,
    wait_for,
    write_overlay,
)

from autopilot.cell.procs import RUN_TOKEN_ENV, TOKEN_ENV, run_token
from autopilot.cell.procs import journaled_alive as alive_identities

pytestmark = pytest.mark.slow


def valid_verdicts(evs):
    return Counter(e["cell"] for e in evs
                   if e["event"] == "cell_verdict" and e["verdict"] in ("PASS", "FAIL"))


def assert_each_cell_once_and_never_rerun(evs, n_cells: int) -> None:
    counts = valid_verdicts(evs)
    assert len(counts) == n_cells
    assert set(counts.values()) == {1}, {c: k for c, k in counts.items() if k != 1}
    done: set[str] = set()
    for e in evs:  # no cell starts again after its valid verdict
        if e["event"] == "cell_started":
            assert e["cell"] not in done, f"{e['cell']} re-run after completion"
        if e["event"] == "cell_verdict" and e["verdict"] in ("PASS", "FAIL"):
            done.add(e["cell"])


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda p: (p[0], p[1]))
    cur = best = 0
    for _, d in points:
        cur += d
        best = max(best, cur)
    return best


def test_demo_runs_to_complete_within_concurrency(state_dir: Path, tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0.1"}})
    r = run_cli("--preset", "demo", "--target-n", "2", "--concurrency", "3",
                "--config", str(over), "--state-dir", str(state_dir), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "AUTOPILOT_COMPLETE"
    status = json.loads((state_dir / "status.json").read_text())
    assert status["phase"] == "COMPLETE" and status["schema_version"] == 1
    assert status["totals"]["done"] == status["totals"]["total"] == 24
    assert 0 < status["totals"]["pass"] < 24  # the demo scorecard is not trivial
    assert status["trust"]["invalid_cells"] == 0
    evs = events(state_dir)
    assert_each_cell_once_and_never_rerun(evs, 24)
    spans = []
    for timing in state_dir.rglob("timing.json"):
        t = json.loads(timing.read_text())
        spans.append((t["start"], t["stop"]))
    assert len(spans) >= 24
    assert max_overlap(spans) <= 3
    assert max_overlap(spans) >= 2  # it did run cells concurrently
    for cell_dir in (state_dir / "cells").iterdir():
        rows = (cell_dir / "transcript.jsonl").read_text().splitlines()
        assert rows and all("completion_tokens" in json.loads(x) for x in rows)
        summary = json.loads((cell_dir / "summary.json").read_text())
        assert summary["total_completion_tokens"] > 0 and summary["finish_reason"] == "stop"
    assert alive_identities(evs) == []
    line = run_cli("--oneline", "--state-dir", str(state_dir), prog="dashboard")
    assert line.returncode == 0
    assert line.stdout.startswith("COMPLETE demo 24/24 done P")
    # Re-running a complete run does nothing but confirm it.
    again = run_cli("--preset", "demo", "--target-n", "2", "--config", str(over),
                    "--state-dir", str(state_dir), "--quiet")
    assert again.returncode == 0
    assert [e for e in events(state_dir)[len(evs):] if e["event"] == "cell_started"] == []
    # Raising N is a normal resume that adds replicates.
    more = run_cli("--preset", "demo", "--target-n", "3", "--config", str(over),
                   "--state-dir", str(state_dir), "--quiet")
    assert more.returncode == 0
    started = {e["cell"] for e in events(state_dir)[len(evs):] if e["event"] == "cell_started"}
    assert started and all(c.endswith("_v3") for c in started)


def test_kill9_resume_counts_every_cell_once(state_dir: Path, tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0.25"}})
    args = ["--preset", "demo", "--target-n", "2", "--concurrency", "3", "--config", str(over),
            "--state-dir", str(state_dir), "--quiet"]
    proc = spawn_cli(*args, log=tmp_path / "first.log")

    def mid_run():
        evs = events(state_dir)
        verdicts = sum(e["event"] == "cell_verdict" for e in evs)
        running = {e["cell"] for e in evs if e["event"] == "cell_started"} - {
            e["cell"] for e in evs if e["event"] == "cell_verdict"}
        return verdicts >= 4 and running

    wait_for(mid_run, 90, "cells running mid-run")
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    before = events(state_dir)
    orphans = alive_identities(before)
    assert orphans, "the killed supervisor should have left its cells and endpoint behind"
    ended = {e["cell"] for e in before if e["event"] == "cell_verdict"}
    harness = {e["cell"]: e["pid"] for e in before
               if e["event"] == "cell_started" and e["cell"] not in ended and e.get("pid")}
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    evs = events(state_dir)
    assert_each_cell_once_and_never_rerun(evs, 24)
    after = evs[len(before):]
    abandoned = {e["cell"] for e in after if e["event"] == "cell_abandoned"}
    went_on = {e["cell"] for e in after if e["event"] in ("cell_reattached", "cell_adopted")}
    # Live restore: every attempt running at the kill went on under its data path (re-
    # attached, or adopted if it ended before the resume), none was abandoned, and the
    # endpoint the killed supervisor started served the rest of the run.
    assert harness and set(harness) <= went_on and not set(harness) & abandoned
    assert sum(e["event"] == "endpoint_spawned" for e in evs) == 1
    for pid in orphans:  # at the run's end, nothing of either supervisor is left
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    status = json.loads((state_dir / "status.json").read_text())
    assert status["phase"] == "COMPLETE"


PLANTED = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen(['sleep', '600'])  # a grandchild, same environment\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def plant(token: str, cell: str | None) -> tuple[subprocess.Popen[str], psutil.Process]:
    """A process (and grandchild) carrying a run's marker, as a harness (``cell``) or an
    endpoint (None) spawned by a supervisor that died before journaling it."""
    env = {**os.environ, RUN_TOKEN_ENV: token}
    if cell:
        env.update({TOKEN_ENV: "t-" + token[:8], "AUTOPILOT_CELL_ID": cell})
    p = subprocess.Popen([sys.executable, "-c", PLANTED], env=env, text=True,
                         stdout=subprocess.PIPE, start_new_session=True)
    assert p.stdout is not None
    return p, psutil.Process(int(p.stdout.readline()))  # handshake: the grandchild is up


def gone(p: subprocess.Popen[str], child: psutil.Process) -> bool:
    try:
        p.wait(10)  # we are its parent: reap it
    except subprocess.TimeoutExpired:
        return False
    return not child.is_running() or child.status() == "zombie"


def unplant(*planted: tuple[subprocess.Popen[str], psutil.Process]) -> None:
    for p, child in planted:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()  # psutil re-checks the identity: never a recycled pid
        p.kill()
        p.wait(10)


def test_unjournaled_harness_of_a_killed_supervisor_is_swept(state_dir: Path,
                                                             tmp_path: Path) -> None:
    # The window between spawn and journaling cell_started: a supervisor SIGKILLed there
    # leaves a harness nothing records. It still carries the run's marker, so the next
    # supervisor finds and kills it (and its tree) before running that cell again; a
    # process of another run (another state dir) is left alone.
    ours = plant(run_token(state_dir), "p1_bugfix_demo-nothink_v1")
    theirs = plant(run_token(tmp_path / "another-run"), "p1_bugfix_demo-nothink_v1")
    try:
        r = run_cli("--preset", "demo", "--target-n", "1", "--state-dir", str(state_dir),
                    "--quiet")
        assert r.returncode == 0, r.stderr[-2000:]
        assert gone(*ours)
        assert theirs[0].poll() is None and theirs[1].is_running()
        killed = [e for e in events(state_dir) if e["event"] == "orphan_killed"]
        assert len(killed) == 1 and killed[0]["cell"] == "p1_bugfix_demo-nothink_v1"
        assert {ours[0].pid, ours[1].pid} <= set(killed[0]["pids"])
        status = json.loads((state_dir / "status.json").read_text())
        assert any(o.get("unjournaled") for o in status["orphans_cleaned"])
    finally:
        unplant(ours, theirs)


def test_cleanup_kills_the_runs_leftover_processes(state_dir: Path, tmp_path: Path) -> None:
    assert run_cli("--preset", "demo", "--target-n", "1", "--state-dir", str(state_dir),
                   "--quiet").returncode == 0
    cell = plant(run_token(state_dir), "p2_extract_demo-think_v1")
    endpoint = plant(run_token(state_dir), None)
    theirs = plant(run_token(tmp_path / "another-run"), "p2_extract_demo-think_v1")
    try:
        r = run_cli("cleanup", "--state-dir", str(state_dir))
        assert r.returncode == 0, r.stderr
        assert gone(*cell) and "(cell p2_extract_demo-think_v1)" in r.stdout
        assert endpoint[0].poll() is None  # the endpoint only with --endpoint
        r = run_cli("cleanup", "--endpoint", "--state-dir", str(state_dir))
        assert r.returncode == 0, r.stderr
        assert gone(*endpoint) and "(endpoint)" in r.stdout
        assert theirs[0].poll() is None and theirs[1].is_running()
        from autopilot.cell.cgroups import where

        parent = where()[0]
        if parent is not None:  # and no empty group of the run made or left behind
            assert not (parent / f"autopilot-{run_token(state_dir)[:16]}").exists()
    finally:
        unplant(cell, endpoint, theirs)


def test_sigterm_stops_gracefully_and_leaves_no_child(state_dir: Path, tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0.5"}})
    args = ["--preset", "demo", "--target-n", "2", "--concurrency", "3", "--config", str(over),
            "--state-dir", str(state_dir), "--quiet"]
    proc = spawn_cli(*args, log=tmp_path / "run.log")

    def running():
        evs = events(state_dir)
        started = [e for e in evs if e["event"] == "cell_started"]
        return len(started) >= 3

    wait_for(running, 60, "three cells started")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 143
    evs = events(state_dir)
    assert alive_identities(evs) == []
    tokens = {e["token"] for e in evs if e["event"] == "cell_started"}
    assert token_holders(tokens) == []
    status = json.loads((state_dir / "status.json").read_text())
    assert status["phase"] == "stopped"
    assert any(e["event"] == "cell_abandoned" for e in evs)
    assert [e for e in evs if e["event"] == "run_finished"][-1]["outcome"] == "stopped"
    # and the run resumes to completion
    r = run_cli(*args)
    assert r.returncode == 0
    assert_each_cell_once_and_never_rerun(events(state_dir), 24)


def test_once_rebuilds_status_from_journal(state_dir: Path, tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0"}})
    args = ["--preset", "demo", "--target-n", "1", "--config", str(over),
            "--state-dir", str(state_dir), "--quiet"]
    assert run_cli(*args).returncode == 0
    (state_dir / "status.json").unlink()
    n_events = len(events(state_dir))
    r = run_cli(*args, "--once")
    assert r.returncode == 0 and r.stdout.startswith("COMPLETE demo 12/12 done")
    status = json.loads((state_dir / "status.json").read_text())
    assert status["totals"]["done"] == 12
    assert len(events(state_dir)) == n_events  # --once drives nothing


def test_plan_change_refused_then_allowed(state_dir: Path, tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {"vars": {"think_secs": "0"}})
    base = ["--preset", "demo", "--target-n", "1", "--state-dir", str(state_dir), "--quiet"]
    assert run_cli(*base, "--config", str(over)).returncode == 0
    changed = write_overlay(tmp_path / "c.json", {"vars": {"think_secs": "0", "seed": "99"}})
    r = run_cli(*base, "--config", str(changed))
    assert r.returncode == 2 and "--allow-plan-change" in r.stderr
    r = run_cli(*base, "--config", str(changed), "--allow-plan-change")
    assert r.returncode == 0
    assert any(e["event"] == "plan_changed" for e in events(state_dir))


def test_demo_chaos_heals_itself(state_dir: Path) -> None:
    r = run_cli("--preset", "demo-chaos", "--target-n", "2", "--state-dir", str(state_dir),
                "--quiet", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    evs = events(state_dir)
    kinds = [e["kind"] for e in evs if e["event"] == "milestone"]
    assert "endpoint_restart" in kinds and "harness_anomaly" in kinds
    assert kinds.count("harness_anomaly") == 1
    reasons = Counter(e["reason"] for e in evs
                      if e["event"] == "cell_verdict" and e["verdict"] == "INVALID")
    # the four injected grader crashes re-ran the grader on the same outputs, never a harness
    assert reasons["grader_failed"] == 0
    retries = [e for e in evs if e["event"] == "grade_retry"]
    assert len(retries) == 4 and {e["reason"] for e in retries} == {"grader_failed"}
    started = Counter((e["cell"], e["attempt"]) for e in evs if e["event"] == "cell_started")
    for e in retries:  # the re-graded attempt's harness ran once
        assert started[(e["cell"], e["attempt"])] == 1
    assert reasons["stall"] >= 1
    assert "FAIL" not in {e["verdict"] for e in evs if e["event"] == "cell_verdict"
                          and e.get("reason") in ("endpoint_down",)}
    assert_each_cell_once_and_never_rerun(evs, 24)
    status = json.loads((state_dir / "status.json").read_text())
    assert status["trust"]["retried_cells"] >= 4
    # evidence of the INVALID attempts survives under attempts/
    moved = defaultdict(list)
    for p in (state_dir / "attempts").glob("*/attempt-*"):
        moved[p.parent.name].append(p.name)
    assert len(moved) >= 4
