"""Free space under the run's roots: a floor that turns a filling disk into infrastructure.

A harness that hits ENOSPC crashes, and its cell would be charged ``harness_crash`` and
counted towards quarantine, although the model and the harness did nothing wrong. So
the loop watches the filesystems the run writes to (the state dir and every output
root, ``fsguard.run_roots``): below the floor, launching pauses (with a milestone), an
INVALID attempt that overlapped the low period is ``INVALID(disk_full)`` and is not
counted towards quarantine, and launching resumes once space is back above the floor
with some headroom (``RESUME_FACTOR``: a disk hovering at the floor must not flap).

``decide`` is the rule, a function of the measured free bytes; ``DiskWatch`` holds the
low periods (on the monotonic clock, as the endpoint keeper holds its outages) and does
the one system call, ``os.statvfs``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio

RESUME_FACTOR = 1.5  # resume launching at 1.5x the floor
CHECK_TIMEOUT = 5.0  # seconds a statvfs may take before it counts as no answer
MAX_PERIODS = 64  # low periods remembered; older ones no attempt still overlaps

Change = Literal["low", "ok"] | None


@dataclass(frozen=True)
class Reading:
    """The tightest filesystem among the run's roots."""
    free: int  # bytes available to an unprivileged writer (statvfs f_bavail)
    where: str  # a root on that filesystem


def decide(reading: Reading | None, floor: int, low: bool) -> Change:
    """``low``: the disk is below the floor now; ``ok``: it came back; None: no change.
    An unreadable filesystem (``reading`` None) changes nothing: a failed statvfs is not
    evidence of a full disk."""
    if floor <= 0 or reading is None:
        return None
    if not low and reading.free < floor:
        return "low"
    if low and reading.free >= floor * RESUME_FACTOR:
        return "ok"
    return None


def measure(roots: Iterable[Path]) -> Reading | None:
    """The least free space over the roots' filesystems (each filesystem once). A root
    not made yet is measured at its nearest existing parent."""
    seen: set[int] = set()
    best: Reading | None = None
    for root in roots:
        path = root
        while not path.exists() and path != path.parent:
            path = path.parent
        try:
            dev = path.stat().st_dev
            if dev in seen:
                continue
            seen.add(dev)
            info = os.statvfs(path)
        except OSError:
            continue
        free = info.f_bavail * info.f_frsize
        if best is None or free < best.free:
            best = Reading(free, str(root))
    return best


def floor_bytes(disk_floor_mb: float, min_free_gb: float) -> int:
    """The run's floor: never above what preflight accepted at the start (a preset that
    allows a small disk at the start must not be paused the moment it begins)."""
    return int(min(disk_floor_mb * 1e6, min_free_gb * 1e9))


class DiskWatch:
    """Low periods of the run's disk. ``check`` measures now and reports a change to
    ``on_change`` (the loop journals it and pauses or resumes launching)."""

    def __init__(self, roots: Iterable[Path], floor: int,
                 clock: Callable[[], float],
                 on_change: Callable[[Change, Reading], None] | None = None) -> None:
        self.roots = tuple(roots)
        self.floor = floor
        self.clock = clock
        self.on_change = on_change
        self.low_since: float | None = None
        self.periods: list[tuple[float, float]] = []  # ended low periods (start, end)
        self.last: Reading | None = None
        self._back: anyio.Event | None = None  # made by a waiter (inside the loop)

    @property
    def low(self) -> bool:
        return self.low_since is not None

    def apply(self, reading: Reading | None) -> bool:
        """Apply the rule to a measurement, report a change; True while below the floor."""
        self.last = reading or self.last
        change = decide(reading, self.floor, self.low)
        if change is not None and reading is not None:
            now = self.clock()
            if change == "low":
                self.low_since = now
            else:
                assert self.low_since is not None
                self.periods = [*self.periods[-MAX_PERIODS + 1:], (self.low_since, now)]
                self.low_since = None
                if self._back is not None:
                    self._back.set()
                    self._back = None
            if self.on_change is not None:
                self.on_change(change, reading)
        return self.low

    async def wait_ok(self) -> None:
        """Until free space is back above the floor (at once when it is): the next
        ``apply`` that says so wakes every waiter."""
        while self.low:
            if self._back is None:
                self._back = anyio.Event()
            await self._back.wait()

    async def check(self) -> bool:
        """Measure in a worker thread, bounded (a hung network mount must not freeze the
        loop: no answer in CHECK_TIMEOUT is no evidence), then ``apply``."""
        if self.floor <= 0:
            return False
        reading = None
        with anyio.move_on_after(CHECK_TIMEOUT):
            reading = await anyio.to_thread.run_sync(measure, self.roots,
                                                     abandon_on_cancel=True)
        return self.apply(reading)

    def describe(self) -> dict[str, object] | None:
        """For status.json: below the floor or not, and the last measurement."""
        if self.floor <= 0:
            return None
        last = self.last
        return {"low": self.low, "floor_mb": round(self.floor / 1e6, 1),
                "free_mb": round(last.free / 1e6, 1) if last else None,
                "where": last.where if last else None}

    def overlaps(self, start: float, end: float) -> bool:
        """Was the disk below the floor at any time in [start, end]? (``check`` first: a
        harness that just hit ENOSPC ends before the next periodic check.)"""
        if self.low_since is not None and self.low_since <= end:
            return True
        return any(began <= end and e >= start for began, e in self.periods)


__all__ = ["RESUME_FACTOR", "DiskWatch", "Reading", "decide", "floor_bytes", "measure"]
