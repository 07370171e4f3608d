"""Stop signals recorded from the process's first instruction to its last.

A Python process ends by the default action of SIGTERM or SIGUSR2 until something
installs a handler, and the supervisor's own (autopilot.run.stopping) is in place only
once its event loop runs. ``systemctl stop`` or ``restart`` in the seconds of a start-up
(imports, preflight, lock, replay, sweep) would then kill it with no line said, and a
stop would leave the predecessor's attempts and endpoint running with no supervisor
(``KillMode=process``). So the entry point installs this recorder before it imports
anything else: a signal is only recorded (nothing in a handler can run at an arbitrary
bytecode safely), and whoever owns the run acts on it at its next step, or receives it
at once once it ``attach``es a sink (the event loop's thread-safe callback).

Stdlib only, and nothing but recording in the handler: it runs between any two bytecodes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)

_pending: list[int] = []
_sink: Callable[[int], None] | None = None
_before: dict[int, object] = {}


def _record(sig: int, _frame: object) -> None:
    if _sink is not None:
        _sink(sig)
    else:
        _pending.append(sig)


def install() -> None:
    """Record the stop signals from now on (idempotent). A SIGINT that was ignored when
    we started (``nohup``, a background job) stays ignored, as the shell meant."""
    for sig in STOP_SIGNALS:
        if sig in _before:
            continue
        now = signal.getsignal(sig)
        if sig == signal.SIGINT and now == signal.SIG_IGN:
            continue
        _before[sig] = now
        signal.signal(sig, _record)


def installed() -> bool:
    return bool(_before)


def pending() -> tuple[int, ...]:
    return tuple(_pending)


def attach(sink: Callable[[int], None]) -> list[int]:
    """Hand every signal to ``sink`` from now on; the ones recorded until now are
    returned, in order, for the caller to apply at once."""
    global _sink
    before = list(_pending)
    _pending.clear()
    _sink = sink
    return before


def asked() -> str | None:
    """What the recorded signals ask for, as autopilot.run.stopping reads them: a
    hand-over while only SIGUSR2 came, a stop once any other did, or nothing."""
    if not _pending:
        return None
    return "handover" if all(sig == signal.SIGUSR2 for sig in _pending) else "stop"


def detach() -> None:
    """Back to recording (the loop that acted on signals is gone)."""
    global _sink
    _sink = None


def release() -> None:
    """Give the signals back their earlier dispositions (a command that is not a run: a
    SIGTERM ends ``autopilot report`` as it would any reader), and deliver one that came
    meanwhile so it has its usual effect now."""
    global _sink
    _sink = None
    for sig, before in _before.items():
        signal.signal(sig, before)  # type: ignore[arg-type]
    _before.clear()
    if _pending:
        sig = _pending[0]
        _pending.clear()
        os.kill(os.getpid(), sig)
