"""Stop signals as events (uvicorn's supervisors): the handler only records, the loop acts.

The recording starts at the process's first instruction (autopilot.sigrecord); the run
``listen``s from the start of ``Supervisor.run``, before the lock, so each step of a
start-up (lock, replay, sweep, endpoint) sees a signal that came before it.

The first SIGINT or SIGTERM asks for a graceful stop: every wait that is not cell work
(an endpoint start, a replica to come back) is cancelled at once through the scopes made
by ``interruptible``, and running cells are terminated and abandoned, never judged. A
second signal forces: cells are killed without their grace.

SIGUSR2 asks for a hand-over (systemd's ``RestartKillSignal=``, so ``systemctl
restart`` sends it): launching stops as for a stop, but every running attempt is left to
its data path and the endpoint is left serving; the successor re-attaches to both
(autopilot.run.recovery). A SIGINT or SIGTERM after it still stops everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

import anyio

from autopilot import sigrecord
from autopilot.logsetup import get_logger

log = get_logger(__name__)


class Stop:
    def __init__(self) -> None:
        self.signal: int | None = None
        self.forced = False
        self.handover = False  # SIGUSR2: leave running attempts to their data paths
        self.by: str | None = None  # who asked, when not a signal (`autopilot stop`)
        self._scopes: set[anyio.CancelScope] = set()

    @property
    def name(self) -> str | None:
        return self.by or (signal.Signals(self.signal).name if self.signal else None)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[anyio.CancelScope]:
        """A scope the first stop signal cancels (waits that are not cell work)."""
        scope = anyio.CancelScope()
        if self.signal is not None:
            scope.cancel()
        self._scopes.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._scopes.discard(scope)

    def request(self, sig: int, by: str | None = None) -> bool:
        """Record a signal; True for the first (a graceful stop), False once forced.
        ``by``: who asked, when it was no signal."""
        self.by = self.by or by
        if sig == signal.SIGUSR2:
            if self.signal is not None:
                return False  # already stopping: a hand-over cannot undo the kills
            self.handover = True
        elif self.handover:
            self.handover = False  # a real stop after a hand-over began: end everything
            log.warning("stop_requested", signal=signal.Signals(sig).name,
                        note="the hand-over becomes a stop: running cells are terminated")
            self.signal = sig
            return False
        if self.signal is None:
            self.signal = sig
            for scope in list(self._scopes):
                scope.cancel()
            log.warning("stop_requested", signal=signal.Signals(sig).name,
                        note="handing over: running attempts go on under their data paths"
                        if self.handover else
                        "terminating running cells; a second signal forces")
            return True
        self.forced = True
        log.warning("stop_forced", signal=signal.Signals(sig).name)
        return False

    def listen(self, on_stop: Callable[[], None]) -> None:
        """From now until ``unlisten``: every stop signal becomes a ``request`` on the
        event loop (``on_stop`` after the first, e.g. to write status). Those that came
        before, since the process's first instruction (autopilot.sigrecord), are applied
        here at once, so the start-up's next step sees them."""
        loop = asyncio.get_running_loop()

        def on_signal(sig: int) -> None:
            if self.request(sig):
                on_stop()

        def from_handler(sig: int) -> None:  # between any two bytecodes: only schedule
            loop.call_soon_threadsafe(on_signal, sig)

        for sig in sigrecord.attach(from_handler):
            on_signal(sig)

    @staticmethod
    def unlisten() -> None:
        sigrecord.detach()  # recorded again until the process ends, never a default death
