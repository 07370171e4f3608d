"""Double-drive guard: flock + fresh-heartbeat, exit 3, takeover after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, cli_env, events, write_overlay

from autopilot.errors import LockHeld
from autopilot.state.lock import RunLock

HOLD = (
    "import sys, time; from pathlib import Path; from autopilot.state.lock import RunLock\n"
    "lk = RunLock(Path(sys.argv[1])); lk.acquire(); lk.beat('run:pass1')\n"
    "print('HELD', flush=True); time.sleep(600)\n"
)


def test_lock_taken_over_at_once_after_sigkill(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert holder.stdout.readline().strip() == "HELD"
    with pytest.raises(LockHeld, match=f"pid {holder.pid} on host {socket.gethostname()}"):
        RunLock(tmp_path).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lk = RunLock(tmp_path)
    lk.acquire()  # fresh heartbeat, but its pid is dead: no block
    lk.release()


def test_stale_heartbeat_of_dead_pid_does_not_block(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    (tmp_path / "heartbeat.json").write_text(json.dumps({
        "pid": p.pid, "create_time": time.time() - 5, "host": socket.gethostname(),
        "epoch": time.time(), "started_at": "x"}))
    lk = RunLock(tmp_path)
    lk.acquire()
    lk.release()


def test_fresh_heartbeat_of_live_process_blocks_even_without_flock(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ct = psutil.Process(sleeper.pid).create_time()
        hb = {"pid": sleeper.pid, "create_time": ct, "host": socket.gethostname(),
              "epoch": time.time(), "started_at": "t0"}
        (tmp_path / "heartbeat.json").write_text(json.dumps(hb))
        with pytest.raises(LockHeld):
            RunLock(tmp_path).acquire()
        hb["create_time"] = ct - 100  # same pid, another process: a recycled pid
        (tmp_path / "heartbeat.json").write_text(json.dumps(hb))
        lk = RunLock(tmp_path)
        lk.acquire()
        lk.release()
        hb["create_time"], hb["epoch"] = ct, time.time() - 500  # too old to count
        (tmp_path / "heartbeat.json").write_text(json.dumps(hb))
        lk = RunLock(tmp_path)
        lk.acquire()
        lk.release()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_pairs_started_together_exactly_one_drives(tmp_path: Path) -> None:
    over = write_overlay(tmp_path / "o.json", {
        "vars": {"think_secs": "0"}, "tasks": [{"id": "p1_bugfix"}]})
    pairs = int(os.environ.get("AUTOPILOT_TEST_PAIRS", "8"))
    for i in range(pairs):
        state = tmp_path / f"s{i}"
        args = [sys.executable, "-m", "autopilot.cli", "--preset", "demo", "--target-n", "1",
                "--config", str(over), "--state-dir", str(state), "--quiet"]
        a, b = (subprocess.Popen(args, cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2))
        outs = [p.communicate(timeout=120) for p in (a, b)]
        codes = sorted([a.returncode, b.returncode])
        assert codes == [0, 3], (codes, outs)
        loser = outs[[a.returncode, b.returncode].index(3)]
        assert loser[1].startswith("AUTOPILOT_ABORTED_DOUBLE_DRIVE")
        assert "pid" in loser[1]
        started = [e for e in events(state) if e["event"] == "run_started"]
        assert len(started) == 1


def test_double_drive_touches_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(state)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "HELD"
        before = {p.name: p.stat().st_mtime_ns for p in state.iterdir()}
        r = subprocess.run([sys.executable, "-m", "autopilot.cli", "--preset", "demo",
                            "--target-n", "1", "--state-dir", str(state)],
                           cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=60)
        assert r.returncode == 3
        assert f"pid {holder.pid}" in r.stderr
        assert {p.name: p.stat().st_mtime_ns for p in state.iterdir()} == before
    finally:
        holder.kill()
        holder.wait()


def test_cleanup_refuses_while_a_supervisor_holds_the_run(tmp_path: Path) -> None:
    state = tmp_path / "state"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(state)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "HELD"
        r = subprocess.run([sys.executable, "-m", "autopilot.cli", "cleanup", "--state-dir",
                            str(state)], cwd=ROOT, env=cli_env(), capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 3 and "refusing to clean up a run in progress" in r.stderr
        assert f"pid {holder.pid}" in r.stderr
    finally:
        holder.kill()
        holder.wait()


RAW_FLOCK = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('LOCKED', flush=True); time.sleep(600)\n"
)


def test_a_loser_never_names_the_dead_predecessor(tmp_path: Path) -> None:
    # A SIGKILLed predecessor's record is still in the lock file while a new winner holds
    # the flock but has not written its own yet: the loser says the holder is starting.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = tmp_path / "autopilot.lock"
    lock.write_text(json.dumps({"pid": dead.pid, "create_time": time.time() - 9,
                                "host": socket.gethostname(), "started_at": "old"}))
    os.chmod(tmp_path, 0o700)
    winner = subprocess.Popen([sys.executable, "-c", RAW_FLOCK, str(lock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert winner.stdout.readline().strip() == "LOCKED"
        with pytest.raises(LockHeld) as e:
            RunLock(tmp_path).acquire()
        assert f"pid {dead.pid}" not in str(e.value)
        assert "starting" in str(e.value)
        # Once the winner records itself, the loser names it.
        ct = psutil.Process(winner.pid).create_time()
        lock.write_text(json.dumps({"pid": winner.pid, "create_time": ct,
                                    "host": socket.gethostname(), "started_at": "now"}))
        with pytest.raises(LockHeld, match=f"pid {winner.pid} on host"):
            RunLock(tmp_path).acquire()
    finally:
        winner.kill()
        winner.wait()


def test_a_holder_record_from_the_state_dir_is_shape_checked_before_it_is_said() -> None:
    # What a refused start prints comes from a file anyone of the run's user could write.
    from autopilot.state.lock import Holder, describe_holder

    said = describe_holder(Holder.of({"pid": 12, "host": "x\x1b]0;pwned\x07\x1b[2J",
                                      "started_at": "2026-12-05T00:00:00Z"}))
    assert "\x1b" not in said and "\x07" not in said and said.startswith("pid 12 on host x")
    odd = Holder.of({"pid": "12", "host": ["h"], "started_at": 5, "starting": "yes"})
    assert odd == Holder() and describe_holder(odd) == "holder unknown (lock held)"
    assert Holder.of(None) == Holder() and Holder.of([1]) == Holder()
