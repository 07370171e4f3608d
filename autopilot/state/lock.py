"""Double-drive guard: an exclusive flock plus a fresh-heartbeat check.

Two supervisors on one state dir fight over the endpoint and the sandboxes (origin doc
004), so the second must refuse to start, touching nothing. The kernel releases a flock
when its holder dies, even by SIGKILL, so a crashed run can be taken over at once; the
lock fd is close-on-exec so no cell inherits it. ``heartbeat.json`` (pid + process start
time, host, phase) is a second, human-readable signal: a heartbeat younger than
``FRESH_SECS`` that names a live process on this host (same pid *and* start time, so a
recycled pid does not count) also blocks.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from autopilot.errors import LockHeld
from autopilot.escape import clean
from autopilot.state.fsutil import atomic_write_json, iso, read_json
from autopilot.state.liveness import HEARTBEAT_SECS, holder_alive
from autopilot.state.statedir import ensure_private_dir, open_private

FRESH_SECS = 120.0


def beat_interval() -> float:
    """Seconds between heartbeats: HEARTBEAT_SECS, or $AUTOPILOT_HEARTBEAT_SECS (faster
    staleness detection for tests and demos; at least 0.2), capped by systemd's
    watchdog interval when one is set."""
    from autopilot import sdnotify

    try:
        every = max(0.2, float(os.environ.get("AUTOPILOT_HEARTBEAT_SECS") or HEARTBEAT_SECS))
    except ValueError:
        every = HEARTBEAT_SECS
    return min(every, sdnotify.watchdog_interval() or every)


LOCK_NAME = "autopilot.lock"
HEARTBEAT_NAME = "heartbeat.json"


def _me() -> tuple[int, float]:
    return os.getpid(), psutil.Process().create_time()


@dataclass(frozen=True)
class Holder:
    """Who holds a run, as its lock record or heartbeat says. Read from the state dir,
    so shape-checked: a field of the wrong shape is missing, text has no control
    characters. ``starting``: the flock is held by a supervisor that has not recorded
    itself yet."""

    pid: int | None = None
    host: str | None = None
    started_at: str | None = None
    phase: str | None = None
    starting: bool = False

    @classmethod
    def of(cls, doc: Any) -> Holder:
        if not isinstance(doc, dict):
            return cls()

        def text(key: str) -> str | None:
            value = doc.get(key)
            return clean(value, 200) if isinstance(value, str) else None

        pid = doc.get("pid")
        return cls(pid if type(pid) is int else None, text("host"), text("started_at"),
                   text("phase"), doc.get("starting") is True)


def heartbeat_holder(state_dir: Path, now: float | None = None) -> Holder | None:
    """Who the heartbeat names, if it is fresh and names a live process on this host."""
    beat = read_json(state_dir / HEARTBEAT_NAME)
    if not isinstance(beat, dict):
        return None
    if beat.get("released"):  # the holder let the run go (it may still be exiting)
        return None
    now = time.time() if now is None else now
    epoch = beat.get("epoch")
    if not isinstance(epoch, int | float) or isinstance(epoch, bool) or now - epoch > FRESH_SECS:
        return None
    # Another host's process cannot be checked (flock covers local runs); a zombie is
    # dead, only not yet reaped; the start time is compared exactly (no decoy window).
    if holder_alive(beat) is not True:
        return None
    if int(beat["pid"]) == os.getpid():
        return None
    return Holder.of(beat)


def _live(rec: Any) -> bool:
    """``rec`` names a live process on this host with exactly that start time."""
    return holder_alive(rec) is True


def describe_holder(holder: Holder | None) -> str:
    if holder is not None and holder.starting:
        return "a supervisor that is starting holds the lock (it has not recorded itself yet)"
    if holder is None or holder.pid is None:
        return "holder unknown (lock held)"
    return f"pid {holder.pid} on host {holder.host} since {holder.started_at}"


def flock_held(path: Path) -> bool | None:
    """Whether someone holds an exclusive flock on ``path``, read from ``/proc/locks``
    without taking any lock (None where that cannot be read). A probe that took a shared
    lock itself, even for an instant, made a supervisor starting at that instant lose
    its ``LOCK_EX | LOCK_NB`` and exit 3 with no other driver anywhere."""
    try:
        info = os.stat(path, follow_symlinks=False)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            table = f.read()
    except OSError:
        return None
    want = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in table.splitlines():
        cols = line.split()
        # "1: FLOCK  ADVISORY  WRITE 5643 fd:00:1234567 0 EOF" (a "->" marks a waiter)
        if "->" in cols or len(cols) < 6:
            continue
        if cols[1] == "FLOCK" and cols[3] == "WRITE" and cols[5] == want:
            return True
    return False


def lock_held(state_dir: Path) -> Holder | None:
    """Read-only probe for readers (dashboard, --once, cleanup): who holds the run, if
    anyone. It never takes the lock, so it can never make a starter lose."""
    path = state_dir / LOCK_NAME
    if path.exists():
        held = flock_held(path)
        if held:
            return Holder.of(read_json(state_dir / HEARTBEAT_NAME))
        if held is None:  # no /proc/locks: a shared lock, for an instant
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                return heartbeat_holder(state_dir)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return Holder.of(read_json(state_dir / HEARTBEAT_NAME))
            finally:
                os.close(fd)
    return heartbeat_holder(state_dir)


@dataclass
class RunLock:
    state_dir: Path
    fd: int = -1
    started_at: str = ""
    phase: str = "starting"
    beaten: bool = False

    def acquire(self) -> None:
        """Take the run or raise LockHeld. Creates nothing when the run is held."""
        beat = heartbeat_holder(self.state_dir)
        if beat is not None:
            raise LockHeld(describe_holder(beat))
        ensure_private_dir(self.state_dir)
        fd = open_private(self.state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockHeld(describe_holder(self._holder_record())) from None
        # Re-check under the lock: a holder may have written its heartbeat and exited
        # between our first look and the flock.
        beat = heartbeat_holder(self.state_dir)
        if beat is not None:
            os.close(fd)
            raise LockHeld(describe_holder(beat))
        self.fd = fd
        self.started_at = iso()
        # The holder's identity goes into the lock file itself at once, so a loser of a
        # simultaneous start can name it before the first heartbeat is written.
        pid, create_time = _me()
        record = {"pid": pid, "create_time": create_time, "host": socket.gethostname(),
                  "started_at": self.started_at}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)

    def _holder_record(self) -> Holder:
        """Who holds the flock. The holder writes its record right after taking it, so
        wait briefly for one; a record naming a dead process (a SIGKILLed predecessor's,
        not yet overwritten by the new winner) is never the answer."""
        for _ in range(40):
            for name in (LOCK_NAME, HEARTBEAT_NAME):
                rec = read_json(self.state_dir / name)
                if _live(rec):
                    return Holder.of(rec)
            time.sleep(0.025)
        return Holder(starting=True)

    def beat(self, phase: str, released: bool = False) -> None:
        pid, create_time = _me()
        self.phase, self.beaten = phase, True
        atomic_write_json(self.state_dir / HEARTBEAT_NAME, {
            "pid": pid, "create_time": create_time, "host": socket.gethostname(),
            "started_at": self.started_at, "ts": iso(), "epoch": time.time(), "phase": phase,
            "interval_secs": beat_interval(), **({"released": True} if released else {}),
        })

    def release(self) -> None:
        """Let the run go: the heartbeat says so first, so a successor started while this
        process is still exiting (a notification thread, a slow teardown) is not refused
        as a double drive."""
        if self.fd >= 0:
            if self.beaten:  # a run that never beat leaves nothing to release
                with contextlib.suppress(OSError):  # a full disk: the flock goes anyway
                    self.beat(self.phase, released=True)
            os.close(self.fd)
            self.fd = -1
