"""The loop's background beats: the heartbeat (lock, systemd watchdog and STATUS=, the
subreaper's zombies) and the run clock's reader."""

from __future__ import annotations

from collections.abc import Callable

import anyio

from autopilot import sdnotify
from autopilot.cell.procs import reap_adopted
from autopilot.logsetup import get_logger
from autopilot.run.clock import TICK, RunClock
from autopilot.state.diskspace import DiskWatch
from autopilot.state.lock import RunLock, beat_interval

log = get_logger(__name__)


async def heartbeat(lock: RunLock, phase: Callable[[], str],
                    progress: Callable[[], str]) -> None:
    interval = beat_interval()
    last = ""
    while True:
        await anyio.to_thread.run_sync(lock.beat, phase())
        reap_adopted()  # zombies of orphans re-parented to us (we are the subreaper)
        sdnotify.notify("WATCHDOG=1")
        line = progress()
        if line != last:
            last = line
            sdnotify.notify(f"STATUS={line}")
        await anyio.sleep(interval)


async def clock_ticker(clock: RunClock) -> None:
    """Read the run clock every TICK seconds: a longer silence is then the
    supervisor's own absence (SIGSTOP), never the cells' (see autopilot.run.clock)."""
    seen = clock.absent
    while True:
        clock()
        if clock.absent > seen:  # whichever reading noticed it first
            log.warning("supervisor_was_frozen", secs=round(clock.absent - seen, 1),
                        note="excluded from every watchdog and deadline")
            seen = clock.absent
        await anyio.sleep(TICK)


async def disk_watch(watch: DiskWatch, every: float) -> None:
    """Measure free space under the run's roots every ``every`` seconds; the watch
    reports a fall below the floor, and the return, to the loop (Recorder)."""
    if watch.floor <= 0:
        return
    while True:
        await watch.check()
        await anyio.sleep(every)
