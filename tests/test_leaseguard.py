"""The lease guard (autopilot.backends.ray.leaseguard), with real processes: once the process it
watches is gone, exactly the processes carrying the run's marker *and* the lease die."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
from conftest import ROOT, cli_env

from autopilot.cell.procs import start_ticks


def _sleeper(**env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "600"], env={**cli_env(), **env},
                            start_new_session=True)


def test_guard_kills_the_lease_once_its_actor_is_gone() -> None:
    actor = _sleeper()  # stands in for the Ray worker that hosts the actor
    ours = _sleeper(AUTOPILOT_RUN_TOKEN="t" * 32, AUTOPILOT_RAY_LEASE="s-1.1")
    other_lease = _sleeper(AUTOPILOT_RUN_TOKEN="t" * 32, AUTOPILOT_RAY_LEASE="s-2.1")
    other_run = _sleeper(AUTOPILOT_RUN_TOKEN="u" * 32, AUTOPILOT_RAY_LEASE="s-1.1")
    ticks = start_ticks(actor.pid)
    assert ticks is not None
    guard = subprocess.Popen(
        [sys.executable, "-m", "autopilot.backends.ray.leaseguard", "--pid", str(actor.pid),
         "--ticks", str(ticks), "--token", "t" * 32, "--lease", "s-1.1", "--poll", "0.1",
         "--grace", "0.5"], env=cli_env(), cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert psutil.pid_exists(ours.pid) and guard.poll() is None  # watching, not sweeping
        os.kill(actor.pid, signal.SIGKILL)
        actor.wait()
        out, _ = guard.communicate(timeout=60)
        assert guard.returncode == 0
        assert ours.wait(timeout=10) == -signal.SIGTERM  # reaped by us: it was killed
        assert str(ours.pid) in out
        assert other_lease.poll() is None and other_run.poll() is None  # not theirs
    finally:
        for p in (actor, ours, other_lease, other_run, guard):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_guard_leaves_a_recycled_pid_alone() -> None:
    """Given the start ticks of a process that is not the one at that pid (as after pid
    reuse), the guard takes the actor for gone at once, and kills only the lease."""
    stranger = _sleeper()
    ours = _sleeper(AUTOPILOT_RUN_TOKEN="t" * 32, AUTOPILOT_RAY_LEASE="s-9.1")
    ticks = start_ticks(stranger.pid)
    assert ticks is not None
    try:
        r = subprocess.run(
            [sys.executable, "-m", "autopilot.backends.ray.leaseguard", "--pid", str(stranger.pid),
             "--ticks", str(ticks - 1), "--token", "t" * 32, "--lease", "s-9.1",
             "--poll", "0.1", "--grace", "0.5"],
            env=cli_env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert ours.wait(timeout=10) == -signal.SIGTERM
        assert stranger.poll() is None  # the process at that pid was never signalled
    finally:
        for p in (stranger, ours):
            if p.poll() is None:
                p.kill()
                p.wait()
