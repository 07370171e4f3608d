"""The run's clock: monotonic time minus the time the supervisor itself was not running.

A supervisor frozen by SIGSTOP (a debugger, a laptop lid, a VM paused by its host) for
139 s came back and charged its own absence to the cells: a harness that had exited 0
was a "hung teardown", a stalled transcript was "frozen" for minutes it never watched.
Every watchdog, deadline and backoff decision therefore reads this clock. A ticker
calls it every ``TICK`` seconds, so two readings more than ``GAP`` apart mean the whole
process (or its event loop) stood still; the excess is booked as absence.
"""

from __future__ import annotations

import time
from collections.abc import Callable

TICK = 1.0  # the ticker's interval (supervisor._clock_ticker)
GAP = 5.0  # a longer silence between readings is the supervisor's own absence


class RunClock:
    def __init__(self, base: Callable[[], float] = time.monotonic) -> None:
        self._base = base
        self._last = base()
        self.absent = 0.0  # seconds excluded so far

    def __call__(self) -> float:
        now = self._base()
        silence = now - self._last
        if silence > GAP:
            self.absent += silence - TICK
        self._last = now
        return now - self.absent
